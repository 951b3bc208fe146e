"""FakeEngine: a scripted stand-in for a real engine, for unit tests and benchmarks of other parts.

A *policy* function decides what the "model" samples: ``policy(prompt_ids, params, ctx) -> ids``
(or raises). The engine applies max_new_tokens and stop ids exactly as a real engine would,
returns deterministic fake logprobs, and stamps versions. It never stands in for the real engine
in tests that claim to test an engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.engine.base import Engine, Generation, SamplingParams
from agentrl.errors import EngineError


@dataclass
class FakeContext:
    """Per-call information handed to a FakeEngine policy."""

    call_index: int
    state: dict = field(default_factory=dict)  # shared across calls, for stateful scripts
    session: str | None = None  # the caller's session (the episode manager passes the episode id)


Policy = Callable[[Sequence[int], SamplingParams, FakeContext], Sequence[int]]


class FakeEngine(Engine):
    """Scripted engine. ``delay_s`` (a float or a callable of the context) simulates latency.

    finish_reason is "stop" when a stop id was produced (and kept), else "length": a script that
    returns ids without a stop id behaves as if the engine ran out of new tokens."""

    def __init__(
        self,
        policy: Policy,
        *,
        delay_s: float | Callable[[FakeContext], float] = 0.0,
        logprob: float = -0.5,
        max_context: int | None = None,
    ) -> None:
        self.policy = policy
        self.delay_s = delay_s
        self.logprob = logprob
        self._max_context = max_context
        self.calls = 0
        self.state: dict = {}
        self.loaded: list[int] = []

    @property
    def max_context(self) -> int | None:
        return self._max_context

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, session: str | None = None
    ) -> Generation:
        ctx = FakeContext(self.calls, self.state, session)
        self.calls += 1
        if self._max_context is not None and len(prompt_ids) >= self._max_context:
            raise EngineError(f"prompt of {len(prompt_ids)} tokens exceeds max_context {self._max_context}")
        delay = self.delay_s(ctx) if callable(self.delay_s) else self.delay_s
        # always a suspension point, as with any real engine: "instant" still lets other episodes run
        await asyncio.sleep(delay if delay > 0 else 0)
        out = list(self.policy(prompt_ids, params, ctx))
        stops = set(params.stop_token_ids)
        finish = "length"
        for i, t in enumerate(out):
            if t in stops:
                out, finish = out[: i + 1], "stop"
                break
        if len(out) > params.max_new_tokens:
            # a real engine would have stopped at the limit, before any later stop id
            out, finish = out[: params.max_new_tokens], "length"
        version = self.policy_version
        return Generation(out, [self.logprob] * len(out), finish, [version] * len(out))

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        self.loaded.append(version)
        self.policy_version = version
