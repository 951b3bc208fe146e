"""SGLang servers under Ray: each engine actor owns one server; the driver and the rollout workers
talk to the servers over HTTP through the same SGLangEngine the in-process mode uses.

Owns three small pieces:

- ``SGLangEngineActor`` (a plain class; ``compute`` makes it a threaded actor): launches one
  server through the project's launcher (``SGLangServer``: CPU flags, ports, logs live there) on
  the actor's placement-group slot, reports where it is (``info``), restarts it on request, stops
  it in ``stop``, and - through a ``Reaper`` watchdog - kills it when the actor dies any other way
  (``ray.kill``, SIGKILL, a crash), so no server outlives its actor.
- ``ActorServer``: the driver-side face of one such actor, shaped like ``SGLangServer`` (``url``,
  ``model_path``, ``alive``, ``restart``, ``log_path``). The driver's engine is
  ``SGLangEngine(servers=[ActorServer, ...])``: it supervises the actors' servers exactly as it
  supervises its own (health checks, restart of a dead server - executed by its actor, on the same
  port unless another program took it - reload of the newest weights, version labels,
  pause/resume, weight pushes). Routing, retries and recovery stay in ``agentrl.engine.sglang.engine``.
- ``SGLangClient``: the rollout workers' engine, an ``SGLangEngine`` attached to the server URLs
  that only generates: it never pushes a ``weight_version`` label (the driver's engine owns those;
  a worker starting late would otherwise relabel a server with its own stale version). Its tokens
  are stamped by the servers' ``weight_versions`` spans, as the driver's are. Given the engine
  actors, it follows their servers' URLs: a server launched again on a fresh port (its port was
  taken before it could bind it) is where ``ready()`` (at start) or ``info()`` (when a server stops
  answering) says.

Does not place actors (``compute``) or move weights (``agentrl.weights``, run by the
driver on the driver's engine: the disk path needs a weights dir every server can read; the
object-store path asks each node's actor to write its own copy, ``stage_weights``).
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from agentrl.common.reaper import Reaper
from agentrl.distributed.ray_actors import _Placed
from agentrl.engine.sglang.engine import SGLangEngine
from agentrl.engine.sglang.server import SGLangServer
from agentrl.weights.object_store import stage_weights_dir


class SGLangEngineActor(_Placed):
    """One SGLang server owned by this actor. The server starts in ``__init__`` (not waited for:
    ``ready()`` waits), so the backend learns every URL at once and the servers boot in parallel."""

    def __init__(
        self, model_path: str, *, host: str | None, device: str, max_total_tokens: int, startup_timeout_s: float
    ) -> None:
        if host is None:  # a cluster: listen where the driver and the other nodes can reach it
            import ray

            host = str(ray.util.get_node_ip_address())
        self._lock = threading.Lock()  # restart/stop come on different threads of this actor
        self.reaper = Reaper()
        # the watchdog is told of every process group the server spawns (a relaunch on a fresh port
        # included) and forgets each one the server kills
        self.server = SGLangServer(
            model_path,
            host=host,
            device=device,
            max_total_tokens=max_total_tokens,
            startup_timeout_s=startup_timeout_s,
            reaper=self.reaper,
        )
        self._launch(restart=False)

    def _launch(self, restart: bool) -> None:
        if restart:
            self.server.restart(wait=False)  # kills the old group first
        else:
            self.server.start(wait=False)

    def info(self) -> dict[str, Any]:
        """Where the server is: ``url``, ``pid`` (= its process group), this actor's ``actor_pid``,
        the watchdog's ``reaper_pid``, the server's ``log_path`` (on this node), ``restarts``."""
        import ray

        s = self.server
        return {
            "url": s.url,
            "pid": s.proc.pid if s.proc is not None else None,
            "actor_pid": os.getpid(),
            "reaper_pid": self.reaper.pid,
            "log_path": str(s.log_path),
            "restarts": s.restarts,
            "node": ray.get_runtime_context().get_node_id(),
        }

    def stage_weights(self, state_dict: dict, version: int, parent: str, keep: int) -> str:
        """``engine.weight_sync=object_store``: write ``state_dict`` (fetched by Ray from the object
        store onto this node) as this node's ``parent/v<version>``, config files from this server's
        model dir; returns the path the driver then tells every server to load."""
        return str(stage_weights_dir(list(state_dict.items()), version, self.server.model_path, parent, keep))

    def ready(self) -> dict[str, Any]:
        """Block until the server answers ``/health`` (EngineError with its log tail if it cannot)."""
        self.server.wait_ready()
        return self.info()

    def alive(self) -> bool:
        return self.server.alive()

    def restart(self) -> dict[str, Any]:
        """Kill the server's process group and start it again (on the same port unless another
        program took it meanwhile: then on a fresh one, see ``info()["url"]``); wait until ready."""
        with self._lock:
            self._launch(restart=True)
            self.server.wait_ready()
            return self.info()

    def log_tail(self, lines: int = 20) -> str:
        return self.server.log_tail(lines)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL its group) and end the watchdog. Idempotent."""
        with self._lock:
            self.server.stop()  # (forgets its group in the watchdog)
            self.reaper.close()


class ActorServer:
    """An ``SGLangServer``-shaped handle on an ``SGLangEngineActor`` (for ``SGLangEngine(servers=)``).
    Blocking calls; the engine runs ``restart`` in a thread."""

    #: seconds an ``alive`` probe waits for a busy actor before assuming it is still alive
    PROBE_TIMEOUT_S = 5.0

    def __init__(self, actor: Any, info: dict[str, Any], model_path: str, startup_timeout_s: float) -> None:
        self.actor, self.info = actor, dict(info)
        self.model_path = str(model_path)
        self.url: str = info["url"]
        self.log_path: str = info["log_path"]
        self.startup_timeout_s = startup_timeout_s

    @property
    def restarts(self) -> int:
        return int(self.info.get("restarts", 0))

    @property
    def node(self) -> str | None:
        """The Ray node id the actor (and its server) runs on."""
        return self.info.get("node")

    def stage_weights(self, state_ref: Any, version: int, parent: str, keep: int) -> str:
        """A stager for ``agentrl.weights.object_store``: the actor fetches ``state_ref`` onto its node
        and writes the weights dir there (blocking)."""
        import ray

        return ray.get(
            self.actor.stage_weights.remote(state_ref, version, parent, keep), timeout=self.startup_timeout_s + 60
        )

    def alive(self) -> bool:
        import ray
        import ray.exceptions  # a submodule: named for the type checker (ray imports it itself)

        try:
            return bool(ray.get(self.actor.alive.remote(), timeout=self.PROBE_TIMEOUT_S))
        except ray.exceptions.GetTimeoutError:
            return True  # busy (restarting), not known dead: do not pile a restart on it
        except ray.exceptions.RayError:
            return False  # the actor is gone, and its server with it

    def follow(self, info: dict[str, Any]) -> None:
        """Take the actor's newer ``info`` (its ``ready()`` answer: the URL its server listens at)."""
        self.info, self.url = dict(info), info["url"]

    def restart(self, wait: bool = True) -> None:
        import ray

        self.info = dict(ray.get(self.actor.restart.remote(), timeout=self.startup_timeout_s + 60))
        self.url = self.info["url"]  # a fresh port if another program took its port meanwhile

    def stop(self) -> None:
        import ray
        import ray.exceptions  # a submodule: named for the type checker (ray imports it itself)

        try:
            ray.get(self.actor.stop.remote(), timeout=60)
        except ray.exceptions.RayError:
            pass  # a dead actor's watchdog has already reaped the server

    kill = stop

    def log_tail(self, lines: int = 20) -> str:
        import ray
        import ray.exceptions  # a submodule: named for the type checker (ray imports it itself)

        try:
            return ray.get(self.actor.log_tail.remote(lines), timeout=30)
        except ray.exceptions.RayError as e:
            return f"(no log: engine actor unreachable: {type(e).__name__})"


class SGLangClient(SGLangEngine):
    """An attached SGLangEngine that generates and never relabels the servers' weight version
    (see the module docstring); pause, resume and weight pushes belong to the driver's engine.
    ``actors``: the engine actors of ``urls`` (same order), whose servers' URLs it follows."""

    #: seconds an ``info()`` asked of an engine actor may take before the URL known is kept
    INFO_TIMEOUT_S = 10.0

    def __init__(self, urls, *, actors: tuple = (), **kwargs: Any) -> None:
        super().__init__(urls, **kwargs)
        self._actors = list(actors)

    async def start(self) -> None:
        if self._actors and not self._started:  # where each server listens once it is ready
            infos = await asyncio.gather(*(a.ready.remote() for a in self._actors), return_exceptions=True)
            for b, info in zip(self.router.backends, infos):
                if isinstance(info, dict):  # (a failed one: its requests fail, naming the URL known)
                    b.url = info["url"].rstrip("/")
        await super().start()

    async def _probe(self, b, timeout_s: float = 5.0) -> bool:
        if b.index < len(self._actors):  # its actor may have launched it again on a fresh port
            try:
                info = await asyncio.wait_for(self._actors[b.index].info.remote(), self.INFO_TIMEOUT_S)
                b.url = info["url"].rstrip("/")
            except Exception:  # noqa: BLE001 - an unreachable actor: probe the URL known
                pass
        return await super()._probe(b, timeout_s)

    async def _push_version(self, b, version: int | None = None) -> None:
        return None
