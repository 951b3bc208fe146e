"""Hostile model output for the fuzz suite (``tests/tools/test_fuzz.py``) and its long run (``bench/bench_fuzz.py``).

Owns: the generator of adversarial assistant-turn texts (``hostile_text``: deep nesting, huge
numbers, many tags, unclosed boxes, surrogates, NUL, ANSI, random unicode, valid calls mixed in),
the small pieces hypothesis composes (``PIECES``), the fakes the checks run on (``EchoSandbox``,
``make_env``, ``ScriptedPolicy``) and the checks themselves (``check_parsers``, ``check_scorers``,
``check_env_step``, ``check_episode``). A check raises ``Wrong`` when a result has the wrong type or
outcome (a model's mistake typed as an infrastructure failure, say); any other exception escaping a
check is a crash.

Does not: time anything or set budgets (the test module and the bench do), or run real programs
(``EchoSandbox`` answers every run with its own stdin, so tool output carries the hostile text too).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from agentrl.config.schema import RolloutConfig
from agentrl.envs import rewards
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.episodes.manager import EpisodeManager, EpisodeSpec
from agentrl.errors import EpisodeError, ToolCallError
from agentrl.sandbox import ExecResult, Sandbox
from agentrl.tools.calls import PARSERS, ParsedTurn
from agentrl.trajectory import Outcome, Trajectory, write_jsonl

#: ~ a max_new_tokens-sized turn (4,096 tokens of about 4 characters)
MAX_CHARS = 16_384
TRUTH = "42"


class Wrong(AssertionError):
    """A result of the wrong type, or an outcome typed wrongly (not a crash)."""


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise Wrong(what)


def _valid_utf8(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Wrong(f"{where} is not valid UTF-8: {e}") from None


# ---------------------------------------------------------------- the generator
_DIGITS = "0123456789"
_SURROGATE_ESCAPES = ("\\ud83d", "\\udc00", "\\ud800\\udfff", "\\udfff\\ud800", "\\ud83d\\ude00")
_CONTROL = ("\x00", "\x1b[31m", "\x1b[2J\x1b[H", "\r", "\x7f", "\u202e", "\u200b", "\ufeff", "\x1b]0;t\x07", "\t")


def _rand_unicode(rng: random.Random, n: int, raw_surrogates: bool) -> str:
    out = []
    for _ in range(n):
        cp = rng.choice(
            (
                rng.randrange(32, 127),
                rng.randrange(0x80, 0x800),
                rng.randrange(0x800, 0x10000),
                rng.randrange(0x10000, 0x110000),
            )
        )
        if 0xD800 <= cp <= 0xDFFF and not raw_surrogates:
            cp = 0xFFFD
        out.append(chr(cp))
    return "".join(out)


def _number(rng: random.Random, n: int) -> str:
    k = max(1, n)
    return rng.choice(
        (
            "1e" + "".join(rng.choices(_DIGITS, k=min(k, 12))),
            "-1E-" + "9" * min(k, 12),
            "".join(rng.choices(_DIGITS, k=k)),
            "1" + ",000" * (k // 4),
            "0." + "3" * k,
            "1/" * (k // 2) + "1",
            "\\frac{1e" + "9" * min(k, 9) + "}{3}",
            "\\frac{" + "1" * k + "}{" + "7" * k + "}",
            "$" + "9" * k + "$",
            "4" + "2" * min(k, 3),
            "42",
            ".5e" + "9" * min(k, 9),
        )
    )


def _call(name: str, args: str) -> str:
    return '<tool_call>{"name": ' + name + ', "arguments": ' + args + "}</tool_call>"


def _fragment(rng: random.Random, n: int, raw_surrogates: bool) -> str:
    """One hostile piece of about ``n`` characters (some families are much shorter)."""
    k = max(1, n // 12)
    kind = rng.randrange(16)
    if kind == 0:  # deep nesting inside a call's arguments, balanced or not
        o, c = rng.choice((("[", "]"), ('{"a":', "}"), ('[{"b":', "}]")))
        depth = max(1, n // (len(o) + len(c)))
        return _call('"python"', '{"code": "x", "y": ' + o * depth + "1" + c * rng.choice((depth, depth // 2, 0)) + "}")
    if kind == 1:  # huge numbers where the scorer looks
        num = _number(rng, n)
        return rng.choice(("\\boxed{%s}", "#### %s", "The answer is %s", "answer: %s.", "%s", "= %s")) % num
    if kind == 2:  # a huge JSON number in a call
        return _call('"python"', '{"code": ' + rng.choice(("1", "-1.5e")) + "".join(rng.choices(_DIGITS, k=n)) + "}")
    if kind == 3:  # many tags, open, close, mixed
        tags = ("<tool_call>", "</tool_call>", "<tool_call>{}", '<tool_call>{"name": "python"', "{", "}")
        return "".join(rng.choice(tags) for _ in range(k))
    if kind == 4:  # unclosed and nested boxes
        box = rng.choice(("\\boxed{", "\\fbox{", "{", "\\boxed{\\boxed{"))
        return box * k + rng.choice(("", "42", "42}", "}" * k, "7}" * (k // 2)))
    if kind == 5:  # surrogates as JSON escapes, in the name and the arguments
        esc = rng.choice(_SURROGATE_ESCAPES)
        return _call(
            rng.choice(('"%s"' % esc, '"python%s"' % esc, '"python"')),
            '{"code": "print(1) # %s", "%s": 1}' % (esc, esc)
            if rng.random() < 0.5
            else '{"code": "%s"}' % (esc * max(1, k // 2)),
        )
    if kind == 6:  # raw surrogates (only where the text need not be tokenized)
        return (
            "".join(rng.choice(("\ud83d", "\udc00", "\ud83d\ude00", "x")) for _ in range(k))
            if raw_surrogates
            else rng.choice(_CONTROL) * k
        )
    if kind == 7:  # control characters, ANSI escapes, bidi overrides
        return "".join(rng.choice(_CONTROL + ("a", " ", "\n")) for _ in range(max(1, n // 3)))
    if kind == 8:
        return _rand_unicode(rng, max(1, n // 2), raw_surrogates)
    if kind == 9:  # a valid call whose code carries hostile text
        code = json.dumps(_rand_unicode(rng, min(n, 400), raw_surrogates=False) + "\x00\x1b[0m")
        return _call(
            rng.choice(('"python"', '"bash"', '"nope"')),
            rng.choice(
                (
                    '{"code": %s}' % code,
                    '{"command": %s}' % code,
                    json.dumps('{"code": "1"}'),
                    '"{\\"code\\": ' + "[" * k + '"',
                    "null",
                    "[1]",
                    '{"code": 5}',
                )
            ),
        )
    if kind == 10:  # python fences, closed and not
        return rng.choice(("```python\nprint(%d)\n```" % k, "```py\n" + "x" * n, "```python" * k, "```" * k))
    if kind == 11:  # many "answer"/"####" markers and <answer> tags
        marks = ("answer: ", "#### ", "answer is ", "Answer = ", "<answer>", "</answer><answer>", "####\n")
        return rng.choice(marks) * k + _number(rng, 4)
    if kind == 12:  # number-like runs the regexes must stay linear on
        return rng.choice(
            (
                "1," * (n // 2),
                "1." * (n // 2),
                "-" * n + "1",
                "1e" * (n // 2),
                "9" * n + "x",
                "1 / " * (n // 4) + "2",
                ".5" * (n // 2),
                "1,000" * (n // 5),
            )
        )
    if kind == 13:  # \text{} and \frac{} the cleaner rewrites
        return ("\\text{" * k + "1" + "}" * k) if rng.random() < 0.5 else ("\\frac{" * k + "1}{2}" * k)
    if kind == 14:  # arguments as a JSON string holding deep or huge JSON
        inner = rng.choice(("[" * n + "]" * n, '{"code": ' + "9" * n + "}", '{"code": "ok"}'))
        return _call('"python"', json.dumps(inner))
    return "Let me think. " * k  # plain prose


def hostile_text(rng: random.Random, max_chars: int = MAX_CHARS, *, raw_surrogates: bool = True) -> str:
    """One assistant turn of at most ``max_chars`` characters: a few hostile fragments, or (a third
    of the time) one family repeated to full size, where quadratic paths show."""
    if max_chars <= 0:
        return ""
    if rng.random() < 0.33:
        return _fragment(rng, max_chars, raw_surrogates)[:max_chars]
    parts, budget = [], max_chars
    for _ in range(rng.randint(1, 6)):
        piece = _fragment(rng, rng.randint(1, max(1, budget)), raw_surrogates)
        parts.append(piece[:budget])
        budget -= len(parts[-1])
        if budget <= 0:
            break
    return "".join(parts)


#: small tokens hypothesis strings together (and shrinks): the syntax every parser and scorer keys on
PIECES = (
    "<tool_call>",
    "</tool_call>",
    '{"name": "python", "arguments": {"code": "print(1)"}}',
    '{"name": ',
    '"arguments": ',
    '"\\ud83d"',
    "\ud83d",
    "\udc00",
    "[",
    "]",
    "{",
    "}",
    '{"a":',
    "\\boxed{",
    "\\fbox{",
    "\\frac{",
    "1e9999999",
    "9" * 50,
    "1/",
    ",",
    ".",
    "e",
    "-",
    "#### ",
    "answer: ",
    "The answer is ",
    "<answer>",
    "</answer>",
    "```python\n",
    "```",
    "\x00",
    "\x1b[31m",
    "\n",
    " ",
    "42",
    "é",
    "\U0001f600",
    "\\text{",
    "$",
    "%",
)


# ---------------------------------------------------------------- the checks
def check_parsers(text: str) -> None:
    """Every parser returns a ParsedTurn whose calls and errors are well typed, never raises."""
    for name, parse in PARSERS.items():
        p = parse(text)
        _expect(isinstance(p, ParsedTurn) and isinstance(p.content, str), f"{name} returned {type(p).__name__}")
        ids = [c.id for c in p.calls] + [getattr(e, "call_id", None) for e in p.errors]
        _expect(
            sorted(ids, key=lambda i: int(i[5:])) == [f"call_{i}" for i in range(len(ids))],
            f"{name}: call ids {ids[:5]} are not call_0..call_{len(ids) - 1}",
        )
        for e in p.errors:
            _expect(isinstance(e, ToolCallError) and e.kind == "malformed", f"{name}: error {e!r} is not malformed")
            _valid_utf8(str(e), f"{name} error message")
        for c in p.calls:
            _expect(
                isinstance(c.name, str) and c.name != "" and isinstance(c.arguments, dict),
                f"{name}: call {c.name!r} has arguments of type {type(c.arguments).__name__}",
            )
            _valid_utf8(c.name, f"{name} call name")


def check_scorers(text: str, truth: str = TRUTH) -> None:
    """Extraction gives a string or None; rewards are 0.0 or 1.0; nothing raises."""
    for fn in (
        rewards.extract_boxed,
        rewards.extract_answer,
        rewards.extract_gsm8k_answer,
        rewards.extract_last_number,
    ):
        out = fn(text)
        _expect(out is None or isinstance(out, str), f"{fn.__name__} returned {type(out).__name__}")
        if isinstance(out, str):
            norm = rewards.normalize_number(out)
            _expect(norm is None or isinstance(norm, str), f"normalize_number returned {type(norm).__name__}")
    for value in (
        rewards.rule_reward(text, truth),
        rewards.gsm8k_reward(text, truth, method="flexible"),
        rewards.rule_reward(truth, text),
    ):
        _expect(value in (0.0, 1.0), f"a rule reward returned {value!r}")


class EchoSandbox(Sandbox):
    """Answers every run at once with its stdin (decoded as a real sandbox's output is), exit 0."""

    name = "echo"

    async def run(self, argv, *, stdin=None, timeout_s, files=None, limits=None, collect=()):
        out = (stdin or b"").decode("utf-8", errors="replace")[:2000]
        return ExecResult(stdout=out, stderr="", exit_code=0, status="ok", wall_s=0.0)


def make_env(parser: str = "hermes", difficulty: int = 1) -> CodeExecEnv:
    """``code_exec`` with both tools on the echo sandbox (difficulty 5 tasks are graded by unit tests)."""
    return CodeExecEnv(sandbox=EchoSandbox(), tools=("python", "bash"), parser=parser, difficulty=difficulty)


def _check_messages(messages: list[dict], stats: dict) -> None:
    _expect(stats["calls"] == len(messages), f"{stats['calls']} call attempts got {len(messages)} answers")
    _expect(stats["errors"] <= stats["calls"], f"tool_stats {stats} count more errors than calls")
    for m in messages:
        _expect(m.get("role") == "tool" and isinstance(m.get("content"), str), f"bad tool message {m!r:.200}")
        _valid_utf8(json.dumps(m, ensure_ascii=False), "a tool message")


async def check_env_step(env: CodeExecEnv, text: str, seed: int = 0) -> None:
    """``text`` as one turn, then (if the episode goes on) a final answer: typed results, no
    EpisodeError (the echo sandbox never fails, so any would be a model mistake typed as infrastructure)."""
    await env.areset(seed=seed)
    try:
        for action in (text, "\\boxed{42}"):
            obs, reward, terminated, truncated, info = await env.astep(action)
            _expect(
                isinstance(obs, str) and isinstance(reward, float) and math.isfinite(reward),
                f"step returned obs {type(obs).__name__}, reward {reward!r}",
            )
            _expect(terminated is info["final"] or info.get("ended_by") == "bad_call", f"terminated {terminated!r}")
            if terminated:
                _expect(info["messages"] == [], "a final turn answered with messages")
                return
            _check_messages(info["messages"], info["tool_stats"])
        raise Wrong("a final answer did not end the episode")
    except EpisodeError as e:
        raise Wrong(f"model text ended the env step as {e.outcome}: {e}") from e


class ScriptedPolicy:
    """FakeEngine policy: turn ``k`` of the current episode samples ``turns[k]``, then a final
    answer; ``start(turns)`` begins the next episode (episodes run one after another). The turns
    are tokenized in ``start``: a real engine samples ids, so turning text into ids is the fake's
    cost, not the episode's, and a caller timing episodes can leave it out."""

    FINAL = "So the answer is \\boxed{42}."

    def __init__(self, tokenizer, max_new_tokens: int) -> None:
        self.tok, self.max_new_tokens = tokenizer, max_new_tokens
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.final = self._ids(self.FINAL)
        self.turns: list[list[int]] = []
        self.k = 0

    def _ids(self, text: str) -> list[int]:
        # cut inside max_new_tokens so the stop id survives: a turn that ends is the common case
        return self.tok.encode(text, add_special_tokens=False)[: self.max_new_tokens - 1] + [self.eos]

    def start(self, turns: Sequence[str]) -> None:
        self.turns, self.k = [self._ids(t) for t in turns], 0

    def __call__(self, prompt_ids, params, ctx) -> list[int]:
        ids = self.turns[self.k] if self.k < len(self.turns) else self.final
        self.k += 1
        return ids


def episode_config(max_new_tokens: int = 4096) -> RolloutConfig:
    return RolloutConfig(
        max_turns=4,
        max_new_tokens=max_new_tokens,
        max_context=4 * max_new_tokens + 4096,
        turn_timeout_s=30.0,
        episode_timeout_s=60.0,
    )


async def check_episode(mgr: EpisodeManager, seed: int, out: Path) -> Trajectory:
    """One whole episode of the turns its ScriptedPolicy was ``start``-ed with: its outcome must be
    trainable (every failure here is the model's), its arrays consistent, and the trajectory writer
    must accept it."""
    traj = await mgr.run_episode(EpisodeSpec(f"fz{seed}", 0, task_seed=seed))
    _expect(Outcome(traj.outcome).trainable, f"episode ended {traj.outcome.value}: {traj.outcome_detail[:300]}")
    traj.validate()
    write_jsonl(out, [traj])
    out.read_bytes().decode("utf-8")  # strict: the writer wrote valid UTF-8
    return traj


def episode_manager(
    tokenizer, policy: ScriptedPolicy, env_factory: Callable[[], CodeExecEnv] = make_env
) -> EpisodeManager:
    from agentrl.engine.fake import FakeEngine

    return EpisodeManager(
        FakeEngine(policy), env_factory, tokenizer, episode_config(policy.max_new_tokens), env_id="code_exec"
    )
