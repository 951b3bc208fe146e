"""The training batches of one ``agentrl run``, where they come from: :class:`Feed`.

Owns, for one attempt of the run: the prompt stream (``stream``: a checkpoint's positions or a fresh
one), the :class:`~agentrl.batches.staleness.StalenessQueue` (``queue``: staleness bound, groups per
step, dropped prompts back to the stream, dynamic sampling's filter, a checkpoint's finished groups
restored), the positions in flight (``in_flight``), the producer (admits a group whenever the queue
lets it, takes the next prompt position from the stream and runs its ``rollout.group_size``
episodes; a proxy-mode episode whose agent rewrote its history adds all its trajectories), the
``train.replay`` source, ``next_batch`` (the next batch from the queue or the replay; None when a
stop is requested first) and ``exactly_once`` (the state a checkpoint saves so that a resume trains
every prompt once: the stream with the groups in flight requeued, the finished-but-untrained groups).
The trainer's policy version reaches the queue through ``set_version``. Does not train
(``agentrl.jobs.run.loop``) or write checkpoints (``agentrl.jobs.run.outputs``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from agentrl.batches.samples import has_signal
from agentrl.batches.staleness import StalenessQueue
from agentrl.common.stoppable import unless_stopped
from agentrl.episodes.spec import make_specs

if TYPE_CHECKING:
    from agentrl.batches.prompt_stream import PromptStream
    from agentrl.batches.replay import ReplaySource
    from agentrl.config.schema import RunConfig
    from agentrl.episodes.source import EpisodeSource
    from agentrl.trajectory import Trajectory

#: A batch: its groups and the prompt position of each (None for a group with no position).
Batch = tuple[list[list["Trajectory"]], list]


class Feed:
    """Batches for one attempt of a run. ``stream``, ``restored`` (finished groups: (position,
    group)) and ``restored_counts`` come from the checkpoint resumed (``agentrl.jobs.run.parts``);
    ``version``: the trainer's policy version now; ``manager``: the compute's episodes; ``stop``:
    the attempt's stop event; ``replay``: ``train.replay``'s source, or None (the producer runs)."""

    def __init__(
        self,
        cfg: RunConfig,
        *,
        stream: PromptStream,
        restored: list[tuple[int | None, list[Trajectory]]],
        restored_counts: dict[str, int],
        version: int,
        manager: EpisodeSource,
        stop: asyncio.Event,
        replay: ReplaySource | None,
    ) -> None:
        self.cfg, self.manager, self.stop, self.replay = cfg, manager, stop, replay
        self.stream = stream
        self.in_flight: dict[int, int] = {}  # admission index -> position of each group being generated
        self.queue = StalenessQueue(
            cfg.train.max_staleness,
            cfg.train.groups_per_step,
            on_drop=self.stream.drop,
            keep=has_signal if cfg.algo.dynamic_sampling else None,
            max_draws=cfg.algo.max_draw_batches,
        )
        self.queue.version = version
        self.queue.restore(restored, **restored_counts)
        self.producer: asyncio.Task | None = None  # start(); None with a replay

    def start(self) -> None:
        """Start producing groups (not with a replay: its batches are recorded)."""
        if self.replay is None:
            self.producer = asyncio.create_task(self._produce())

    async def stop_producing(self) -> None:
        """Cancel the producer and wait for it (its groups in flight are cancelled)."""
        if self.producer is not None:
            self.producer.cancel()
            await asyncio.gather(self.producer, return_exceptions=True)

    async def close(self) -> None:
        """Release what the feed started: the producer (unless already stopped), then the queue."""
        if self.producer is not None and not self.producer.done():
            self.producer.cancel()
            await asyncio.gather(self.producer, return_exceptions=True)
        await self.queue.close()

    async def _produce(self) -> None:
        queue, manager, G = self.queue, self.manager, self.cfg.rollout.group_size
        running: set[asyncio.Task] = set()

        async def run_group(index: int, position: int) -> None:
            specs = make_specs(
                1, G, seed=self.cfg.rollout.seed, start=position, attempt=self.stream.drops.get(position, 0)
            )
            # run_segments: a proxy-mode episode whose agent rewrote its history yields several trajectories
            done = await asyncio.gather(*(manager.run_segments(s) for s in specs))
            group = [t for ts in done for t in ts]
            await queue.put(index, group, position)
            self.in_flight.pop(index, None)

        try:
            while True:
                index = await queue.admit()
                position = self.stream.take()
                self.in_flight[index] = position
                task = asyncio.create_task(run_group(index, position))
                running.add(task)
                task.add_done_callback(running.discard)
        finally:
            for t in running:
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def next_batch(self, step: int) -> Batch | None:
        """The batch for step ``step + 1`` and its positions, or None if a stop was requested first."""
        if self.replay is not None:
            return self.replay.batch(step + 1)
        # get_batch removes groups only when it returns: a stop that cancels it loses nothing
        done, got = await unless_stopped(self.queue.get_batch_with_positions(), self.stop)
        return got if done else None

    def filtered(self) -> list[int]:
        """Positions of the groups dynamic sampling filtered out while drawing the last batch."""
        return [p for p in self.queue.handed_filtered if p is not None] if self.replay is None else []

    def return_batch(self) -> None:
        """The last batch was not trained (a stop interrupted the step): back into the queue."""
        if self.replay is None:
            self.queue.return_batch()

    async def set_version(self, version: int) -> None:
        """The trainer's new policy version: staleness is counted from it."""
        await self.queue.set_version(version)

    def trained(self, positions: list) -> None:
        """These positions were trained (or filtered and recorded with the step)."""
        self.stream.trained(positions)

    def staleness(self) -> dict[str, Any]:
        """The step row's ``staleness`` metrics."""
        return {
            **self.queue.metrics(),
            "rerun_drops": self.stream.redrops,
            "abandoned_prompts": len(self.stream.abandoned),
        }

    def exactly_once(self) -> tuple[dict[str, Any], list]:
        """What a checkpoint saves so a resume trains each prompt once: (its ``extra`` fields
        ``data_position``, ``stream``, ``queue``; the finished-but-untrained groups, kept in
        ``rollouts.jsonl``). Groups in flight are requeued in the stream (they run again after a
        resume). Synchronous: the producer and the queue cannot move while it runs."""
        snap = self.queue.snapshot()
        kept = {p for p, _ in snap["ready"]}
        # filtered groups not yet recorded with a step run again after a resume (recorded nowhere)
        outstanding = [p for p in self.in_flight.values() if p not in kept] + snap["filtered"]
        extra = {
            "data_position": self.stream.next,
            "stream": self.stream.state(outstanding),
            "queue": {k: v for k, v in snap.items() if k not in ("ready", "filtered")},
        }
        return extra, snap["ready"]
