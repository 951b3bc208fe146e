"""Slots: how many sandboxed programs run at once, and what waiting for a slot costs.

Owns: ``Slots`` (a bound on concurrent programs, one semaphore per event loop, shared by every run
and session of a sandbox), the record of how long each call waited for a slot
(``take_queue_waits``, for the ``sandbox/queue_s`` metric), the context-local ``WaitClock`` a
caller opens to learn how much of a call's time was queueing (so a tool's deadline can count only
the program's running time), and the saturation signal that holds back new episodes
(``admission``: backpressure instead of tool calls timing out in the queue).

Does not: run anything, or decide what a deadline is (``agentrl.envs.base.ToolEnv`` subtracts the
queue time from its tool deadline; the turn deadline bounds the whole wait). The record is per
process: Ray rollout workers each keep their own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import math
import time
import weakref
from collections.abc import AsyncIterator


class WaitClock:
    """Seconds the calls made under it (in this context and the tasks it starts) spent waiting for
    a sandbox slot; overlapping waits of parallel calls count once."""

    def __init__(self) -> None:
        self._waited = 0.0
        self._since = 0.0
        self._n = 0

    def _begin(self) -> None:
        if self._n == 0:
            self._since = time.perf_counter()
        self._n += 1

    def _end(self) -> None:
        self._n -= 1
        if self._n == 0:
            self._waited += time.perf_counter() - self._since

    def waited(self) -> float:
        """Queue seconds so far, a wait in progress included."""
        return self._waited + (time.perf_counter() - self._since if self._n else 0.0)


WAIT_CLOCK: contextvars.ContextVar[WaitClock | None] = contextvars.ContextVar("agentrl_wait_clock", default=None)
_WAITS: collections.deque = collections.deque(maxlen=1 << 16)
_ALL: weakref.WeakSet[Slots] = weakref.WeakSet()
_ADMISSION_POLL_S = 0.02


class Slots:
    """At most ``capacity`` holders at once per event loop (asyncio primitives bind to the loop
    that first waits on them, and one sandbox serves a sync env's private loop and the trainer's)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {capacity!r}")
        self.capacity = capacity
        self.waiting = 0  # calls waiting for a slot now, over every loop
        self._sems: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Semaphore]] = {}
        _ALL.add(self)

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        entry = self._sems.get(id(loop))
        if entry is None or entry[0] is not loop:
            self._sems = {k: v for k, v in self._sems.items() if not v[0].is_closed()}
            entry = self._sems[id(loop)] = (loop, asyncio.Semaphore(self.capacity))
        return entry[1]

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Hold one slot for the body; the wait for it is recorded and shown to the WaitClock."""
        sem = self._semaphore()
        if not sem.locked():  # the common case: no wait, nothing to record but a zero
            await sem.acquire()
            _WAITS.append(0.0)
        else:
            clock = WAIT_CLOCK.get()
            t0 = time.perf_counter()
            self.waiting += 1
            if clock is not None:
                clock._begin()
            try:
                await sem.acquire()
            finally:
                self.waiting -= 1
                if clock is not None:
                    clock._end()
                _WAITS.append(time.perf_counter() - t0)
        try:
            yield
        finally:
            sem.release()

    @property
    def saturated(self) -> bool:
        """More calls wait than can run at once: a new episode would only lengthen the queue."""
        return self.waiting > self.capacity


def queue_summary(waits: list[float]) -> dict[str, float]:
    """``{"queue_s_p50", "queue_s_p99", "queue_calls"}`` of slot waits (seconds): the nearest-rank
    percentiles; zeros for no calls."""
    xs = sorted(waits)
    if not xs:
        return {"queue_s_p50": 0.0, "queue_s_p99": 0.0, "queue_calls": 0}

    def rank(q: float) -> float:
        return xs[max(0, math.ceil(round(q * len(xs), 9)) - 1)]

    return {"queue_s_p50": rank(0.50), "queue_s_p99": rank(0.99), "queue_calls": len(xs)}


def take_queue_waits() -> list[float]:
    """The slot waits (seconds) recorded since the last call, and forget them."""
    out = list(_WAITS)
    _WAITS.clear()
    return out


async def admission() -> None:
    """Return when no sandbox of this process is saturated (immediately in the common case)."""
    while any(s.saturated for s in list(_ALL)):
        await asyncio.sleep(_ADMISSION_POLL_S)
