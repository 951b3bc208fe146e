"""The bounded-staleness queue between rollouts and training.

Owns: admission control (generation may not start a group that could not be trained within the
bound), the buffer of finished groups, the hard per-sample bound at hand-out time
(``version_now - oldest sampled token's version <= k``; a violating group is dropped and counted),
and the staleness histogram. ``max_staleness=0`` is plain synchronous on-policy training: one
batch is generated, trained on, the weights synced, then the next batch is admitted.

Admission rule: with B groups per train step and the trainer at version t (t steps done), the
n-th admitted group (0-based) may start only if ``n - dropped < (t + k + 1) * B``. Groups handed out oldest
admission first therefore train at a version <= admission version + k, so drops only happen when
a group finishes out of order by more than the bound allows (or tokens were sampled by an older
engine version than the one current at admission).

Does not: run episodes, compute advantages, or know what the trainer does with a batch.
"""
from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from agentrl.trajectory import Trajectory


def oldest_version(traj: Trajectory) -> int | None:
    """Policy version of the oldest sampled token (None if nothing was sampled)."""
    vs = [v for v, m in zip(traj.versions, traj.loss_mask) if m]
    return min(vs) if vs else None


@dataclass(order=True)
class _Entry:
    index: int
    group: list[Trajectory] = field(compare=False)


class StalenessQueue:
    """Groups of trajectories in, batches of ``groups_per_batch`` groups out, within ``max_staleness``."""

    def __init__(self, max_staleness: int, groups_per_batch: int) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if groups_per_batch < 1:
            raise ValueError(f"groups_per_batch must be >= 1, got {groups_per_batch}")
        self.k, self.B = max_staleness, groups_per_batch
        self.version = 0
        self.admitted = 0
        self.dropped_groups = 0
        self.untrained_groups = 0  # handed out in a batch with nothing trainable: no train step follows
        self.histogram: Counter = Counter()  # staleness (version at training - oldest token version) -> samples
        self._ready: list[_Entry] = []
        self._cond = asyncio.Condition()
        self._closed = False

    # -- producer side -------------------------------------------------------------------------
    def can_admit(self) -> bool:
        # a dropped group will never be trained: its slot goes back to the producer (else a drop
        # would leave the trainer waiting for a batch that admission control never lets start).
        # Likewise a batch in which every episode failed: the trainer takes no step, so the
        # version does not move, and without its slots back admission would stop for good.
        return self.admitted - self.dropped_groups - self.untrained_groups < (self.version + self.k + 1) * self.B

    async def admit(self) -> int:
        """Wait until one more group may start; returns its admission index."""
        async with self._cond:
            await self._cond.wait_for(lambda: self._closed or self.can_admit())
            if self._closed:
                raise asyncio.CancelledError("staleness queue closed")
            index = self.admitted
            self.admitted += 1
            return index

    async def put(self, index: int, group: list[Trajectory]) -> None:
        """Hand in the finished group admitted as ``index`` (possibly empty if all failed)."""
        async with self._cond:
            self._ready.append(_Entry(index, group))
            self._ready.sort()
            self._cond.notify_all()

    # -- trainer side --------------------------------------------------------------------------
    def _fresh(self, group: list[Trajectory]) -> bool:
        for t in group:
            v = oldest_version(t)
            if v is not None and self.version - v > self.k:
                return False
        return True

    async def get_batch(self) -> list[list[Trajectory]]:
        """Wait for ``groups_per_batch`` groups that satisfy the bound at the current version;
        stale groups are dropped (counted in ``dropped_groups``)."""
        async with self._cond:
            while True:
                kept = [e for e in self._ready if self._fresh(e.group)]
                if len(kept) < len(self._ready):
                    self.dropped_groups += len(self._ready) - len(kept)
                    self._cond.notify_all()  # freed admission slots
                self._ready = kept
                if len(self._ready) >= self.B:
                    batch, self._ready = self._ready[: self.B], self._ready[self.B :]
                    if not any(t.trainable and t.num_sampled > 0 for e in batch for t in e.group):
                        self.untrained_groups += self.B  # as credit_assign.trainable: no sample, no step
                        self._cond.notify_all()
                    for e in batch:
                        for t in e.group:
                            v = oldest_version(t)
                            if v is not None:
                                self.histogram[self.version - v] += 1
                    return [e.group for e in batch]
                if self._closed:
                    raise asyncio.CancelledError("staleness queue closed")
                await self._cond.wait()

    async def set_version(self, version: int) -> None:
        """The trainer finished a step and the engine serves ``version``: admit more."""
        async with self._cond:
            self.version = version
            self._cond.notify_all()

    async def close(self) -> None:
        async with self._cond:
            self._closed = True
            self._cond.notify_all()

    def metrics(self) -> dict:
        total = sum(self.histogram.values())
        return {
            "staleness_mean": (sum(k * v for k, v in self.histogram.items()) / total) if total else 0.0,
            "staleness_max": max(self.histogram, default=0),
            "staleness_hist": {str(k): v for k, v in sorted(self.histogram.items())},
            "dropped_groups": self.dropped_groups,
            "untrained_groups": self.untrained_groups,
            "buffered_groups": len(self._ready),
            "admitted_groups": self.admitted,
        }
