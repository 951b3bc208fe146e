"""The training stream's prompt positions, handed out so that each is trained exactly once.

Owns: which prompt position the producer starts next — positions given back first (a group dropped
by the staleness bound, or in flight when a checkpoint was taken), lowest first, then the counter —
and the state a checkpoint stores to resume that exactly: ``{"next": n, "requeued": [...]}``.
Position p is the task ``make_specs(1, G, seed, start=p)`` (group id ``s{seed}-p{p}``).

Invariant a run keeps with it (``tests/test_resume.py`` checks it across SIGKILLs): every position
below ``next`` is trained by exactly one step in the ledger, or is still outstanding (in flight, in
the staleness queue's buffer, or requeued). Does not: run episodes or decide what is stale.
"""
from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any


class PromptStream:
    """``take()`` the next position, ``give_back(p)`` one that must run again."""

    def __init__(self, next_position: int = 0, requeued: Iterable[int] = ()) -> None:
        if next_position < 0:
            raise ValueError(f"next_position must be >= 0, got {next_position}")
        self.next = int(next_position)
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

    @property
    def requeued(self) -> list[int]:
        return sorted(self._requeued)

    def state(self, outstanding: Iterable[int] = ()) -> dict[str, Any]:
        """What a checkpoint stores; ``outstanding``: positions taken but not yet trained whose work the
        checkpoint does not keep (in flight) — they run again after a resume."""
        return {"next": self.next, "requeued": sorted({*self._requeued, *map(int, outstanding)})}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> PromptStream:
        return cls(int(state.get("next", 0)), state.get("requeued", ()))
