"""Stitching an outside agent's completions into token-exact trajectory segments (pure).

Owns: :class:`Segment` (the token buffers of one trajectory: prompt, then per completion the
mask-0 context the request added and the sampled ids with their behaviour logprobs and policy
versions), :class:`Recorder` (one episode's segments: a completion whose prompt ids extend the
current segment's ids continues it; any other prompt — the agent rewrote or dropped history —
closes it and starts a new one), and the message-level check (:func:`covered`) the proxy uses to
build an extending prompt from render deltas instead of re-tokenizing sampled turns.

Does not: render chats, sample, speak HTTP or decide outcomes and rewards (:mod:`agentrl.agents.proxy`,
:mod:`agentrl.agents.strategy`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agentrl.trajectory import TurnRecord


@dataclass
class Segment:
    """One trajectory's token buffers, the attributes the episode manager copies into a Trajectory."""

    prompt_len: int
    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    turn_ids: list[int]
    versions: list[int]
    turns: list[TurnRecord] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)  # the last request's tool schemas

    @classmethod
    def start(cls, prompt: list[int]) -> Segment:
        n = len(prompt)
        return cls(n, list(prompt), [0] * n, [0.0] * n, [-1] * n, [-1] * n)

    def add_context(self, ids: list[int]) -> None:
        """Mask-0 ids the request added after the last completion; they are that turn's observation."""
        self.ids.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.turn_ids.extend([self.turns[-1].index] * len(ids))
        self.versions.extend([-1] * len(ids))
        self.turns[-1].n_observation += len(ids)

    def add_sampled(
        self, ids: list[int], logprobs: list[float], versions: list[int], finish: str, gen_s: float
    ) -> None:
        turn = len(self.turns)
        self.turns.append(
            TurnRecord(
                index=turn, start=len(self.ids), n_sampled=len(ids), n_observation=0, finish_reason=finish, gen_s=gen_s
            )
        )
        self.ids.extend(ids)
        self.mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs)
        self.turn_ids.extend([turn] * len(ids))
        self.versions.extend(versions)


def extends(prefix: list[int], ids: list[int]) -> bool:
    """True when ``ids`` starts with all of ``prefix``."""
    return len(ids) >= len(prefix) and ids[: len(prefix)] == prefix


class Recorder:
    """The segments of one episode, in order; the last one is the current one."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self.requests = 0

    @property
    def current(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    def record(
        self,
        prompt: list[int],
        sampled: list[int],
        logprobs: list[float],
        versions: list[int],
        finish: str,
        *,
        gen_s: float = 0.0,
        messages: list[dict] | None = None,
        reply: dict | None = None,
        tools: list[dict] | None = None,
    ) -> str:
        """Record one completion -> ``"first"``, ``"extend"`` (the prompt extended the current segment:
        the new part is mask-0 context) or ``"split"`` (it did not: a new segment starts)."""
        if not (len(sampled) == len(logprobs) == len(versions)):
            raise ValueError(f"{len(sampled)} sampled ids, {len(logprobs)} logprobs and {len(versions)} versions")
        seg = self.current
        if seg is not None and extends(seg.ids, prompt):
            seg.add_context(prompt[len(seg.ids) :])
            kind = "extend"
        else:
            kind = "split" if seg is not None else "first"
            seg = Segment.start(prompt)
            self.segments.append(seg)
        seg.add_sampled(list(sampled), list(logprobs), list(versions), finish, gen_s)
        if messages is not None:
            seg.messages = [*messages, *([reply] if reply is not None else [])]
            seg.tools = list(tools or [])
        self.requests += 1
        return kind

    def set_reward(self, reward: float) -> None:
        """Every segment's last turn carries the episode's reward (its return, as the built-in loop's)."""
        for seg in self.segments:
            if seg.turns:
                seg.turns[-1].reward = float(reward)


# ------------------------------------------------------------------ message-level matching
def _content(value: Any) -> Any:
    if isinstance(value, list):  # OpenAI content parts: their texts, joined (others kept as they are)
        if all(isinstance(p, dict) and p.get("type") == "text" for p in value):
            value = "".join(str(p.get("text", "")) for p in value)
    # stripped: a streamed reply's text keeps the white space before a tool call that the whole
    # reply's content drops; either way the sampled ids, not this text, continue the trajectory
    return value.strip() if isinstance(value, str) else value or ""


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def message_key(m: dict) -> str:
    """What a chat template sees of an OpenAI message, as a comparable string: role, content (None,
    "" and text parts alike, white space at either end ignored), tool calls by name and parsed
    arguments (call ids and client extras such as ``refusal`` ignored), tool_call_id and name."""
    calls = [
        ((c.get("function") or {}).get("name"), _arguments((c.get("function") or {}).get("arguments")))
        for c in (m.get("tool_calls") or [])
        if isinstance(c, dict)
    ]
    key = {
        "role": m.get("role"),
        "content": _content(m.get("content")),
        "calls": calls,
        "name": m.get("name"),
        "tool_call_id": m.get("tool_call_id") if m.get("role") == "tool" else None,
    }
    return json.dumps(key, sort_keys=True, default=str)


def covered(history: list[dict], messages: list[dict]) -> int | None:
    """``len(history)`` when ``messages`` starts with ``history`` message by message (``message_key``),
    else None. ``history`` is a segment's last request plus the reply it got."""
    if not history or len(messages) < len(history):
        return None
    for a, b in zip(history, messages):
        if message_key(a) != message_key(b):
            return None
    return len(history)
