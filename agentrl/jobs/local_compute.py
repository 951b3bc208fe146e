"""``distributed: local`` as one object: the in-process engine, trainer and episode manager of a run.

Owns ``LocalCompute``, the same shape as ``agentrl.distributed.RayCompute`` (``engine``,
``trainer``, ``episodes``, ``remote_gates()``, ``watch()``, ``close()``), so the run loop (``agentrl.jobs.run``)
talks to one compute object whichever mode runs. Its pieces are built by
``agentrl.jobs.build.start_compute``; it does not build, start or implement any of them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from agentrl.distributed.protocol import Compute
from agentrl.engine.base import Engine
from agentrl.episodes.source import EpisodeSource
from agentrl.trainer.protocol import TrainerProtocol
from agentrl.weights.drain import Gate


@dataclass
class LocalCompute(Compute):
    """``engine``: the in-process engine (wrapped for ``rollout.partial_rollouts``), which the
    episodes, evaluation and weight pushes share; ``trainer``: the in-process Trainer;
    ``episodes``: the EpisodeManager of the training env on ``engine``."""

    engine: Engine
    trainer: TrainerProtocol
    episodes: EpisodeSource

    def remote_gates(self) -> tuple[Gate, ...]:
        """Gates of generations that do not pass ``engine``: none here (every episode runs on it)."""
        return ()

    async def watch(self) -> None:
        """The run's heartbeat over remote pieces: none here, so it never fires (RayCompute's
        raises NodeLostError when a node or actor is lost)."""
        await asyncio.Event().wait()

    def close(self) -> None:
        """Release the trainer (its process group). The engine is async and closed by the run loop
        (``await engine.close()``), as with RayCompute."""
        self.trainer.close()
