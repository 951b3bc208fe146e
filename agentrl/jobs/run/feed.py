"""The training batches of one ``agentrl run``: where they come from (a mixin of ``Runner``).

Owns: ``_new_queue`` (the run's :class:`~agentrl.batches.staleness.StalenessQueue`: staleness bound,
groups per step, dropped prompts back to the stream, dynamic sampling's filter, a checkpoint's
finished groups restored), ``_producer`` (admits a group whenever the queue lets it, takes the next
prompt position from the stream and runs its ``rollout.group_size`` episodes; the positions in
flight are kept for checkpoints; a proxy-mode episode whose agent rewrote its history adds all its
trajectories) and ``_next_batch`` (the next batch from the queue, or from ``train.replay``; None
when a stop is requested first). Does not train (``agentrl.jobs.run``) or checkpoint
(``agentrl.jobs.run.outputs``).
"""

from __future__ import annotations

import asyncio

from agentrl.batches.samples import has_signal
from agentrl.batches.staleness import StalenessQueue
from agentrl.common.stoppable import unless_stopped
from agentrl.episodes.manager import EpisodeManager
from agentrl.episodes.spec import make_specs


class RunFeed:
    """Batches for ``Runner`` (uses ``cfg``, ``stream``, ``in_flight``, ``trainer``, ``restored``,
    ``restored_counts``, ``replay``, ``step``, ``_stop``)."""

    def _new_queue(self) -> StalenessQueue:
        cfg = self.cfg
        queue = StalenessQueue(
            cfg.train.max_staleness,
            cfg.train.groups_per_step,
            on_drop=self.stream.drop,
            keep=has_signal if cfg.algo.dynamic_sampling else None,
            max_draws=cfg.algo.max_draw_batches,
        )
        queue.version = self.trainer.version
        queue.restore(self.restored, **self.restored_counts)
        return queue

    async def _producer(self, queue: StalenessQueue, manager: EpisodeManager) -> None:
        G = self.cfg.rollout.group_size
        running: set[asyncio.Task] = set()

        async def run_group(index: int, position: int) -> None:
            specs = make_specs(
                1, G, seed=self.cfg.rollout.seed, start=position, attempt=self.stream.drops.get(position, 0)
            )
            # run_segments: a proxy-mode episode whose agent rewrote its history yields several trajectories
            run = getattr(manager, "run_segments", None)
            done = await asyncio.gather(*(run(s) if run else manager.run_episode(s) for s in specs))
            group = [t for ts in done for t in (ts if isinstance(ts, list) else [ts])]
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

    async def _next_batch(self, queue: StalenessQueue):
        """The next batch and its positions, or None if a stop was requested first."""
        if self.replay is not None:
            return self.replay.batch(self.step + 1)
        # get_batch removes groups only when it returns: a stop that cancels it loses nothing
        done, got = await unless_stopped(queue.get_batch_with_positions(), self._stop)
        return got if done else None
