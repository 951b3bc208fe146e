"""CPU cores shared by the threads of one process that compute with torch: the in-process engine and the trainer.

Torch gives every thread that computes its own OpenMP team, sized by ``torch.set_num_threads`` *called in that
thread*. When the engine and the trainer compute at once, each should have its share (``shared`` threads); when
one computes alone (an evaluation, the trainer waiting for rollouts, the engine idle at the staleness bound) it
should have every core (``alone``). :class:`CoreShare` keeps who is computing; each party calls
:meth:`CoreShare.apply` in its own thread before a unit of work (a decode step, a micro-batch), which resizes
that thread's team when the answer changed since its last call.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["CoreShare"]


class CoreShare:
    """Threads for each party: ``alone`` while no other party computes, ``shared`` otherwise."""

    def __init__(self, shared: int, alone: int) -> None:
        if not 1 <= shared <= alone:
            raise ValueError(f"need 1 <= shared <= alone threads, got shared={shared}, alone={alone}")
        self.shared, self.alone = shared, alone
        self._lock = threading.Lock()
        self._busy: set[str] = set()
        self._mine = threading.local()  # the team size this thread last set
        #: times a thread's team was resized (for tests and metrics)
        self.resizes = 0

    def busy(self, party: str, on: bool) -> None:
        """Mark ``party`` as computing (``on``) or idle."""
        with self._lock:
            (self._busy.add if on else self._busy.discard)(party)

    @contextmanager
    def computing(self, party: str) -> Iterator[None]:
        """``party`` computes inside the block."""
        self.busy(party, True)
        try:
            yield
        finally:
            self.busy(party, False)

    def threads(self, party: str) -> int:
        """What ``party`` should use now."""
        with self._lock:
            return self.shared if self._busy - {party} else self.alone

    def apply(self, party: str) -> int:
        """Size the calling thread's torch team for ``party`` now; returns the size."""
        n = self.threads(party)
        if getattr(self._mine, "n", None) != n:
            import torch  # lazy: the seam itself needs no torch (tests of the bookkeeping, the plan)

            torch.get_num_threads()  # first use in this thread: torch's lazy per-thread setup runs now, not later
            torch.set_num_threads(n)
            self._mine.n = n
            with self._lock:  # two parties may resize at once
                self.resizes += 1
        return n
