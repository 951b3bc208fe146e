"""``distributed: ray`` as one object: the actors of a run, built on their placement groups.

Owns ``RayBackend.start(cfg, model_path)``: join/start Ray, place the layout of ``cfg.ray``, create
the engine actors, rollout workers and trainer ranks there (trainer ranks rendezvous through rank
0's node address), wrap them in the driver-side adapters (``engine``, ``episodes``, ``trainer``),
and ``close()``, which stops every actor, removes the placement groups and disconnects - also
after a failed start. ``check(cfg)`` rejects what the Ray mode does not run.

Where things run: envs and their sandboxes live in the rollout workers (one EpisodeManager each),
model weights in the engine actors and trainer ranks; the driver keeps the run loop, the queue,
evaluation episodes (against the engine actors) and the logs. On a multi-node cluster, the run's
output_dir must be on a filesystem every node sees (trainer ranks write the checkpoints).

Does not own the training loop (``agentrl.runner`` drives these objects exactly as it drives the
in-process ones) or the behaviour of any actor.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from agentrl.distributed.adapters import RayEngine, RayEpisodes, RayTrainer, get_all
from agentrl.distributed.cluster import RayCluster, Slot, plan
from agentrl.distributed.config import RayConfig
from agentrl.errors import ConfigError


def ship_by_value(entry_point: Any) -> bool:
    """Make an env class/factory defined in a script or test module travel to the actors by value
    (that module is not importable on the workers, least of all on other nodes). Code from
    installed packages keeps travelling by reference. True if registered by value."""
    import ray

    mod = sys.modules.get(getattr(entry_point, "__module__", None) or "")
    path = getattr(mod, "__file__", None) or ""
    if mod is None or mod.__name__ == "__main__" or not path:
        return False  # __main__ already travels by value
    if any(part in ("site-packages", "dist-packages") for part in Path(path).parts) or \
            mod.__name__.split(".")[0] == "agentrl":
        return False
    ray.cloudpickle.register_pickle_by_value(mod)
    return True


def check(cfg, rc: RayConfig) -> None:
    """ConfigError (naming the value) for settings the Ray mode cannot run."""
    if cfg.engine.kind != "local":
        raise ConfigError(f"engine.kind: {cfg.engine.kind!r} is not supported with distributed=ray yet; "
                          "use engine.kind=local (engine actors hold LocalEngines)")
    rc.check()


class RayBackend:
    """See the module docstring. Attributes after ``start``: ``engine`` (RayEngine), ``episodes``
    (RayEpisodes for the training env), ``trainer`` (RayTrainer), ``timings`` (seconds per phase)."""

    def __init__(self, rc: RayConfig) -> None:
        self.rc = rc
        self.cluster = RayCluster(rc)
        self.actors: list[Any] = []
        self.engine: RayEngine | None = None
        self.episodes: RayEpisodes | None = None
        self.trainer: RayTrainer | None = None
        self.timings: dict[str, float] = {}

    @classmethod
    def start(cls, cfg, model_path: str | Path, *, critic: bool = False, rc: RayConfig | None = None) -> "RayBackend":
        """``rc``: the Ray settings (default ``cfg.ray``)."""
        rc = rc or cfg.ray
        check(cfg, rc)
        self = cls(rc)
        try:
            self._start(cfg, str(model_path), critic)
        except BaseException:
            self.close()
            raise
        return self

    def _spawn(self, cls: type, slot: Slot, *args: Any, **kw: Any):
        import ray

        actor = ray.remote(cls).options(num_cpus=slot.cpus, num_gpus=slot.gpus,
                                        scheduling_strategy=self.cluster.strategy(slot)).remote(*args, **kw)
        self.actors.append(actor)
        return actor

    def _start(self, cfg, model_path: str, critic: bool) -> None:
        import ray

        from agentrl.distributed.ray_actors import EngineActor, RolloutWorker, TrainerRank
        from agentrl.registry import spec

        t0 = time.perf_counter()
        self.cluster.connect()
        t1 = time.perf_counter()
        layout = plan(self.rc)
        self.cluster.place(layout)
        t2 = time.perf_counter()
        deadline = self.rc.startup_timeout_s

        world = len(layout.trainer)
        ranks = [self._spawn(TrainerRank, s, r, world) for r, s in enumerate(layout.trainer)]
        addr, port = ray.get(ranks[0].address.remote(), timeout=deadline)
        setups = [r.setup.remote(model_path, cfg.trainer, critic, addr, port) for r in ranks]

        engines = [self._spawn(EngineActor, s, model_path, device=cfg.model.device, dtype=cfg.model.dtype,
                               max_batch_size=cfg.engine.max_batch_size, max_context=cfg.rollout.max_context)
                   for s in layout.engines]
        wpe = self.rc.workers_per_engine
        env_spec = spec(cfg.env.id)
        if env_spec.source == "register" and callable(env_spec.entry_point):
            ship_by_value(env_spec.entry_point)
        workers = [self._spawn(RolloutWorker, s, [engines[k // wpe]], model_path, cfg.rollout, env_spec,
                               dict(cfg.env.kwargs), cfg.rollout.max_context)
                   for k, s in enumerate(layout.workers)]
        get_all(setups + [w.ping.remote() for w in workers], deadline, "starting trainer ranks and rollout workers")
        t3 = time.perf_counter()

        self.trainer = RayTrainer(ranks, timeout_s=cfg.trainer.dist_timeout_s)
        self.engine = RayEngine(engines, max_context=cfg.rollout.max_context)
        self.episodes = RayEpisodes(workers, env_id=cfg.env.id)
        self.timings = {"connect_s": t1 - t0, "place_s": t2 - t1, "actors_s": t3 - t2, "total_s": t3 - t0}

    def close(self) -> None:
        """Stop the trainer ranks' groups, kill every actor, remove the placement groups, and
        disconnect from (or shut down) Ray if ``start`` connected. Safe to call twice."""
        import ray

        if self.trainer is not None:
            self.trainer.close()
        if ray.is_initialized():
            for a in self.actors:
                try:
                    ray.kill(a)
                except Exception:
                    pass
        self.actors = []
        self.cluster.close()
