"""Ray orchestration (``distributed: ray``): the run's engines, rollout workers and FSDP trainer
ranks as Ray actors on placement groups, on a local Ray instance or a cluster (``RAY_ADDRESS``).

Modules: ``config`` (RayConfig, the ``ray:`` config section), ``cluster`` (connecting to Ray,
the colocated/split layout, placement groups), ``ray_actors`` (EngineActor, RolloutWorker,
TrainerRank: thin shells around LocalEngine, EpisodeManager and Trainer), ``sglang_engines``
(SGLangEngineActor: one SGLang server per engine actor; ActorServer, SGLangClient: the driver's
and the workers' HTTP view of those servers), ``reaper`` (a watchdog that kills an actor's server
when the actor dies), ``adapters`` (driver faces with the in-process interfaces: RayEngine,
RayEpisodes, RayTrainer), ``recovery`` (noticing a lost node or actor: the heartbeat, and the
supervisor that restarts a run from its checkpoint), ``compute`` (RayCompute: builds and tears
down all of it) and ``protocol`` (Compute: what the run loop asks of the local or Ray compute).
Ray is an optional dependency (``pip install agentrl[ray]``); importing this package does not import it.
"""

from agentrl.distributed.config import RayConfig

_LAZY = {
    "RayCompute": "compute",
    "RayCluster": "cluster",
    "RayEngine": "adapters",
    "RayEpisodes": "adapters",
    "RayTrainer": "adapters",
    "plan": "cluster",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"agentrl.distributed.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'agentrl.distributed' has no attribute {name!r}")


__all__ = ["RayCompute", "RayCluster", "RayConfig", "RayEngine", "RayEpisodes", "RayTrainer", "plan"]
