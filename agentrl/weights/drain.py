"""Drained weight updates: every turn sampled by one policy version (``rollout.partial_rollouts=false``).

Owns :class:`DrainEngine`, an Engine that wraps any other Engine (local, SGLang, Ray, fake) and gates
its ``generate``; :func:`weight_update_gate`, the context the runner holds around a weight push; and
:func:`drained_together`, one drain over several gates (engines in other processes: Ray workers).

Two ways a weight update can meet generations in flight:

- partial rollouts (``partial_rollouts=true``, the default; no wrapper): the update interrupts them,
  swaps the weights and they resume under the new version. One turn may then hold tokens of two
  versions; per-token versions record it and the staleness bound uses the oldest token.
- drained (``partial_rollouts=false``, this module): ``async with engine.drained():`` first closes
  the gate (new ``generate`` calls wait), then waits until every generation already in flight has
  finished, then runs its body (the push) and reopens the gate: the held calls run under the new
  weights. Every turn comes from one version; the price is the wait for the longest turn in flight
  (``drain_stats["drain_wait_s"]``). Held time counts against the caller's own deadlines (the episode
  manager's turn deadline), as any engine latency does.

Guarantees: a generate cancelled while held or in flight never leaks a count (the bookkeeping has
no await between check and update: one event loop, no lock); errors of the inner engine and of the
drained body propagate unchanged and the gate always reopens; ``close()`` fails held callers with
EngineError. Everything not part of the Engine seam (``pause``, ``post_all``, ``urls``...) is
forwarded to the inner engine (:class:`~agentrl.engine.wrapper.EngineWrapper` does), so weight
syncs built on the wrapper work unchanged.

Does not: move weights (the WeightSync paths, ``agentrl.weights.base``), decide when to sync (the
runner), bound how long a drain may wait (the inner engine's request timeouts and the turn deadline
do), or coordinate several event loops: all calls must come from one loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

from agentrl.engine.base import Engine, Generation, SamplingParams
from agentrl.engine.wrapper import EngineWrapper
from agentrl.errors import EngineError


class DrainEngine(EngineWrapper):
    """``inner`` with a gate in front of ``generate``; see the module docstring."""

    def __init__(self, inner: Engine) -> None:
        if not isinstance(inner, Engine):
            raise TypeError(f"DrainEngine wraps an Engine, got {type(inner).__name__}")
        super().__init__(inner)
        self._in_flight = 0
        self._held = 0
        self._open = asyncio.Event()  # set: generate may start
        self._open.set()
        self._idle = asyncio.Event()  # set: no generate in flight
        self._idle.set()
        self._drain_lock = asyncio.Lock()  # one drain at a time
        self._closed = False
        #: drains done, seconds spent waiting for in-flight generations, calls that had to wait
        self.drain_stats = {"drains": 0, "drain_wait_s": 0.0, "last_drain_wait_s": 0.0, "held_calls": 0}

    # --- the Engine seam (policy_version, max_context, start and the rest forwarded) --------------
    @property
    def in_flight(self) -> int:
        """Generations running in the inner engine now."""
        return self._in_flight

    @property
    def held(self) -> int:
        """Generate calls waiting for a drained update to finish."""
        return self._held

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, session: str | None = None
    ) -> Generation:
        if not self._open.is_set():
            self._held += 1
            self.drain_stats["held_calls"] += 1
            try:
                while not self._open.is_set():
                    await self._open.wait()
            finally:
                self._held -= 1
        if self._closed:
            raise EngineError("the engine was closed while this generation waited for a weight update")
        self._in_flight += 1  # no await since the gate check: nothing can close it in between
        self._idle.clear()
        try:
            return await self.inner.generate(prompt_ids, params, session=session)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Load weights with nothing in flight: inside :meth:`drained` it waits for idle (already
        reached there) and delegates; outside it drains around the update itself."""
        if self._open.is_set():
            async with self.drained():
                await self.inner.update_weights(state_dict, version)
        else:
            await self._idle.wait()
            await self.inner.update_weights(state_dict, version)

    async def close(self) -> None:
        """Fail held callers with EngineError, then close the inner engine (which fails the calls
        in flight, per the Engine contract)."""
        self._closed = True
        self._open.set()  # wake the held callers; they see _closed and raise
        await self.inner.close()

    # --- the gate -------------------------------------------------------------------------------
    async def hold(self) -> float:
        """Close the gate and wait until no generation is in flight; seconds waited. Pair with
        :meth:`release` (they may be called by different tasks, e.g. two actor calls). Cancelled
        while waiting: the gate reopens."""
        await self._drain_lock.acquire()
        try:
            if self._closed:
                raise EngineError("the engine is closed: no weight update to drain for")
            self._open.clear()
            t0 = time.perf_counter()
            await self._idle.wait()
        except BaseException:
            self._open.set()
            self._drain_lock.release()
            raise
        waited = time.perf_counter() - t0
        self.drain_stats["drains"] += 1
        self.drain_stats["drain_wait_s"] += waited
        self.drain_stats["last_drain_wait_s"] = waited
        return waited

    def release(self) -> None:
        """Reopen the gate after :meth:`hold`: the held calls run (under the new weights)."""
        if not self._drain_lock.locked():
            raise RuntimeError("DrainEngine.release() without a hold()")
        self._open.set()
        self._drain_lock.release()

    @contextlib.asynccontextmanager
    async def drained(self) -> AsyncIterator[float]:
        """Hold new generations, wait for those in flight, run the body, release the held ones.
        Yields the seconds waited. Cancelling or an error anywhere reopens the gate; errors propagate."""
        waited = await self.hold()
        try:
            yield waited
        finally:
            self.release()


def with_partial_rollouts(engine: Engine, partial_rollouts: bool) -> Engine:
    """The engine the run uses: ``engine`` itself when updates may interrupt generations
    (``partial_rollouts=true``), else wrapped in a :class:`DrainEngine`."""
    return engine if partial_rollouts else DrainEngine(engine)


def weight_update_gate(engine: Engine, remote: Sequence[Gate] = ()) -> contextlib.AbstractAsyncContextManager:
    """What to hold around a weight push: ``engine.drained()`` for a DrainEngine, else nothing
    (the push interrupts generations and they resume: partial rollouts). ``remote``: the gates of
    other processes whose generations do not pass ``engine`` (Ray rollout workers), drained together
    with it. Yields the seconds spent waiting for generations in flight (0.0 for nothing)."""
    if remote:
        return drained_together([engine, *remote] if isinstance(engine, DrainEngine) else list(remote))
    return engine.drained() if isinstance(engine, DrainEngine) else contextlib.nullcontext(0.0)


class Gate(Protocol):
    """Something that can hold and release generation: a DrainEngine, or a driver-side face of one
    in another process (e.g. a Ray rollout worker's ``hold``/``release`` actor methods). A hold
    that is cancelled must leave its gate open (DrainEngine.hold does; a remote face must release
    a hold that completes after its caller gave up)."""

    def hold(self) -> Any: ...  # awaitable; done when nothing is in flight behind this gate

    def release(self) -> Any: ...  # None or an awaitable


@contextlib.asynccontextmanager
async def drained_together(gates: Sequence[Gate]) -> AsyncIterator[float]:
    """Hold every gate (concurrently), run the body, release them all: the drain for generations
    spread over several engines or processes. Yields the seconds the holds took. If a hold fails or
    the caller is cancelled, the gates already held are released and the error propagates."""
    t0 = time.perf_counter()
    holds = [asyncio.ensure_future(g.hold()) for g in gates]
    try:
        if holds:
            await asyncio.gather(*holds)
        yield time.perf_counter() - t0
    finally:
        for h in holds:
            h.cancel()  # no-op on finished ones
        if holds:
            await asyncio.wait(holds)
        releases = [g.release() for g, h in zip(gates, holds) if not h.cancelled() and h.exception() is None]
        errors = [
            r
            for r in await asyncio.gather(*(r for r in releases if inspect.isawaitable(r)), return_exceptions=True)
            if isinstance(r, BaseException)
        ]
        if errors:
            raise EngineError(f"releasing {len(errors)} of {len(gates)} drained engines failed: {errors[0]!r}")
