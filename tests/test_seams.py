"""The run's seams (agentrl.trainer.protocol, agentrl.episodes.source, agentrl.distributed.protocol): the
local and Ray sides declare them, and the in-process Trainer (which matches TrainerProtocol by shape,
without naming it) keeps every member with the same parameters. pyright checks the declared ones."""

import asyncio
import inspect

import pytest

from agentrl.distributed.adapters import RayEpisodes, RayTrainer
from agentrl.distributed.compute import RayCompute
from agentrl.distributed.protocol import Compute
from agentrl.distributed.ray_actors import RolloutWorker
from agentrl.episodes.manager import EpisodeManager
from agentrl.episodes.source import EpisodeSource
from agentrl.episodes.spec import make_specs
from agentrl.jobs.local_compute import LocalCompute
from agentrl.trainer.protocol import TrainerProtocol
from agentrl.trajectory import Trajectory


def _members(proto: type) -> dict[str, inspect.Signature]:
    return {n: inspect.signature(f) for n, f in vars(proto).items() if inspect.isfunction(f) and not n.startswith("_")}


@pytest.mark.parametrize(
    "impl, proto",
    [
        (LocalCompute, Compute),
        (RayCompute, Compute),
        (EpisodeManager, EpisodeSource),
        (RayEpisodes, EpisodeSource),
        (RayTrainer, TrainerProtocol),
    ],
)
def test_the_implementations_declare_their_seam(impl, proto):
    assert proto in impl.__mro__  # declared, not only matched by shape
    for name in _members(proto):
        assert inspect.isfunction(getattr(impl, name)), f"{impl.__name__}.{name}"


def test_the_trainer_matches_the_trainer_protocol():
    from agentrl.trainer import Trainer

    for name, sig in _members(TrainerProtocol).items():
        own = inspect.signature(getattr(Trainer, name))
        assert list(own.parameters) == list(sig.parameters), f"Trainer.{name}{own} vs TrainerProtocol.{name}{sig}"


def test_ray_episodes_run_segments_is_the_one_trajectory_of_run_episode():
    episodes = RayEpisodes([object()], env_id="e")
    spec = make_specs(1, 1, seed=0)[0]
    traj = Trajectory(episode_id="g-0", group_id=spec.group_id, env_id="e", prompt_len=0)

    async def one(s):
        assert s is spec
        return traj

    episodes.run_episode = one  # the worker's answer, without Ray
    assert asyncio.run(episodes.run_segments(spec)) == [traj]


def test_a_worker_without_a_drain_gate_says_so():
    worker = RolloutWorker.__new__(RolloutWorker)  # no model, env or Ray: only the gate is asked
    worker.engine = object()
    with pytest.raises(RuntimeError, match="partial_rollouts=true"):
        asyncio.run(worker.hold_generation())
