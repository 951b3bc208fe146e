"""The training stream's prompt positions, handed out so that each is trained exactly once.

Owns: which prompt position the producer starts next — positions given back first (a group dropped
by the staleness bound, or in flight when a checkpoint was taken), lowest first, then the counter —
and the state a checkpoint stores to resume that exactly: ``{"next": n, "requeued": [...],
"drops": {p: times}, "abandoned": [...], "redrops": n}``. Position p is the task ``make_specs(1, G, seed, start=p)``
(group id ``s{seed}-p{p}``).

A prompt the staleness bound keeps dropping (its episodes always outlast the bound, e.g. a tool that
always times out) would otherwise run for ever: ``drop(p)`` requeues it until it has been dropped
``max_drops`` times, then abandons it (never runs again; 0 = no cap).

Invariant a run keeps with it (``tests/jobs/test_resume.py`` checks it across SIGKILLs): every position
below ``next`` is trained by exactly one step in the ledger, is abandoned, or is still outstanding
(in flight, in the staleness queue's buffer, or requeued). Does not: run episodes or decide what is
stale.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any


class PromptStream:
    """``take()`` the next position, ``give_back(p)`` one that must run again, ``drop(p)`` one the
    staleness bound dropped (requeued, or abandoned past ``max_drops``)."""

    def __init__(
        self,
        next_position: int = 0,
        requeued: Iterable[int] = (),
        *,
        max_drops: int = 0,
        drops: dict | None = None,
        abandoned: Iterable[int] = (),
        redrops: int = 0,
    ) -> None:
        if next_position < 0:
            raise ValueError(f"next_position must be >= 0, got {next_position}")
        if max_drops < 0:
            raise ValueError(f"max_drops must be >= 0 (0 = no cap), got {max_drops}")
        self.next = int(next_position)
        self.max_drops = int(max_drops)
        self.drops: dict[int, int] = {int(p): int(n) for p, n in (drops or {}).items()}
        self.abandoned: list[int] = sorted(int(p) for p in abandoned)
        self.redrops = int(redrops)  # drops of a group whose prompt had been dropped before (a rerun)
        self._requeued: list[int] = []
        for p in requeued:
            self.give_back(p)

    def take(self) -> int:
        if self._requeued:
            return heapq.heappop(self._requeued)
        p = self.next
        self.next += 1
        return p

    def give_back(self, position: int) -> None:
        position = int(position)
        if not 0 <= position < self.next:
            raise ValueError(f"position {position} was never handed out (next is {self.next})")
        if position in self._requeued:
            raise ValueError(f"position {position} is already requeued")
        heapq.heappush(self._requeued, position)

    def drop(self, position: int) -> bool:
        """The staleness bound dropped ``position``'s group: requeue it (True) or, dropped
        ``max_drops`` times now, abandon it (False)."""
        position = int(position)
        n = self.drops[position] = self.drops.get(position, 0) + 1
        self.redrops += n > 1
        if self.max_drops and n >= self.max_drops:
            del self.drops[position]
            self.abandoned.append(position)
            return False
        self.give_back(position)
        return True

    def trained(self, positions: Iterable[int]) -> None:
        """Forget the drop counts of positions a step trained."""
        for p in positions:
            self.drops.pop(int(p), None)

    @property
    def requeued(self) -> list[int]:
        return sorted(self._requeued)

    def state(self, outstanding: Iterable[int] = ()) -> dict[str, Any]:
        """What a checkpoint stores; ``outstanding``: positions taken but not yet trained whose work the
        checkpoint does not keep (in flight) — they run again after a resume."""
        return {
            "next": self.next,
            "requeued": sorted({*self._requeued, *map(int, outstanding)}),
            "drops": {str(p): n for p, n in sorted(self.drops.items())},
            "abandoned": sorted(self.abandoned),
            "redrops": self.redrops,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], *, max_drops: int = 0) -> PromptStream:
        return cls(
            int(state.get("next", 0)),
            state.get("requeued", ()),
            max_drops=max_drops,
            drops=state.get("drops"),
            abandoned=state.get("abandoned", ()),
            redrops=state.get("redrops", 0),
        )
