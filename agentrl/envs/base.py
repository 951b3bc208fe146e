"""Gymnasium-style text environments for tool-calling agents.

Owns: ``TextSpace`` (the str space of observations and actions), ``AgentEnv`` (the text-in /
text-out ``gymnasium.Env`` contract plus async variants) and ``ToolEnv`` (the multi-turn tool loop:
parse calls, run tools concurrently under deadlines, answer mistakes, score the final answer).

The contract (what the episode manager relies on):

* ``reset(seed=, options=) -> (obs, info)``; ``info["messages"]``: the chat to start from
  (system? + user), ``info["tools"]``: tool JSON schemas, ``info["task"]``: a JSON-able dict with
  at least ``id``. ``obs`` is the messages' contents joined.
* ``step(action) -> (obs, reward, terminated, truncated, info)``; ``action`` is the assistant
  turn's text without the stop token. ``info["messages"]``: messages to append (role ``tool``,
  or ``user`` follow-ups); ``obs`` their contents joined; ``info["tool_stats"]``: counts
  (``calls`` attempts, ``errors`` answered with an error, ``malformed``, ``unknown_tool``,
  ``bad_arguments``, ``over_limit``, ``timeouts``, ``exceptions``). Optional
  ``info["reward_components"]``: ``{name: number}``, the named parts of this step's reward (e.g.
  ``{"correct": 1.0, "format": 0.2}``, adding up to ``reward``); the manager sums them over the
  episode into ``Trajectory.info["reward_components"]``, and ``algo.reward_normalization=gdpo``
  normalises each within its group on its own (``shaping`` is reserved for the run's own terms).
* Optional, for envs whose task is files to work on (``bash_fix``): ``info["workspace"]`` from
  ``reset``, ``{"files": {relative path: text}, "collect": [relative paths]}``, and
  ``async check_workspace(files) -> (reward, reason)`` scoring the collected files ({path: bytes},
  a missing one absent). An outside agent program (``agent.kind: proxy``) then starts in a work dir
  holding the files, and with ``agent.reward: env`` the env scores what it left there instead of
  its final text (``agentrl.agents.strategy``).
* ``areset``/``astep`` are the async variants (preferred). Infrastructure failures raise
  ``agentrl.errors`` EpisodeError subclasses; model mistakes never raise.
* Held-out tasks: ``agentrl run`` evaluates on envs made with ``eval.env_kwargs`` (default
  ``split="eval"``). An env with held-out tasks takes a ``split`` keyword (``"train"`` by default,
  ``"eval"`` drawing tasks training never sees) and may say so with ``has_eval_split = True``. An
  env without any sets the class attribute ``has_eval_split = False`` (or registers with
  ``has_eval_split=False``): ``make(id, split=...)`` then drops ``split`` with a warning and
  evaluation runs on training-distribution tasks. An env that does neither is a ``ConfigError``
  when made with ``split`` (``agentrl.envs.registry``), and ``check_agent_env`` reports it.

Does not: enforce ``max_turns`` or token budgets (the episode manager does), tokenize, or sandbox.
"""

from __future__ import annotations

import asyncio
import copy
import math
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.error import ResetNeeded

from agentrl.errors import ConfigError, EnvError, EpisodeError, RewardError, ToolCallError, ToolTimeoutError
from agentrl.sandbox.slots import WAIT_CLOCK, WaitClock
from agentrl.tools.base import Tool, ToolSet
from agentrl.tools.calls import ParsedTurn, ToolCall, get_parser
from agentrl.trajectory import valid_text

_PRINTABLE = np.array(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"()-+*/=\n"))
STAT_KEYS = ("calls", "errors", "malformed", "unknown_tool", "bad_arguments", "over_limit", "timeouts", "exceptions")


class TextSpace(gym.spaces.Space[str]):
    """Any ``str`` of at most ``max_length`` characters; ``sample()`` draws printable text."""

    def __init__(self, max_length: int = 1 << 20, *, sample_max_length: int = 64, seed: int | None = None) -> None:
        self.max_length, self.sample_max_length = int(max_length), int(sample_max_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(0, min(self.sample_max_length, self.max_length) + 1))
        return "".join(self.np_random.choice(_PRINTABLE, size=n).tolist())

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def to_jsonable(self, sample_n):  # type: ignore[override]
        return list(sample_n)

    def from_jsonable(self, sample_n):  # type: ignore[override]
        return list(sample_n)

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, TextSpace) and other.max_length == self.max_length


def join_messages(messages: list[dict]) -> str:
    return "\n\n".join(m.get("content") or "" for m in messages)


def new_stats() -> dict[str, int]:
    return dict.fromkeys(STAT_KEYS, 0)


class AgentEnv(gym.Env[str, str]):
    """A text env: str observations, str actions (assistant turns). See the module docstring.

    Subclasses implement ``reset``/``step`` (sync-native) or, like ``ToolEnv``, ``areset``/``astep``.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    #: the eval-split declaration (module docstring): True = takes ``split``, False = has no held-out
    #: tasks (``split`` is dropped with a warning), None = undeclared (``split`` must be accepted)
    has_eval_split: bool | None = None

    def __init__(self, *, max_text_length: int = 1 << 20) -> None:
        self.observation_space = TextSpace(max_text_length)
        self.action_space = TextSpace(max_text_length)

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        return self.reset(seed=seed, options=options)

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict]:
        return self.step(action)


@dataclass
class CallResult:
    """One answered call of a turn: ``error`` is None or a stat key (``malformed``, ``timeouts``...)."""

    call: ToolCall | None
    content: str
    error: str | None = None
    call_id: str = ""  # for malformed calls, which have no ToolCall


class _ToolRaised(Exception):
    """Wraps a TimeoutError raised *by a tool* so it is not mistaken for our deadline."""


class ToolEnv(AgentEnv):
    """The tool-calling loop. Subclasses provide the task and the reward:

    * ``tools``: list of ``Tool`` (set before ``super().__init__`` or as a class attribute);
    * ``sample_task(rng, options) -> dict`` (JSON-able, with ``id``), drawn from ``rng`` only;
    * ``initial_messages(task) -> list[dict]``;
    * ``async score(task, final_text, transcript) -> float``: terminal reward; raise RewardError;
    * optional ``turn_reward(task, parsed, results) -> float`` added to every step's reward.

    A turn with no tool call (and no malformed one) is the final answer: reward = turn_reward +
    score, terminated. Otherwise each call is answered by one ``tool`` message in text order.
    ``options["task"]`` passed to reset overrides ``sample_task`` (evaluation on fixed tasks).
    """

    tools: list[Tool] = []
    parser: str = "hermes"

    def __init__(
        self,
        *,
        parser: str | None = None,
        on_bad_call: str = "observe",
        on_tool_timeout: str = "end",
        on_tool_exception: str = "end",
        tool_timeout_s: float | None = 30.0,
        max_calls_per_turn: int = 8,
        max_tool_output_chars: int = 4000,
        max_text_length: int = 1 << 20,
    ) -> None:
        super().__init__(max_text_length=max_text_length)
        for field_name, value, choices in (
            ("on_bad_call", on_bad_call, ("observe", "end")),
            ("on_tool_timeout", on_tool_timeout, ("observe", "end")),
            ("on_tool_exception", on_tool_exception, ("observe", "end")),
        ):
            if value not in choices:
                raise ConfigError(f"{field_name} must be one of {choices}, got {value!r}")
        if tool_timeout_s is not None and not tool_timeout_s > 0:
            raise ConfigError(f"tool_timeout_s must be > 0 or None, got {tool_timeout_s!r}")
        if max_calls_per_turn < 1:
            raise ConfigError(f"max_calls_per_turn must be >= 1, got {max_calls_per_turn!r}")
        if max_tool_output_chars < 100:
            raise ConfigError(f"max_tool_output_chars must be >= 100, got {max_tool_output_chars!r}")
        self.parser = parser or type(self).parser
        self._parse = get_parser(self.parser)
        self.on_bad_call, self.on_tool_timeout, self.on_tool_exception = on_bad_call, on_tool_timeout, on_tool_exception
        self.tool_timeout_s, self.max_calls_per_turn = tool_timeout_s, max_calls_per_turn
        self.max_tool_output_chars = max_tool_output_chars
        self.toolset = ToolSet(self.tools)
        self._task: dict | None = None
        self._transcript: list[dict] = []
        self._done = True
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---------------------------------------------------------------- hooks
    def sample_task(self, rng: np.random.Generator, options: dict) -> dict:
        raise NotImplementedError

    def initial_messages(self, task: dict) -> list[dict]:
        raise NotImplementedError

    async def score(self, task: dict, final_text: str, transcript: list[dict]) -> float:
        raise NotImplementedError

    def turn_reward(self, task: dict, parsed: ParsedTurn, results: list[CallResult]) -> float:
        return 0.0

    # ---------------------------------------------------------------- reset
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = dict(options or {})
        task = options["task"] if "task" in options else self.sample_task(self.np_random, options)
        if not isinstance(task, dict) or "id" not in task:
            raise EnvError(f"{type(self).__name__}.sample_task must return a dict with an 'id', got {task!r:.200}")
        messages = self.initial_messages(task)
        self._task = copy.deepcopy(task)
        self._transcript = copy.deepcopy(messages)
        self._done = False
        info = {"messages": messages, "tools": self.toolset.schemas(), "task": task}
        # deepcopy: every call must return fresh objects (callers keep and mutate them).
        return join_messages(messages), copy.deepcopy(info)

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        return self.reset(seed=seed, options=options)

    # ---------------------------------------------------------------- step
    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                f"{type(self).__name__}.step() was called from inside a running event loop; "
                f"use `await env.astep(action)` there instead"
            )
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(self.astep(action))

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._done or self._task is None:
            raise ResetNeeded("step() after the episode ended (or before reset()); call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"action must be the assistant turn's text (str), got {type(action).__name__}")
        task = self._task
        parsed = self._parse(action)
        self._transcript.append(
            {
                "role": "assistant",
                "content": action,
                "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in parsed.calls],
            }
        )
        stats = new_stats()
        if not parsed.calls and not parsed.errors:
            self._done = True
            reward = self._turn_reward(task, parsed, []) + await self._score(task, action)
            return "", reward, True, False, {"messages": [], "tool_stats": stats, "final": True}
        results = await self._answer(parsed, stats)
        messages = [self._tool_message(r) for r in results]
        self._transcript.extend(copy.deepcopy(messages))
        info: dict[str, Any] = {"messages": messages, "tool_stats": stats, "final": False}
        reward = self._turn_reward(task, parsed, results)
        bad = stats["malformed"] + stats["unknown_tool"] + stats["bad_arguments"]
        if bad and self.on_bad_call == "end":
            self._done = True
            info["ended_by"] = "bad_call"
            return join_messages(messages), 0.0, True, False, info
        return join_messages(messages), reward, False, False, info

    # ---------------------------------------------------------------- internals
    def _turn_reward(self, task: dict, parsed: ParsedTurn, results: list[CallResult]) -> float:
        return float(self.turn_reward(task, parsed, results))

    async def _score(self, task: dict, final_text: str) -> float:
        try:
            value = await self.score(task, final_text, copy.deepcopy(self._transcript))
        except EpisodeError:
            raise  # RewardError, or a SandboxError from grading: keep the precise outcome
        except Exception as e:
            raise RewardError(f"{type(self).__name__}.score failed: {type(e).__name__}: {e}") from e
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise RewardError(f"{type(self).__name__}.score returned {value!r}, not a number") from None
        if not math.isfinite(value):
            raise RewardError(f"{type(self).__name__}.score returned {value}")
        return value

    def _tool_message(self, r: CallResult) -> dict:
        msg = {
            "role": "tool",
            "content": valid_text(self._cap(r.content)),
        }  # a tool's exception text may hold surrogates
        if r.call is not None:
            msg["name"] = r.call.name
        call_id = r.call.id if r.call is not None else r.call_id
        if call_id:
            msg["tool_call_id"] = call_id
        return msg

    def _cap(self, text: str) -> str:
        """Head and tail (errors are usually at the end of output) around a marker."""
        n = self.max_tool_output_chars
        if len(text) <= n:
            return text
        head, tail = (n * 3) // 4, n // 4
        return f"{text[:head]}\n[truncated {len(text) - head - tail} chars]\n{text[len(text) - tail :]}"

    async def _answer(self, parsed: ParsedTurn, stats: dict[str, int]) -> list[CallResult]:
        """Answer every attempt of the turn, in text order (ids are ``call_<n>`` by position)."""
        ordered: list[tuple[int, Any]] = [(_pos(e, i), e) for i, e in enumerate(parsed.errors)]
        ordered += [(_pos(c, i), c) for i, c in enumerate(parsed.calls)]
        ordered.sort(key=lambda x: x[0])
        stats["calls"] = len(ordered)
        slots: list[CallResult | None] = [None] * len(ordered)
        runnable: list[tuple[int, ToolCall]] = []
        for k, (_, item) in enumerate(ordered):
            if isinstance(item, ToolCallError):
                slots[k] = CallResult(None, f"Error: {item}", "malformed", getattr(item, "call_id", "") or "")
            elif len(runnable) >= self.max_calls_per_turn:
                slots[k] = CallResult(
                    item,
                    f"Error: too many tool calls in one turn (at most "
                    f"{self.max_calls_per_turn}); this call was not run.",
                    "over_limit",
                )
            else:
                runnable.append((k, item))
        for (k, _), res in zip(runnable, await self._run_all([c for _, c in runnable])):
            slots[k] = res
        for r in slots:
            if r is not None and r.error:
                stats["errors"] += 1
                stats[r.error] += 1
        return [r for r in slots if r is not None]

    async def _run_all(self, calls: list[ToolCall]) -> list[CallResult]:
        if not calls:
            return []
        if len(calls) == 1:  # the common case; skip task machinery
            return [await self._run_one(calls[0])]
        tasks = [asyncio.ensure_future(self._run_one(c)) for c in calls]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            pending = [t for t in tasks if not t.done()]
            for t in pending:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in tasks:  # first failure in call order ends the episode
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        return [t.result() for t in tasks]

    async def _run_one(self, call: ToolCall) -> CallResult:
        async def guarded() -> str:
            try:
                return await self.toolset.call(call)
            except TimeoutError as e:
                raise _ToolRaised(e) from e

        try:
            if self.tool_timeout_s is None:
                return CallResult(call, await guarded())
            return CallResult(call, await _run_time_limited(guarded, self.tool_timeout_s))
        except ToolCallError as e:
            return CallResult(call, f"Error: {e}", e.kind if e.kind in STAT_KEYS else "bad_arguments")
        except TimeoutError:
            msg = f"tool {call.name!r} did not finish within {self.tool_timeout_s:g} s"
            if self.on_tool_timeout == "end":
                raise ToolTimeoutError(msg) from None
            return CallResult(call, f"Error: {msg}.", "timeouts")
        except EpisodeError:
            raise  # SandboxError and friends: infrastructure, ends the episode
        except Exception as e:
            err = e.__cause__ if isinstance(e, _ToolRaised) else e
            if self.on_tool_exception == "end":
                raise EnvError(f"tool {call.name!r} raised {type(err).__name__}: {err}") from err
            summary = "".join(traceback.format_exception_only(type(err), err)).strip()
            return CallResult(call, f"Error: tool {call.name!r} failed: {summary}", "exceptions")

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed() and not self._loop.is_running():
            self._loop.close()
        self._loop = None
        super().close()

    def __del__(self) -> None:
        # A sync-stepped env dropped without close() would otherwise leak its private loop.
        loop = getattr(self, "_loop", None)
        if loop is not None and not loop.is_closed() and not loop.is_running():
            loop.close()


async def _run_time_limited(fn: Callable[[], Awaitable[Any]], limit_s: float) -> Any:
    """``await fn()`` with a deadline of ``limit_s`` seconds of *running* time: seconds spent waiting
    for a sandbox slot (``agentrl.sandbox.slots.WaitClock``) do not count, so a busy sandbox delays a
    call instead of timing it out (the turn deadline still bounds the whole wait). Raises
    TimeoutError at the deadline, after cancelling the call."""
    clock = WaitClock()
    token = WAIT_CLOCK.set(clock)
    try:
        task = asyncio.ensure_future(fn())  # copies the context: the call's waits reach this clock
    finally:
        WAIT_CLOCK.reset(token)
    t0 = time.perf_counter()
    try:
        while True:
            left = limit_s - (time.perf_counter() - t0 - clock.waited())
            if left <= 0:
                break
            done, _ = await asyncio.wait({task}, timeout=left)
            if done:
                return task.result()
    except BaseException:
        task.cancel()
        raise
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise TimeoutError


def _pos(item: Any, fallback: int) -> int:
    cid = getattr(item, "call_id", None) if isinstance(item, ToolCallError) else getattr(item, "id", None)
    if isinstance(cid, str) and cid.startswith("call_") and cid[5:].isdigit():
        return int(cid[5:])
    return 10**6 + fallback
