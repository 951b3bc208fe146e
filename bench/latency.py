"""Injected long-tail latency for benchmarks: an Engine wrapper and an env wrapper that add
seeded lognormal delays (as *time*) around the real thing.

Owns: ``lognormal_draw`` (mean and coefficient of variation -> one seeded draw), ``LatencyEngine``
(after each real generation, sleeps ``per_token_s * L`` with L ~ lognormal(mean_tokens, cv): the
time a serving GPU would spend on an L-token reply) and ``LatencyEnv`` (before each real
``astep``, sleeps a lognormal tool latency). Every draw comes from its own RNG seeded by a stable
hash of (seed, kind, episode, turn), so two runs that play the same episodes see the same delays
whatever order the scheduler runs them in: arms of a benchmark differ only in what they compare.

Why the sleep comes *after* the real generation: the tokens are sampled (and stamped with the
policy version) at the start, as a real engine samples its first token at the start; the reply
then "takes" its long-tail time. A weight update during the sleep makes the reply older, never
newer, so the staleness the queue sees is the pessimistic one.

Identity of an episode: the engine sees the ``session`` (the episode id) of every request and
counts that session's turns. The env sees only its task seed (shared by the G samples of a
group), so a ``SampleCounter`` numbers the envs reset with the same task seed in reset order;
the episode manager starts a group's samples in index order, so that number is the sample index.

Does not: change tokens, logprobs, rewards or weights; model real contention (the real model's
own compute still runs and adds to the injected time); live in ``agentrl/`` (bench-only).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from agentrl.engine.base import Engine, Generation, SamplingParams
from agentrl.engine.wrapper import EngineWrapper
from agentrl.envs.base import AgentEnv


def seeded_rng(*key: Any) -> random.Random:
    """An RNG seeded by a stable hash of ``key`` (Python's ``hash`` of a str is salted per process)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


def lognormal_draw(mean: float, cv: float, rng: random.Random) -> float:
    """One lognormal draw with the given mean and coefficient of variation (std / mean).

    For ln X ~ N(mu, s^2): s^2 = ln(1 + cv^2), mu = ln(mean) - s^2 / 2, so E[X] = mean, CV = cv."""
    if mean < 0 or cv < 0:
        raise ValueError(f"lognormal_draw: mean and cv must be >= 0, got mean={mean!r}, cv={cv!r}")
    if mean == 0:
        return 0.0
    s2 = math.log1p(cv * cv)
    return rng.lognormvariate(math.log(mean) - s2 / 2, math.sqrt(s2))


class LatencyEngine(EngineWrapper):
    """``inner`` plus ``per_token_s * L`` seconds after each generation, L ~ lognormal(mean_tokens, cv)
    drawn for (seed, session, turn of that session). ``enabled = False`` turns the delay off (e.g.
    for evaluation). Everything else (weights, version, start/close, limits) is the inner engine's."""

    def __init__(
        self, inner: Engine, *, per_token_s: float, mean_tokens: float, cv: float = 1.0, seed: int = 0
    ) -> None:
        for name, v in (("per_token_s", per_token_s), ("mean_tokens", mean_tokens), ("cv", cv)):
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"LatencyEngine {name} must be a number >= 0, got {v!r}")
        super().__init__(inner)
        self.per_token_s, self.mean_tokens, self.cv, self.seed = per_token_s, mean_tokens, cv, seed
        self.enabled = True
        self._turns: Counter = Counter()  # session -> requests seen
        self.delays: list[float] = []  # every injected delay, seconds (for the benchmark's report)

    def delay_for(self, session: str | None, turn: int) -> float:
        """The injected seconds of ``session``'s ``turn``-th request (pure: same inputs, same value)."""
        L = lognormal_draw(self.mean_tokens, self.cv, seeded_rng(self.seed, "gen", session, turn))
        return self.per_token_s * L

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, session: str | None = None
    ) -> Generation:
        gen = await self.inner.generate(prompt_ids, params, session=session)
        if self.enabled and self.per_token_s > 0:
            turn = self._turns[session]
            self._turns[session] += 1
            d = self.delay_for(session, turn)
            self.delays.append(d)
            await asyncio.sleep(d)
        return gen


class SampleCounter:
    """Numbers the envs reset with one task seed, in reset order (0, 1, ... = the sample index)."""

    def __init__(self) -> None:
        self._seen: Counter = Counter()

    def take(self, task_seed: int | None) -> int:
        n = self._seen[task_seed]
        self._seen[task_seed] += 1
        return n


class LatencyEnv(AgentEnv):
    """``inner`` env plus a tool latency before each step: lognormal(tool_mean_s, cv) seconds drawn
    for (seed, task seed, sample index, turn). ``tool_mean_s = 0`` is the inner env unchanged."""

    def __init__(
        self,
        inner: AgentEnv,
        *,
        tool_mean_s: float,
        cv: float = 1.0,
        seed: int = 0,
        counter: SampleCounter | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(tool_mean_s, (int, float)) or tool_mean_s < 0:
            raise ValueError(f"LatencyEnv tool_mean_s must be a number >= 0, got {tool_mean_s!r}")
        if not isinstance(cv, (int, float)) or cv < 0:
            raise ValueError(f"LatencyEnv cv must be a number >= 0, got {cv!r}")
        self.inner, self.tool_mean_s, self.cv, self.seed = inner, float(tool_mean_s), float(cv), seed
        self.counter = counter or SampleCounter()
        self._key: tuple | None = None
        self._turn = 0
        self.delays: list[float] = []

    def delay_for(self, task_seed: int | None, sample: int, turn: int) -> float:
        """The injected seconds before step ``turn`` of sample ``sample`` of task ``task_seed`` (pure)."""
        return lognormal_draw(self.tool_mean_s, self.cv, seeded_rng(self.seed, "tool", task_seed, sample, turn))

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        self._key, self._turn = (seed, self.counter.take(seed)), 0
        return self.inner.reset(seed=seed, options=options)

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        self._key, self._turn = (seed, self.counter.take(seed)), 0
        return await self.inner.areset(seed=seed, options=options)

    def _next_delay(self) -> float:
        if self._key is None:
            return 0.0  # not reset: the inner env raises its own ResetNeeded
        d = self.delay_for(*self._key, self._turn)
        self._turn += 1
        self.delays.append(d)
        return d

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        time.sleep(self._next_delay())
        return self.inner.step(action)

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict]:
        await asyncio.sleep(self._next_delay())
        return await self.inner.astep(action)

    def close(self) -> None:
        self.inner.close()
