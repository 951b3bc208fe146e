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

Dynamic sampling (DAPO; ``keep`` given): a finished group for which ``keep(group)`` is False is
*filtered* when it is put: never buffered nor trained, its admission slot freed at once (like a
dropped group's, so admission draws another prompt), its position held until the next batch is
handed out and then reported with it (``handed_filtered``; the run records those prompts in the
ledger as consumed, not trained, and they do not run again). A batch is handed out when
``groups_per_batch`` kept groups are ready, or, with ``max_draws`` > 0, once the groups filtered
since the last batch plus the ready ones reach ``max_draws * groups_per_batch``: then the batch
is short (what is ready, maybe nothing; counted in ``short_batches``). The staleness bound is
unchanged: the hand-out check drops what is too old whatever was filtered, a short batch that
trains moves the version by one, and the slots it did not fill (``short_slots``) stay charged, so
admission starts no more groups than a full batch would have let start. Groups still generating
when a short batch goes out may finish past the bound: they are dropped and rerun as usual (a
filtered prompt never is). Filtered positions not
yet reported when a checkpoint is taken are in ``snapshot()["filtered"]``: the run requeues them
(they run again after a resume, having been recorded nowhere), keeping the stream exactly once.

Exactly-once support: every group carries the prompt position it was generated for; a dropped
group's position goes to ``on_drop`` (the run gives it back to its PromptStream, so the prompt runs
again instead of being lost), ``get_batch_with_positions`` says which positions a batch holds, and
``snapshot``/``restore`` carry the finished-but-untrained groups and the counters through a
checkpoint, and ``return_batch`` puts the last batch back as if it had never been handed out (its
train step was interrupted by a stop: the checkpoint then keeps it).

Does not: run episodes, compute advantages, or know what the trainer does with a batch.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.trajectory import Trajectory


def oldest_version(traj: Trajectory) -> int | None:
    """Policy version of the oldest sampled token (None if nothing was sampled)."""
    vs = [v for v, m in zip(traj.versions, traj.loss_mask) if m]
    return min(vs) if vs else None


@dataclass(order=True)
class _Entry:
    index: int
    group: list[Trajectory] = field(compare=False)
    position: int | None = field(default=None, compare=False)


@dataclass
class _Handout:
    """What handing out one batch changed, so that ``return_batch`` can undo it."""

    batch: list[_Entry]
    filtered: list[int | None]
    short: bool
    untrained: bool
    histogram: Counter


class StalenessQueue:
    """Groups of trajectories in, batches of ``groups_per_batch`` groups out, within ``max_staleness``."""

    def __init__(
        self,
        max_staleness: int,
        groups_per_batch: int,
        on_drop: Callable[[int], object] | None = None,
        *,
        keep: Callable[[list[Trajectory]], bool] | None = None,
        max_draws: int = 0,
    ) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if groups_per_batch < 1:
            raise ValueError(f"groups_per_batch must be >= 1, got {groups_per_batch}")
        if max_draws < 0:
            raise ValueError(f"max_draws must be >= 0 (0 = no bound), got {max_draws}")
        self.keep, self.max_draws = keep, max_draws  # dynamic sampling (see the module docstring)
        self.filtered_groups = 0  # groups keep() rejected (their prompts consumed, not trained)
        self.short_batches = 0  # batches handed out with fewer than groups_per_batch groups
        self.short_slots = 0  # groups_per_batch - len(batch), summed over short batches that trained
        self.handed_filtered: list[int | None] = []  # positions filtered before the last batch handed out
        self._filtered: list[int | None] = []  # positions filtered since then
        self.k, self.B = max_staleness, groups_per_batch
        self.on_drop = on_drop  # called with the prompt position of each dropped group
        self.version = 0
        self.admitted = 0
        self.dropped_groups = 0
        self.untrained_groups = 0  # handed out in a batch with nothing trainable: no train step follows
        self.histogram: Counter = Counter()  # staleness (version at training - oldest token version) -> samples
        self._ready: list[_Entry] = []
        self._handout: _Handout | None = None  # the last batch handed out
        self._cond = asyncio.Condition()
        self._closed = False

    # -- producer side -------------------------------------------------------------------------
    def can_admit(self) -> bool:
        # a dropped group will never be trained: its slot goes back to the producer (else a drop
        # would leave the trainer waiting for a batch that admission control never lets start).
        # Likewise a batch in which every episode failed: the trainer takes no step, so the
        # version does not move, and without its slots back admission would stop for good.
        # Filtered groups give their slot back the same way; a short batch that trained moved the
        # version by one without using all of its B slots, and the unused ones stay charged.
        done = self.dropped_groups + self.untrained_groups + self.filtered_groups - self.short_slots
        return self.admitted - done < (self.version + self.k + 1) * self.B

    async def admit(self) -> int:
        """Wait until one more group may start; returns its admission index."""
        async with self._cond:
            await self._cond.wait_for(lambda: self._closed or self.can_admit())
            if self._closed:
                raise asyncio.CancelledError("staleness queue closed")
            index = self.admitted
            self.admitted += 1
            return index

    async def put(self, index: int, group: list[Trajectory], position: int | None = None) -> None:
        """Hand in the finished group admitted as ``index`` (possibly empty if all failed), generated
        for prompt ``position``; with ``keep``, a group it rejects is filtered instead."""
        async with self._cond:
            if self.keep is not None and not self.keep(group):
                self.filtered_groups += 1
                self._filtered.append(position)
                self._cond.notify_all()  # a freed admission slot, and maybe the draw bound reached
                return
            self._ready.append(_Entry(index, group, position))
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
        return (await self.get_batch_with_positions())[0]

    def _drop_stale(self) -> None:
        kept, stale = [], []
        for e in self._ready:
            (kept if self._fresh(e.group) else stale).append(e)
        self._ready = kept
        if stale:
            self.dropped_groups += len(stale)
            self._cond.notify_all()  # freed admission slots
            for e in stale:
                if e.position is not None and self.on_drop is not None:
                    self.on_drop(e.position)

    async def get_batch_with_positions(self) -> tuple[list[list[Trajectory]], list[int | None]]:
        """``get_batch`` plus the prompt position of each group."""
        async with self._cond:
            while True:
                self._drop_stale()
                if len(self._ready) >= self.B or self._draws_spent():
                    batch, self._ready = self._ready[: self.B], self._ready[self.B :]
                    self.handed_filtered, self._filtered = self._filtered, []
                    short = len(batch) < self.B
                    self.short_batches += short
                    untrained = not any(t.trainable and t.num_sampled > 0 for e in batch for t in e.group)
                    if untrained:
                        self.untrained_groups += len(batch)  # as samples.trainable: no sample, no step
                        self._cond.notify_all()
                    else:
                        self.short_slots += self.B - len(batch)
                    seen = Counter(
                        self.version - v for e in batch for v in map(oldest_version, e.group) if v is not None
                    )
                    self.histogram.update(seen)
                    self._handout = _Handout(batch, self.handed_filtered, short, untrained, seen)
                    return [e.group for e in batch], [e.position for e in batch]
                if self._closed:
                    raise asyncio.CancelledError("staleness queue closed")
                await self._cond.wait()

    def return_batch(self) -> None:
        """Undo the last hand-out: its groups are ready again (oldest admission first, before any
        newer), its filtered positions pending again, its counters and histogram entries taken
        back. For a batch whose train step never happened (interrupted by a stop) and before the
        version moves; a checkpoint taken next keeps the groups. Synchronous, like ``snapshot``."""
        h, self._handout = self._handout, None
        if h is None:
            raise RuntimeError("return_batch: no batch was handed out since the last return or version")
        self._ready = sorted(h.batch + self._ready)
        self._filtered = h.filtered + self._filtered
        self.handed_filtered = []
        self.short_batches -= h.short
        if h.untrained:
            self.untrained_groups -= len(h.batch)
        else:
            self.short_slots -= self.B - len(h.batch)
        self.histogram.subtract(h.histogram)
        self.histogram += Counter()  # drop the zero counts

    def _draws_spent(self) -> bool:
        """Dynamic sampling drew ``max_draws`` batches' worth of groups for this batch."""
        return bool(
            self.keep is not None
            and self.max_draws
            and len(self._filtered) + len(self._ready) >= self.max_draws * self.B
        )

    async def set_version(self, version: int) -> None:
        """The trainer finished a step and the engine serves ``version``: admit more."""
        async with self._cond:
            self.version = version
            self._handout = None  # a trained batch is not given back
            self._cond.notify_all()

    async def close(self) -> None:
        async with self._cond:
            self._closed = True
            self._cond.notify_all()

    def snapshot(self) -> dict[str, Any]:
        """What a checkpoint keeps: the finished-but-untrained groups (oldest admission first) with
        their positions, the filtered positions not yet reported with a batch (``filtered``: the
        run requeues them; ``filtered_groups`` leaves them out) and the counters that ``restore``
        takes. Synchronous: take it with no await in between the snapshot and the other state saved
        with it."""
        return {
            "ready": [(e.position, e.group) for e in self._ready],
            "filtered": [p for p in self._filtered if p is not None],
            "dropped_groups": self.dropped_groups,
            "untrained_groups": self.untrained_groups,
            "filtered_groups": self.filtered_groups - len(self._filtered),
            "short_slots": self.short_slots,
            "short_batches": self.short_batches,
        }

    def restore(
        self,
        ready: list[tuple[int | None, list[Trajectory]]],
        dropped_groups: int = 0,
        untrained_groups: int = 0,
        filtered_groups: int = 0,
        short_slots: int = 0,
        short_batches: int = 0,
    ) -> None:
        """Resume: ``version`` already set; put back the snapshot's finished groups as admitted
        before everything the producer admits next. Admission counts them as outstanding."""
        self.dropped_groups, self.untrained_groups = int(dropped_groups), int(untrained_groups)
        self.filtered_groups, self.short_slots = int(filtered_groups), int(short_slots)
        self.short_batches = int(short_batches)
        self._ready = [_Entry(i - len(ready), g, p) for i, (p, g) in enumerate(ready)]
        self.admitted = (
            self.version * self.B
            - self.short_slots
            + len(ready)
            + self.dropped_groups
            + self.untrained_groups
            + self.filtered_groups
        )

    def metrics(self) -> dict:
        total = sum(self.histogram.values())
        return {
            "staleness_mean": (sum(k * v for k, v in self.histogram.items()) / total) if total else 0.0,
            "staleness_max": max(self.histogram, default=0),
            "staleness_hist": {str(k): v for k, v in sorted(self.histogram.items())},
            "dropped_groups": self.dropped_groups,
            "untrained_groups": self.untrained_groups,
            **(
                {"filtered_groups": self.filtered_groups, "short_batches": self.short_batches}
                if self.keep is not None
                else {}
            ),
            "buffered_groups": len(self._ready),
            "admitted_groups": self.admitted,
        }


def dynamic_sampling_metrics(kept: int, filtered: int, groups_per_batch: int) -> dict[str, float]:
    """One step's dynamic-sampling metrics (logged under ``dapo/``): ``filtered_groups`` of the
    ``drawn_groups`` (kept + filtered) for its batch, their ratio, and ``short_step`` (1 when the
    batch had fewer than ``groups_per_batch`` groups: the draw bound was reached)."""
    drawn = kept + filtered
    return {
        "filtered_groups": filtered,
        "drawn_groups": drawn,
        "filtered_frac": filtered / drawn if drawn else 0.0,
        "short_step": int(kept < groups_per_batch),
    }


def dump_ready(ready: list[tuple[int | None, list[Trajectory]]]) -> str:
    """``snapshot()["ready"]`` as JSONL text (one group per line, with its position) for a checkpoint."""
    return "".join(json.dumps({"position": p, "group": [t.to_dict() for t in g]}) + "\n" for p, g in ready)


def load_ready(path: str | Path) -> list[tuple[int | None, list[Trajectory]]]:
    """Read ``dump_ready``'s file back (absent, as in checkpoints older than this format: no groups)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        out.append((d["position"], [Trajectory.from_dict(t) for t in d["group"]]))
    return out
