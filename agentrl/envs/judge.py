"""LLM-as-judge rewards: a rubric prompt sent to an API model, its reply parsed into a score.

Owns: ``JudgeReward`` (``await judge(task, final_text, transcript) -> float`` in [0, 1]: the rubric
filled with the task, the reference answer, the final answer and the transcript, sent through
``agentrl.common.llm_api.ApiClient`` — timeout, retries with backoff, a process-wide concurrency limit, keys
only from the environment), ``parse_score`` (the reply -> a number, or a clear error) and
``DEFAULT_RUBRIC``.

A judge that cannot give a score — the API failed after its retries, or the reply holds no score
in range — raises ``RewardError``: the episode ends as ``reward_error`` and is excluded from
training. It is never scored 0.

Any env can use it: ``agentrl.envs.judged.JudgedEnv`` wraps an env so that its final turn is judged
(registered as the ``judged`` env id), or an env's own ``score`` can ``return await self.judge(...)``.

Does not: cache verdicts, ensemble judges, or defend against a policy that writes to the judge
(prompt injection in the final answer reaches the judge verbatim).
"""

from __future__ import annotations

import json
import math
import re
import string
from typing import Any

from agentrl.common.llm_api import ApiClient, redact
from agentrl.errors import ConfigError, EngineError, RewardError

DEFAULT_RUBRIC = """You are grading the final answer an AI assistant gave to a task.

# Task
{question}

# Reference answer (may be empty)
{reference}

# The assistant's work (tool calls and results)
{transcript}

# The assistant's final answer
{answer}

Give {max_score} if the final answer fully and correctly solves the task (matching the reference when \
there is one), {min_score} if it is wrong or missing, and a value in between for partial credit. \
Explain briefly, then end with a line of the form
SCORE: <number from {min_score} to {max_score}>"""

FIELDS = ("question", "reference", "answer", "transcript", "min_score", "max_score")

_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL | re.IGNORECASE)
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_SCORE = re.compile(r"score[\"']?\s*\**\s*[:=]\s*\**\s*[\"']?(" + _NUM + r")(?:\s*/\s*(" + _NUM + r"))?", re.IGNORECASE)
_BARE = re.compile(r"^\s*\**\s*(" + _NUM + r")(?:\s*/\s*(" + _NUM + r"))?\s*\**\s*\.?\s*$")


def parse_score(text: str, min_score: float = 0.0, max_score: float = 10.0) -> float:
    """The score in a judge's reply, in [min_score, max_score].

    Looks (after dropping ``<think>...</think>``) for the last ``SCORE: x`` (any case, markdown bold
    and JSON ``"score": x`` included), else a reply that is only a number. ``x/y`` is read as the
    fraction x/y of the range. RewardError, quoting the reply, when there is no score or it is out
    of range."""
    visible = _THINK.sub("", text or "")
    matches = _SCORE.findall(visible)
    if not matches:
        bare = _BARE.match(visible)
        matches = [bare.groups()] if bare else []
    if not matches:
        snippet = visible.strip()[-200:]
        raise RewardError(f"judge reply has no score (expected a last line 'SCORE: <number>'): {snippet!r}")
    num_s, den_s = matches[-1]
    value = float(num_s)
    if den_s:
        den = float(den_s)
        if den <= 0:
            raise RewardError(f"judge score {num_s}/{den_s} has a non-positive denominator")
        value = min_score + value / den * (max_score - min_score)
    if not math.isfinite(value) or not min_score <= value <= max_score:
        raise RewardError(f"judge score {value:g} is outside [{min_score:g}, {max_score:g}]")
    return value


def _question(task: dict, transcript: list[dict]) -> str:
    for key in ("question", "prompt", "problem"):
        v = task.get(key)
        if isinstance(v, str) and v.strip():
            return v
        if isinstance(v, list):  # a chat prompt: its user turns
            text = "\n\n".join(m.get("content") or "" for m in v if isinstance(m, dict) and m.get("role") == "user")
            if text.strip():
                return text
    users = [m.get("content") or "" for m in transcript if m.get("role") == "user"]
    return users[0] if users else ""


def render_transcript(transcript: list[dict], max_chars: int) -> str:
    """Assistant turns (tool calls included) and tool results, as plain text; head and tail kept
    when longer than ``max_chars``. System and user messages are left out (the task is shown apart)."""
    lines = []
    for m in transcript:
        role = m.get("role")
        if role == "assistant":
            lines.append(f"[assistant] {m.get('content') or ''}".rstrip())
            for c in m.get("tool_calls") or []:
                fn = c.get("function", c)
                args = fn.get("arguments")
                lines.append(f"[call {fn.get('name')}] {args if isinstance(args, str) else json.dumps(args)}")
        elif role == "tool":
            lines.append(f"[{m.get('name') or 'tool'} result] {m.get('content') or ''}")
    text = "\n".join(lines[:-1] if lines and lines[-1].startswith("[assistant]") else lines)  # last = the answer
    if len(text) <= max_chars:
        return text or "(none)"
    head = max_chars * 3 // 4
    tail = max_chars - head
    return f"{text[:head]}\n[... {len(text) - head - tail} chars cut ...]\n{text[len(text) - tail :]}"


class JudgeReward:
    """An LLM judge: ``await judge(task, final_text, transcript)`` -> score in [0, 1].

    Args:
        model: litellm ``provider/name`` of the judge.
        rubric: prompt template with ``{question}``, ``{reference}`` (``task["answer"]`` or
            ``task["reference"]``), ``{answer}`` (the final text), ``{transcript}``, ``{min_score}``,
            ``{max_score}``; literal braces are written ``{{`` ``}}``.
        min_score, max_score: the range the rubric asks for; the result is rescaled to [0, 1].
        api_base, api_key_env, timeout_s, max_retries, backoff_s, concurrency: see ``ApiClient``.
        temperature, max_tokens: sampling of the judge (temperature 0: the same verdict each time).
        max_transcript_chars: cap on the transcript shown to the judge.
    """

    def __init__(
        self,
        model: str,
        rubric: str = DEFAULT_RUBRIC,
        *,
        min_score: float = 0.0,
        max_score: float = 10.0,
        api_base: str | None = None,
        api_key_env: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        concurrency: int = 16,
        temperature: float = 0.0,
        max_tokens: int = 512,
        max_transcript_chars: int = 8000,
    ) -> None:
        if not isinstance(rubric, str) or not rubric.strip():
            raise ConfigError(f"judge rubric must be a non-empty string, got {rubric!r:.80}")
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(rubric) if f is not None}
        except ValueError as e:
            raise ConfigError(
                f"judge rubric is not a valid template ({e}); write literal braces as {{{{ }}}}"
            ) from None
        unknown = sorted(n for n in names if n not in FIELDS)
        if unknown:
            raise ConfigError(f"judge rubric uses unknown field(s) {unknown}; allowed: {list(FIELDS)}")
        if "answer" not in names:
            raise ConfigError("judge rubric must show the final answer: it has no {answer} field")
        if not (isinstance(min_score, (int, float)) and isinstance(max_score, (int, float)) and min_score < max_score):
            raise ConfigError(f"judge needs min_score < max_score, got {min_score!r} and {max_score!r}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ConfigError(f"judge max_tokens must be an int >= 1, got {max_tokens!r}")
        if not isinstance(max_transcript_chars, int) or max_transcript_chars < 100:
            raise ConfigError(f"judge max_transcript_chars must be an int >= 100, got {max_transcript_chars!r}")
        self.rubric, self.min_score, self.max_score = rubric, float(min_score), float(max_score)
        self.max_transcript_chars = max_transcript_chars
        self.client = ApiClient(
            model,
            api_base=api_base,
            api_key_env=api_key_env,
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_s=backoff_s,
            concurrency=concurrency,
            sampling={"temperature": temperature, "max_tokens": max_tokens},
        )

    @classmethod
    def from_config(cls, cfg: JudgeReward | dict[str, Any]) -> JudgeReward:
        """A judge from its keyword arguments (env kwargs in YAML); a judge is returned as is."""
        if isinstance(cfg, JudgeReward):
            return cfg
        if not isinstance(cfg, dict) or "model" not in cfg:
            raise ConfigError(f"judge config must be a mapping with at least 'model', got {cfg!r:.120}")
        try:
            return cls(**cfg)
        except TypeError as e:
            raise ConfigError(f"judge config: {e}") from None

    def __repr__(self) -> str:
        return f"JudgeReward({self.client!r}, range=[{self.min_score:g}, {self.max_score:g}])"

    def prompt(self, task: dict, final_text: str, transcript: list[dict]) -> str:
        reference = task.get("answer", task.get("reference"))
        return self.rubric.format(
            question=_question(task, transcript),
            reference="" if reference is None else str(reference),
            answer=final_text,
            transcript=render_transcript(transcript, self.max_transcript_chars),
            min_score=f"{self.min_score:g}",
            max_score=f"{self.max_score:g}",
        )

    async def __call__(self, task: dict, final_text: str, transcript: list[dict]) -> float:
        messages = [{"role": "user", "content": self.prompt(task, final_text, transcript)}]
        try:
            reply = await self.client.chat(messages)
        except EngineError as e:
            raise RewardError(f"judge call failed: {e}") from None
        try:
            raw = parse_score(reply.content, self.min_score, self.max_score)
        except RewardError as e:
            raise RewardError(redact(f"{self.client.model}: {e}")) from None
        return (raw - self.min_score) / (self.max_score - self.min_score)
