"""The episode-source seam: what a run asks of whatever plays its training episodes.

Owns :class:`EpisodeSource`: ``run_segments`` (one episode to its end, every trajectory it made: an
agent that rewrote its history splits an episode), ``run_episode`` (its last trajectory), ``collect``,
``cancel``, the running ``metrics`` and the ``env_id``. The in-process
``agentrl.episodes.manager.EpisodeManager`` and the Ray driver's ``agentrl.distributed.adapters.RayEpisodes``
declare it; the run's feed (``agentrl.jobs.run.feed``) and loop use only it. Does not run episodes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agentrl.episodes.spec import EpisodeSpec
    from agentrl.episodes.summary import RolloutMetrics
    from agentrl.trajectory import Trajectory


class EpisodeSource(Protocol):
    """Plays episodes; never raises for an episode's failure (it ends as a typed outcome), only for
    the caller's cancellation."""

    env_id: str
    metrics: RolloutMetrics

    async def run_segments(self, spec: EpisodeSpec) -> list[Trajectory]:
        """Run ``spec`` to its end; its trajectories, the last one the episode's end."""
        ...

    async def run_episode(self, spec: EpisodeSpec) -> Trajectory:
        """Run ``spec`` to its end; its (last) trajectory."""
        ...

    async def collect(self, specs: Iterable[EpisodeSpec]) -> list[Trajectory]:
        """Run every spec; one trajectory each, or more where an episode split."""
        ...

    def cancel(self) -> None:
        """End the episodes in flight (as ``cancelled``)."""
        ...
