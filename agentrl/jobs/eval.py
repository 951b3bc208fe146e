"""Episodes with an API model at text level: baselines, and chat data for ``agentrl sft``.

Owns: the text-level turn loop (chat messages and the env's tool schemas to
``agentrl.common.llm_api.ApiClient``; the reply turned into the env's action text; the env's answer back
into the chat), running N episodes concurrently (one failing episode never breaks the others:
each ends with a typed ``Outcome``), streaming results to disk as they finish, and the summary.

Turning replies into actions: structured ``tool_calls`` are written the way the env's parser reads
them (``hermes``: ``<tool_call>{"name", "arguments"}</tool_call>`` blocks after the content;
``python_block``: a ```` ```python ```` block per ``python`` call). A reply that writes its calls in
the text (an endpoint without a tool parser) goes to the env as is; it is parsed with the env's
parser (``agentrl.tools.calls``) only to send the conversation back to the API in OpenAI form
(assistant ``tool_calls`` + ``tool`` answers; an answer to a malformed call goes as a user message).

Files (``out`` = ``X.jsonl``):

* ``X.jsonl`` — chat rows ``{"messages", "tools"}`` that ``agentrl sft --data`` loads: episodes
  that ended ``ok`` with reward >= ``min_reward``; assistant messages hold the action text exactly
  as the env saw it;
* ``X.episodes.jsonl`` — every episode: task, outcome, detail, reward, turns, usage, messages;
* ``X.summary.json`` — the summary ``run_eval`` returns (model, endpoint without credentials);
* ``X.config.json`` — the settings that decide what is measured, written at start.

Both JSONL files grow line by line (flushed) as episodes finish and are rewritten in order at the end;
``resume`` continues an interrupted eval from them (``agentrl.jobs.eval_store``: only missing and
infrastructure-failed attempts run again, and the summary counts each ``(task, attempt)`` once).

Attempts: with ``attempts`` N > 1 every task runs N times (the same task seed; the API's sampling
makes them differ), episode ``index`` naming the task and ``attempt`` the try; the summary adds
``tasks``, ``attempts``, ``pass@1`` .. ``pass@N`` (``agentrl.episodes.pass_at_k``) and ``avg@N``. Every
rate is over tasks x attempts with an infrastructure failure counted as an unsolved attempt, and
``infra_failures`` counts those attempts (``episodes`` = tasks x attempts is their denominator). With
``stop_if_all_failed`` an eval whose every episode ended with an infrastructure outcome raises
``InfraFailureError`` (after the files are written) instead of passing for a result.

Every line is passed through ``llm_api.redact`` before it is written (no environment secret lands
in these files even if an env or tool were to echo one).

Does not: tokenize (the API does), train, or compare tokens with a local model.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from agentrl.common.llm_api import ApiClient, ChatReply, public_url, redact
from agentrl.episodes.manager import make_specs
from agentrl.episodes.pass_at_k import pass_at_k_rates
from agentrl.episodes.summary import End, is_solved
from agentrl.episodes.summary import summarize as summarize_ends
from agentrl.errors import ConfigError, EpisodeError, InfraFailureError
from agentrl.jobs.eval_store import EvalStore, output_paths
from agentrl.tools.calls import get_parser
from agentrl.trajectory import Outcome


@dataclass
class ApiEpisode:
    """One finished episode (what ``X.episodes.jsonl`` holds, one per line)."""

    index: int
    task_seed: int
    task: dict = field(default_factory=dict)
    outcome: str = Outcome.OK.value
    detail: str = ""
    reward: float = 0.0
    turns: int = 0
    tool_calls: int = 0
    usage: dict = field(default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0})
    wall_s: float = 0.0
    messages: list[dict] = field(default_factory=list)
    tools: list[dict] = field(default_factory=list)
    attempt: int = 0  # which of the task's attempts (0 .. attempts-1); index names the task

    @classmethod
    def from_row(cls, row: dict) -> ApiEpisode:
        """The episode a line of ``X.episodes.jsonl`` holds (keys it does not know are ignored)."""
        return cls(**{k: v for k, v in row.items() if k in _EPISODE_FIELDS})

    def chat_row(self) -> dict:
        row: dict[str, Any] = {"messages": self.messages}
        if self.tools:
            row["tools"] = self.tools
        return row


_EPISODE_FIELDS = {f.name for f in fields(ApiEpisode)}


def render_action(reply: ChatReply, parser: str) -> str:
    """The reply as the text the env parses (see the module docstring)."""
    if not reply.tool_calls:
        return reply.content
    parts = [reply.content.strip()] if reply.content.strip() else []
    for c in reply.tool_calls:
        args: Any = c["arguments"]
        try:
            args = json.loads(args) if isinstance(args, str) and args.strip() else (args or {})
        except (ValueError, RecursionError):  # bad JSON, too deep, an int past the digit limit
            pass  # kept as the raw string: the env's parser answers it as a malformed call
        if (
            parser == "python_block"
            and c["name"] == "python"
            and isinstance(args, dict)
            and isinstance(args.get("code"), str)
        ):
            parts.append(f"```python\n{args['code']}\n```")
        else:
            parts.append(
                "<tool_call>\n"
                + json.dumps({"name": c["name"], "arguments": args}, ensure_ascii=False)
                + "\n</tool_call>"
            )
    return "\n".join(parts)


def _api_assistant(reply: ChatReply, action: str, parser: str) -> tuple[dict, list[str]]:
    """The assistant message sent back to the API and the ids of the calls it declares."""
    if reply.tool_calls:
        calls = [
            {
                "id": c["id"],
                "type": "function",
                "function": {
                    "name": c["name"],
                    "arguments": c["arguments"] if isinstance(c["arguments"], str) else json.dumps(c["arguments"]),
                },
            }
            for c in reply.tool_calls
        ]
        return {"role": "assistant", "content": reply.content or None, "tool_calls": calls}, [c["id"] for c in calls]
    parsed = get_parser(parser)(action)
    if not parsed.calls:
        return {"role": "assistant", "content": action}, []
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
        for c in parsed.calls
    ]
    return {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}, [c.id for c in parsed.calls]


def _api_answers(messages: list[dict], declared: list[str], structured: bool) -> list[dict]:
    """The env's answers in OpenAI form: each ``tool`` message tied to a declared call id (by
    position when the calls came structured, since the env numbers them ``call_<n>``)."""
    out, k = [], 0
    for m in messages:
        if m.get("role") != "tool":
            out.append({"role": m.get("role", "user"), "content": m.get("content") or ""})
            continue
        cid = m.get("tool_call_id")
        if structured and k < len(declared):
            cid, k = declared[k], k + 1
        if cid in declared:
            out.append({"role": "tool", "tool_call_id": cid, "content": m.get("content") or ""})
        else:
            out.append({"role": "user", "content": m.get("content") or ""})
    return out


async def _env_call(env: Any, name: str, *args: Any, **kw: Any) -> Any:
    afn = getattr(env, "a" + name, None)
    if afn is not None:
        return await afn(*args, **kw)
    return await asyncio.to_thread(getattr(env, name), *args, **kw)


async def run_api_episode(
    client: ApiClient,
    make_env: Callable[[], Any],
    index: int,
    task_seed: int,
    *,
    max_turns: int = 8,
    score_truncated: bool = False,
    options: dict | None = None,
) -> ApiEpisode:
    """One episode; never raises (but the caller's cancellation). The outcome says how it ended."""
    ep = ApiEpisode(index=index, task_seed=task_seed)
    env = None
    t0 = time.perf_counter()
    try:
        env = make_env()
        parser = getattr(env, "parser", "hermes")
        _, info = await _env_call(env, "reset", seed=task_seed, options=options)
        ep.task, ep.tools = copy.deepcopy(info.get("task", {})), copy.deepcopy(info.get("tools") or [])
        ep.messages = copy.deepcopy(info["messages"])
        api_messages = [{"role": m["role"], "content": m.get("content") or ""} for m in info["messages"]]
        for turn in range(max_turns):
            reply = await client.chat(api_messages, ep.tools or None)
            ep.turns = turn + 1
            ep.usage = {k: ep.usage.get(k, 0) + v for k, v in reply.usage.items()}
            action = render_action(reply, parser)
            ep.messages.append({"role": "assistant", "content": action})
            if reply.finish_reason == "length":
                if score_truncated:
                    _, reward, terminated, _, _ = await _env_call(env, "step", action)
                    ep.reward = float(reward) if terminated else 0.0
                ep.outcome, ep.detail = Outcome.TRUNCATED_LENGTH.value, f"turn {turn} hit the token limit"
                return ep
            _, reward, terminated, truncated, sinfo = await _env_call(env, "step", action)
            ep.tool_calls += int(sinfo.get("tool_stats", {}).get("calls", 0))
            if terminated:
                ep.reward = float(reward)
                return ep
            if truncated:
                ep.outcome, ep.detail = Outcome.TRUNCATED_TURNS.value, "env truncated the episode"
                return ep
            answers = copy.deepcopy(sinfo.get("messages", []))
            assistant, declared = _api_assistant(reply, action, parser)
            api_messages += [assistant, *_api_answers(answers, declared, bool(reply.tool_calls))]
            ep.messages.extend(answers)
        ep.outcome, ep.detail = Outcome.TRUNCATED_TURNS.value, f"reached max_turns={max_turns}"
    except EpisodeError as e:
        ep.outcome, ep.detail, ep.reward = e.outcome, redact(f"{type(e).__name__}: {e}"), 0.0
    except Exception as e:  # a bug in an env must not take the batch down
        ep.outcome, ep.detail, ep.reward = Outcome.ENV_ERROR.value, redact(f"{type(e).__name__}: {e}"), 0.0
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:
                pass
        ep.wall_s = time.perf_counter() - t0
    return ep


def summarize(episodes: list[ApiEpisode]) -> dict[str, Any]:
    """The episode summary every job shares (``agentrl.episodes.summary``: solve and
    infrastructure-failure rates over every episode, reward mean and tool use over the trainable
    ones; 0.0 here when there are none) plus the API's token usage. An API episode's return is its
    terminal reward (the text-level loop keeps no per-turn rewards)."""
    s = summarize_ends(End(e.outcome, e.reward, e.reward, e.turns, e.tool_calls) for e in episodes)
    return {
        "reward_mean": 0.0,
        "tool_use_rate": 0.0,
        **s,
        "prompt_tokens": sum(e.usage.get("prompt_tokens", 0) for e in episodes),
        "completion_tokens": sum(e.usage.get("completion_tokens", 0) for e in episodes),
    }


def attempt_rates(episodes: list[ApiEpisode], attempts: int) -> dict[str, Any]:
    """``tasks``, ``attempts`` and :func:`~agentrl.episodes.pass_at_k.pass_at_k_rates` of episodes
    grouped by task (``index``), each task's solved attempts counted with ``is_solved`` (an
    infrastructure failure is an attempt, unsolved)."""
    solved: dict[int, int] = {}
    for e in episodes:
        solved[e.index] = solved.get(e.index, 0) + is_solved(e.outcome, e.reward)
    return {"tasks": len(solved), "attempts": attempts, **pass_at_k_rates(list(solved.values()), attempts)}


def all_failed(episodes: list[ApiEpisode]) -> str | None:
    """Why every episode failed for an infrastructure reason (the outcomes, the first detail), or None
    when at least one ended with a trainable outcome (or there are none)."""
    if not episodes or any(Outcome(e.outcome).trainable for e in episodes):
        return None
    counts: dict[str, int] = {}
    for e in episodes:
        counts[e.outcome] = counts.get(e.outcome, 0) + 1
    which = ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
    detail = next((e.detail for e in episodes if e.detail), "")
    example = " ".join(detail.split())[:300] or "no detail recorded"
    ended = f"ended {next(iter(counts))}" if len(counts) == 1 else f"failed for an infrastructure reason ({which})"
    return f"every one of the {len(episodes)} episodes {ended}: {example}"


def _public(obj: Any) -> Any:
    """``obj`` with every ``api_base`` (a judge's, in env kwargs) stripped of credentials."""
    if isinstance(obj, dict):
        return {k: public_url(v) if k == "api_base" and isinstance(v, str) else _public(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_public(v) for v in obj]
    return obj


async def run_eval(
    env_id: str,
    client: ApiClient,
    *,
    n: int = 8,
    env_kwargs: dict | None = None,
    seed: int = 0,
    max_turns: int | None = None,
    concurrency: int = 8,
    episode_timeout_s: float = 1800.0,
    score_truncated: bool = False,
    min_reward: float | None = None,
    out: str | Path | None = None,
    on_episode: Callable[[ApiEpisode], None] | None = None,
    attempts: int = 1,
    stop_if_all_failed: bool = False,
    resume: bool = False,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run ``attempts`` episodes of each of ``n`` tasks of ``env_id`` (chosen by ``seed`` as ``agentrl
    rollout`` chooses them) with at most ``concurrency`` in flight; write the files (module docstring)
    as episodes finish. ``stop_if_all_failed``: InfraFailureError when every episode failed for an
    infrastructure reason. ``resume``: continue the eval ``out`` holds (``agentrl.jobs.eval_store``),
    running only the attempts it lacks or that failed for an infrastructure reason; ``say`` hears how
    many that is."""
    from agentrl.envs.registry import make, spec  # lazy: pulls in gymnasium

    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"n (episodes) must be an int >= 1, got {n!r}")
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        raise ConfigError(f"attempts (per task) must be an int >= 1, got {attempts!r}")
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency must be an int >= 1, got {concurrency!r}")
    env_kwargs = dict(env_kwargs or {})
    max_turns = max_turns or spec(env_id).max_turns or 8
    make(env_id, **env_kwargs).close()  # a bad env id or kwargs fails here, before any API call
    specs = make_specs(n, 1, seed)

    def keep(ep: ApiEpisode) -> bool:
        return ep.outcome == Outcome.OK.value and (min_reward is None or ep.reward >= min_reward)

    described = {
        "env": env_id,
        "env_kwargs": _public(env_kwargs),
        **client.describe(),
        "seed": seed,
        "max_turns": max_turns,
    }
    settings = {**described, "score_truncated": score_truncated, "n": n, "attempts": attempts}
    store = EvalStore(output_paths(out), settings, keep) if out is not None else None
    found = store is not None and resume and store.episodes.exists()
    done = store.open(resume, ApiEpisode.from_row) if store else {}
    if found and say and store is not None:  # found implies a store
        left = n * attempts - len(done)
        say(f"resuming {store.episodes}: {len(done)} of {n * attempts} attempts finished, {left} to run")
    episodes: list[ApiEpisode] = list(done.values())
    # attempt-major: every task's first attempt before any second one (an early stop still covers the tasks)
    todo = [(i, a, s) for a in range(attempts) for i, s in enumerate(specs) if (i, a) not in done]
    queue = iter(todo)
    t0 = time.perf_counter()

    async def one(i: int, attempt: int, task_seed: int) -> ApiEpisode:
        try:
            async with asyncio.timeout(episode_timeout_s):
                ep = await run_api_episode(
                    client,
                    lambda: make(env_id, **env_kwargs),
                    i,
                    task_seed,
                    max_turns=max_turns,
                    score_truncated=score_truncated,
                )
        except TimeoutError:
            ep = ApiEpisode(
                index=i,
                task_seed=task_seed,
                outcome=Outcome.DEADLINE.value,
                detail=f"episode passed its {episode_timeout_s:g} s deadline",
            )
        ep.attempt = attempt
        return ep

    async def worker() -> None:
        for i, a, s in queue:
            ep = await one(i, a, s.task_seed)
            episodes.append(ep)
            if store:
                store.record(ep)
            if on_episode:
                on_episode(ep)

    try:
        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(todo))))))
    finally:
        if store:
            store.close()
    episodes.sort(key=lambda e: (e.index, e.attempt))
    summary = {
        **described,
        **summarize(episodes),
        **(attempt_rates(episodes, attempts) if attempts > 1 else {}),
        "wall_s": time.perf_counter() - t0,
        "chat_rows": sum(keep(e) for e in episodes),
    }
    if resume:
        summary["resumed"] = len(done)
    if store:
        summary["files"] = store.names()
        store.finish(episodes, summary)
    why = all_failed(episodes) if stop_if_all_failed else None
    if why:
        raise InfraFailureError(f"eval of {env_id} with {client.model}: {why} (nothing was measured)")
    return summary
