"""``distributed: ray`` as one object: the actors of a run, built on their placement groups.

Owns ``RayCompute.start(cfg, model_path)``: join/start Ray, place the layout of ``cfg.ray``, create
the engine actors, rollout workers and trainer ranks there (trainer ranks rendezvous through rank
0's node address), wrap them in the driver-side adapters (``engine``, ``episodes``, ``trainer``),
and ``close()``, which stops every actor, removes the placement groups and disconnects - also
after a failed start; ``nodes`` (actor name -> Ray node id) and ``watch()``, the heartbeat that
notices a lost node or actor (``agentrl.distributed.recovery``). ``check(cfg)`` rejects what the
Ray mode does not run (called by the run's plan, ``agentrl.config.plan``, and again by ``start``
for direct callers), ``check_weight_sync`` the weight paths that cannot reach other nodes.

Where things run: envs and their sandboxes live in the rollout workers (one EpisodeManager each),
model weights in the engine actors and trainer ranks; the driver keeps the run loop, the queue,
evaluation episodes (against the engines) and the logs. On a multi-node cluster, the run's
output_dir must be on a filesystem every node sees (trainer ranks write the checkpoints, the
driver resumes from them). ``ray.pg_strategy`` spreads the bundles over nodes.

Engines: ``engine.kind=local`` - EngineActors hold LocalEngines, reached through ``RayEngine``
(one actor call per turn). ``engine.kind=sglang`` - each SGLangEngineActor launches one SGLang
server on its slot; the driver's ``engine`` is an SGLangEngine supervising those servers through
their actors, and rollout workers send ``/generate`` straight to their server over HTTP
(``agentrl.distributed.sglang_engines``); with ``engine.urls`` no engine actors are made and all
of them attach to those servers. Weight pushes run in the driver (trainer rank 0's gathered
weights -> driver -> WeightSync): with the disk path every server must be able to read
``engine.weights_dir`` (default output_dir/weights), i.e. a shared filesystem on a cluster
(``ray.shared_filesystem``, :func:`check_weight_sync`); the object-store path needs none (the
engine actors are its stagers: each writes the weights on its own node).

Does not own the training loop (``agentrl.jobs.run`` drives this object exactly as it drives the
in-process ``LocalCompute``), choosing between the two (``agentrl.jobs.build.start_compute``) or
the behaviour of any actor.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from agentrl.distributed import recovery
from agentrl.distributed.adapters import RayEngine, RayEpisodes, RayTrainer, get_all
from agentrl.distributed.cluster import RayCluster, Slot, plan
from agentrl.distributed.config import RayConfig
from agentrl.distributed.protocol import Compute
from agentrl.distributed.ray_actors import EngineActor, RolloutWorker, TrainerRank
from agentrl.engine.base import Engine
from agentrl.episodes.tokenizer import template_text
from agentrl.errors import ConfigError
from agentrl.weights.drain import Gate, with_partial_rollouts
from agentrl.weights.factory import resolve_sync_kind


def ship_by_value(entry_point: Any) -> bool:
    """Make an env class/factory defined in a script or test module travel to the actors by value
    (that module is not importable on the workers, least of all on other nodes). Code from
    installed packages keeps travelling by reference. True if registered by value."""
    import ray
    import ray.cloudpickle  # a submodule: named for the type checker (ray imports it itself)

    mod = sys.modules.get(getattr(entry_point, "__module__", None) or "")
    path = getattr(mod, "__file__", None) or ""
    if mod is None or mod.__name__ == "__main__" or not path:
        return False  # __main__ already travels by value
    if (
        any(part in ("site-packages", "dist-packages") for part in Path(path).parts)
        or mod.__name__.split(".")[0] == "agentrl"
    ):
        return False
    ray.cloudpickle.register_pickle_by_value(mod)
    return True


def check(cfg, rc: RayConfig) -> None:
    """ConfigError (naming the value) for settings the Ray mode cannot run."""
    if cfg.engine.kind == "sglang" and cfg.engine.num_servers != 1:
        raise ConfigError(
            f"engine.num_servers: {cfg.engine.num_servers} with distributed=ray; each of the "
            "ray.num_engines engine actors launches one SGLang server: set ray.num_engines instead"
        )
    rc.check()

    device = "cpu" if cfg.model.device == "cpu" else "gpu"
    check_weight_sync(resolve_sync_kind(cfg.engine.weight_sync, cfg.engine.kind, device), rc, cfg.engine.urls)


def joins_cluster(rc: RayConfig) -> bool:
    """True when the run joins a Ray cluster (``ray.address`` or ``$RAY_ADDRESS``), whose actors may
    sit on other machines; False for a local instance (one machine, one filesystem)."""
    import os

    return bool(rc.address or os.environ.get("RAY_ADDRESS"))


def check_weight_sync(weight_sync: str, rc: RayConfig, urls=()) -> None:
    """ConfigError for a weight path that cannot reach servers on other nodes: ``disk`` on a cluster
    without ``ray.shared_filesystem: true`` (the servers on other nodes would not see the files) and
    ``object_store`` on servers that no engine actor owns (``engine.urls``). Pure: the config's
    values only (``agentrl.config.plan`` calls it through ``check`` for ``distributed: ray``)."""
    if weight_sync == "disk" and joins_cluster(rc) and not rc.shared_filesystem:
        raise ConfigError(
            "engine.weight_sync: 'disk' on a Ray cluster needs ray.shared_filesystem: true (output_dir "
            "and engine.weights_dir on a filesystem every node sees); without one use "
            "engine.weight_sync: object_store"
        )
    if weight_sync == "object_store" and urls:
        raise ConfigError(
            f"engine.weight_sync: 'object_store' writes through the engine actors, but engine.urls "
            f"{list(urls)} attaches to servers no actor owns: use disk on a shared filesystem"
        )


class RayCompute(Compute):
    """See the module docstring. Attributes after ``start``: ``engine`` (RayEngine, or SGLangEngine
    for engine.kind=sglang; wrapped for ``rollout.partial_rollouts`` like the workers' engines),
    ``engine_actors`` (the SGLangEngineActors), ``episodes`` (RayEpisodes for the training env),
    ``trainer`` (RayTrainer), ``timings`` (seconds per phase). The same shape as
    ``agentrl.jobs.local_compute.LocalCompute``."""

    engine: Engine  # set by start
    trainer: RayTrainer
    episodes: RayEpisodes

    def __init__(self, rc: RayConfig) -> None:
        self.rc = rc
        self.cluster = RayCluster(rc)
        self.actors: list[Any] = []
        self.engine_actors: list[Any] = []  # SGLangEngineActors (stopped before the kill)
        self.actor_servers: list[Any] = []  # their driver-side handles (SGLangEngine(servers=...))
        self._trainer: RayTrainer | None = None  # ``trainer`` once start placed it: what close() releases
        self.timings: dict[str, float] = {}
        self.partial_rollouts = True
        self.named: dict[str, Any] = {}  # "trainer-rank-0", "engine-0", "rollout-worker-0"... -> actor
        self.nodes: dict[str, str] = {}  # the same names -> the Ray node id each actor runs on

    @classmethod
    def start(cls, cfg, model_path: str | Path, *, critic: bool = False, rc: RayConfig | None = None) -> RayCompute:
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

    def remote_gates(self) -> Sequence[Gate]:
        """The rollout workers' gates when weight updates must drain them (``partial_rollouts: false``):
        their generations do not pass the driver's ``engine``. Empty with partial rollouts."""
        return [] if self.partial_rollouts else self.episodes.gates()

    def _spawn(self, cls: type, slot: Slot, *args: Any, _opts: dict | None = None, **kw: Any):
        import ray

        actor = (
            ray.remote(cls)
            .options(
                num_cpus=slot.cpus, num_gpus=slot.gpus, **(_opts or {}), scheduling_strategy=self.cluster.strategy(slot)
            )
            .remote(*args, **kw)
        )
        self.actors.append(actor)
        return actor

    def _local_engines(self, cfg, model_path: str, slots: list[Slot]) -> tuple[list, list]:
        """EngineActors (LocalEngine); the driver's RayEngine over all, worker k's over engine k // wpe."""
        mc = cfg.rollout.max_context
        engines = [
            self._spawn(
                EngineActor,
                s,
                model_path,
                device=cfg.model.device,
                dtype=cfg.model.dtype,
                max_batch_size=cfg.engine.max_batch_size,
                max_context=mc,
                prefix_cache_tokens=cfg.engine.prefix_cache_tokens,
            )
            for s in slots
        ]
        self.engine = RayEngine(engines, max_context=mc)
        return [partial(RayEngine, [e], max_context=mc) for e in engines], []

    def _sglang_engines(self, cfg, model_path: str, slots: list[Slot]) -> tuple[list, list]:
        """SGLangEngineActors, one server each (or none: ``engine.urls`` names external servers); the
        driver's SGLangEngine supervises them through ActorServer handles, worker k's SGLangClient
        talks to server k // wpe (to every external server). Returns the worker engine factories
        and the refs that finish when the servers are ready."""
        # lazy: pulls in httpx
        from agentrl.distributed.sglang_engines import ActorServer, SGLangClient, SGLangEngineActor
        from agentrl.engine.sglang.engine import SGLangEngine  # lazy: pulls in httpx

        mc = cfg.rollout.max_context
        if cfg.engine.urls:
            self.engine = SGLangEngine(urls=list(cfg.engine.urls), max_context=mc)
            return [partial(SGLangClient, list(cfg.engine.urls), max_context=mc)], []
        host = self.rc.server_host or (None if self.cluster.address else "127.0.0.1")
        device = "cpu" if cfg.model.device == "cpu" else "cuda"
        # threaded: alive()/info() answer while a restart() is under way
        engines = [
            self._spawn(
                SGLangEngineActor,
                s,
                model_path,
                host=host,
                device=device,
                max_total_tokens=cfg.engine.max_total_tokens,
                startup_timeout_s=self.rc.startup_timeout_s,
                _opts={"max_concurrency": 4},
            )
            for s in slots
        ]
        self.engine_actors = engines
        infos = get_all([e.info.remote() for e in engines], self.rc.startup_timeout_s, "starting SGLang engine actors")
        servers = [ActorServer(e, i, model_path, self.rc.startup_timeout_s) for e, i in zip(engines, infos)]
        self.actor_servers = servers
        engine = SGLangEngine(servers=servers, max_context=mc)
        engine.weight_stagers = servers  # object_store: each actor writes the weights on its node
        self.engine = engine
        return (
            [partial(SGLangClient, [i["url"]], actors=(e,), max_context=mc, retries=6) for e, i in zip(engines, infos)],
            [e.ready.remote() for e in engines],
        )

    def _start(self, cfg, model_path: str, critic: bool) -> None:
        import ray

        from agentrl.envs.registry import spec  # lazy: pulls in gymnasium

        t0 = time.perf_counter()
        self.cluster.connect()
        t1 = time.perf_counter()
        external = cfg.engine.kind == "sglang" and bool(cfg.engine.urls)  # no engine actors to place
        layout = plan(replace(self.rc, engine_cpus=0.0, engine_gpus=0.0) if external else self.rc)
        self.cluster.place(layout)
        t2 = time.perf_counter()
        deadline = self.rc.startup_timeout_s

        world = len(layout.trainer)
        ranks = [self._spawn(TrainerRank, s, r, world) for r, s in enumerate(layout.trainer)]
        addr, port = ray.get(ranks[0].address.remote(), timeout=deadline)
        setups = [r.setup.remote(model_path, cfg.trainer, critic, addr, port) for r in ranks]

        build = self._sglang_engines if cfg.engine.kind == "sglang" else self._local_engines
        engine_of, ready = build(cfg, model_path, [] if external else layout.engines)
        wpe = self.rc.workers_per_engine
        env_spec = spec(cfg.env.id)
        chat = (  # the template's text, not its path: a worker on another node may not see the driver's files
            None if cfg.model.chat_template is None else template_text(cfg.model.chat_template),
            cfg.model.chat_template,
            cfg.model.tool_prompt,
        )
        if env_spec.source == "register" and callable(env_spec.entry_point):
            ship_by_value(env_spec.entry_point)
        workers = [
            self._spawn(
                RolloutWorker,
                s,
                engine_of[(k // wpe) % len(engine_of)],
                model_path,
                cfg.rollout,
                env_spec,
                dict(cfg.env.kwargs),
                chat,
            )
            for k, s in enumerate(layout.workers)
        ]
        done = get_all(
            setups + ready + [w.ping.remote() for w in workers],
            deadline,
            "starting trainer ranks, engines and rollout workers",
        )
        for server, info in zip(self.actor_servers, done[len(setups) : len(setups) + len(ready)]):
            server.follow(info)  # a server launched again on a fresh port (its port was taken) moved
        t3 = time.perf_counter()
        engines = self.engine_actors or (self.engine.actors if isinstance(self.engine, RayEngine) else [])
        self.named = {
            **{f"trainer-rank-{i}": r for i, r in enumerate(ranks)},
            **{f"engine-{j}": e for j, e in enumerate(engines)},
            **{f"rollout-worker-{k}": w for k, w in enumerate(workers)},
        }
        where = get_all([a.placement.remote() for a in self.named.values()], deadline, "locating the actors")
        self.nodes = {name: w["node"] for name, w in zip(self.named, where)}

        self.partial_rollouts = cfg.rollout.partial_rollouts
        self.engine = with_partial_rollouts(self.engine, self.partial_rollouts)
        self.trainer = self._trainer = RayTrainer(ranks, timeout_s=cfg.trainer.dist_timeout_s)
        self.episodes = RayEpisodes(workers, env_id=cfg.env.id)
        self.timings = {"connect_s": t1 - t0, "place_s": t2 - t1, "actors_s": t3 - t2, "total_s": t3 - t0}

    async def watch(self) -> None:
        """The run's heartbeat (``agentrl.distributed.recovery.watch``): never returns; raises
        NodeLostError naming the node and actors within ``ray.heartbeat_s`` of Ray marking a node
        dead or of an actor dying. The run loop races its steps against it."""
        await recovery.watch(self.named, self.nodes, interval_s=self.rc.heartbeat_s)

    def close(self) -> None:
        """Stop the trainer ranks' groups and the SGLang servers, kill every actor, remove the
        placement groups, and disconnect from (or shut down) Ray if ``start`` connected. Safe to
        call twice. (A server whose actor is killed before it could stop it is reaped by the
        actor's watchdog.)"""
        import ray

        if self._trainer is not None:
            self._trainer.close()
        if ray.is_initialized() and self.engine_actors:
            try:
                ray.get([a.stop.remote() for a in self.engine_actors], timeout=60)
            except Exception:
                pass  # dead or stuck: ray.kill below, and the watchdogs reap their servers
        self.engine_actors = []
        if ray.is_initialized():
            for a in self.actors:
                try:
                    ray.kill(a)
                except Exception:
                    pass
        self.actors = []
        self.cluster.close()
