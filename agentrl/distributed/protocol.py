"""The compute seam: where a run's engine, trainer and episodes live, as the run loop drives them.

Owns :class:`Compute`: ``engine``, ``trainer`` (a :class:`~agentrl.trainer.protocol.TrainerProtocol`),
``episodes`` (an :class:`~agentrl.episodes.source.EpisodeSource`), ``remote_gates()`` (drain gates of
generations that do not pass ``engine``), ``watch()`` (the heartbeat over remote pieces) and
``close()``. ``distributed: local`` is ``agentrl.jobs.local_compute.LocalCompute`` (everything in this
process), ``distributed: ray`` is ``agentrl.distributed.compute.RayCompute`` (Ray actors); the run loop
(``agentrl.jobs.run``) sees only this. Named "compute", not "backend": that word already names the
SGLang servers, the sandbox backends and ``serve --backend``. Does not build either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agentrl.engine.base import Engine
    from agentrl.episodes.source import EpisodeSource
    from agentrl.trainer.protocol import TrainerProtocol
    from agentrl.weights.drain import Gate


class Compute(Protocol):
    """See the module docstring."""

    engine: Engine
    trainer: TrainerProtocol
    episodes: EpisodeSource

    def remote_gates(self) -> Sequence[Gate]:
        """Gates of generations that do not pass ``engine`` (drained with it before a weight update)."""
        ...

    async def watch(self) -> None:
        """Never returns while everything is alive; raises when a remote piece is lost."""
        ...

    def close(self) -> None:
        """Release the trainer and every remote piece (the async engine is closed by the run loop)."""
        ...
