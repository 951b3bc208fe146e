"""Crash recovery and health checks of an SGLang engine's servers: the :class:`Supervisor` it holds.

Owns: recovering a backend after a failed request (restart a supervised server that died, or probe
an attached one), restarting a server and bringing it back to the weights and version label in the
:class:`Served` record it shares with the engine, the periodic health-check loop and the tasks it
starts, and ``post_all`` (one admin call on every server, recovering a server found dead). The
policy these implement is described in the engine's module docstring ("Failures"). Does not send
``/generate`` requests or decide about re-sending them (the engine does), nor talk HTTP itself
(its :class:`~agentrl.engine.sglang.admin.Admin` does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import httpx

from agentrl.engine.router import Backend, Router
from agentrl.engine.sglang.admin import Admin
from agentrl.engine.sglang.handle import ServerHandle
from agentrl.errors import EngineError

log = logging.getLogger("agentrl.engine.sglang")


@dataclass
class Served:
    """What the servers serve: the engine sets it, the supervisor restores it on a restarted server."""

    #: the policy version: tokens sampled from now on are stamped with it (pushed at start and resume)
    policy: int = 0
    #: what a server serves right after (re)starting from its model path
    base: int = 0
    #: a full checkpoint of the served weights on disk (set by weight syncs through the engine's
    #: ``note_weights``); a restarted server reloads it instead of serving stale weights
    weights_path: str | None = None
    weights_version: int | None = None


class Supervisor:
    """Keeps the router's servers alive (see the module docstring). ``servers``: the supervised
    :class:`ServerHandle` per backend index (none when attached); ``probe``: the ``/health`` check
    (the admin's unless given: a client of servers launched elsewhere may find them moved first)."""

    #: seconds between health checks of the servers (restarts a supervised server that died idle)
    HEALTH_INTERVAL_S = 5.0
    #: a supervised server restarted this many times is left dead (its requests then fail)
    MAX_RESTARTS = 5

    def __init__(
        self,
        router: Router,
        servers: Mapping[int, ServerHandle],
        admin: Admin,
        served: Served,
        *,
        restart_dead: bool,
        probe: Callable[[Backend], Awaitable[bool]] | None = None,
    ) -> None:
        self.router, self.servers, self.admin, self.served = router, dict(servers), admin, served
        self.restart_dead = restart_dead
        self.probe = probe if probe is not None else admin.probe
        self.closed = False
        self.tasks: set[asyncio.Task] = set()
        self._monitor: asyncio.Task | None = None

    # --- lifecycle ----------------------------------------------------------------------------
    def watch(self) -> None:
        """Start the health checks on the running event loop (again on each new loop)."""
        self._monitor = asyncio.create_task(self._watch())

    def close(self) -> None:
        """Stop the health checks and every recovery in progress."""
        self.closed = True
        for t in [self._monitor, *self.tasks]:
            if t is not None:
                t.cancel()

    def _spawn(self, coro: Awaitable[bool]) -> asyncio.Future:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # --- recovery -----------------------------------------------------------------------------
    async def recover(self, b: Backend, epoch: int, *, again: bool = False) -> bool:
        """After a failure seen at ``epoch``: restart ``b`` if it is supervised and dead. Returns
        whether ``b`` should be tried again (False: route around it). A server whose last restart
        failed is restarted again only by the health checks (``again``): requests fail fast.

        The recovery is the supervisor's own task: the request that found the server dead may be
        cancelled mid-restart (its episode's turn deadline), and ``b.lock`` must stay held until the
        restart ends, or a weight push would reach the half-restarted server and fail the run."""
        return await asyncio.shield(self._spawn(self._recover_locked(b, epoch, again)))

    async def _recover_locked(self, b: Backend, epoch: int, again: bool) -> bool:
        async with b.lock:
            if b.epoch != epoch:  # another request already recovered it
                return b.healthy
            server = self.servers.get(b.index)
            if server is not None and self.restart_dead:
                if server.alive() and await self.probe(b):
                    b.healthy = True
                    return True
                if b.counts["restarts"] >= self.MAX_RESTARTS or (b.failed_restart and not again):
                    b.healthy = False
                    return False
                await self._restart(b, server)
                return b.healthy
            b.healthy = await self.probe(b)
            return b.healthy

    async def _restart(self, b: Backend, server: ServerHandle) -> None:
        """Restart a dead supervised server (caller holds ``b.lock``), reload the latest weights and
        tell it the version it serves."""
        b.healthy = False
        b.counts["restarts"] += 1
        log.warning("SGLang server %s died; restarting (log: %s)", b.url, server.log_path)
        try:
            await asyncio.to_thread(server.restart)
            self.follow(b)
            b.pushed_version = None
            s = self.served
            served = s.base
            if s.weights_path is not None:
                await self.admin.post(b, "/update_weights_from_disk", {"model_path": s.weights_path}, None)
                served = s.weights_version if s.weights_version is not None else s.policy
            b.serves_stale = served != s.policy
            if b.serves_stale:
                log.warning(
                    "restarted SGLang server %s serves version %s, not %s (no weights_path)",
                    b.url,
                    served,
                    s.policy,
                )
            await self.admin.push_label(b, served)
            b.healthy, b.failed_restart = True, False
        except Exception as e:  # the server stays down; its requests fail with EngineError
            b.failed_restart = True
            log.error("restarting SGLang server %s failed: %s", b.url, e)
        finally:
            b.epoch += 1

    def follow(self, b: Backend) -> None:
        """``b``'s URL as its supervised server has it: a launch that found its port taken by another
        program listens on a fresh one (``SGLangServer.PORT_ATTEMPTS``)."""
        server = self.servers.get(b.index)
        if server is not None and server.url.rstrip("/") != b.url:
            log.warning("SGLang server %s listens at %s now (its port was taken)", b.url, server.url)
            b.url = server.url.rstrip("/")

    async def _watch(self) -> None:
        """Health checks: restart a supervised server found dead; bring an attached one back when its
        ``/health`` answers again."""
        while not self.closed:
            await asyncio.sleep(self.HEALTH_INTERVAL_S)
            for b in self.router.backends:
                server = self.servers.get(b.index)
                if b.lock.locked():
                    continue
                if server is None:
                    b.healthy = await self.probe(b)
                elif self.restart_dead and not server.alive() and b.counts["restarts"] < self.MAX_RESTARTS:
                    self._spawn(self.recover(b, b.epoch, again=True))

    # --- calls to every server ----------------------------------------------------------------
    async def post_all(self, path: str, payload: dict, *, timeout_s: float | None = None) -> list[dict]:
        """POST ``payload`` to ``path`` on every server (waiting out restarts in progress; a server
        found dead is recovered as for ``/generate`` and asked once more); the answers in server
        order. Raises EngineError naming each server that failed and why."""

        async def one(b: Backend) -> dict:
            async with b.lock:
                epoch = b.epoch
            try:
                return await self.admin.post(b, path, payload, timeout_s)
            except EngineError as e:  # the server died since its last request: recover, then once more
                if not isinstance(e.__cause__, httpx.TransportError) or not await self.recover(b, epoch):
                    raise
            return await self.admin.post(b, path, payload, timeout_s)

        results = await asyncio.gather(*(one(b) for b in self.router.backends), return_exceptions=True)
        if path.startswith("/update_weights_from"):  # the servers it reached now hold current weights
            for b, r in zip(self.router.backends, results):
                b.serves_stale = b.serves_stale and isinstance(r, BaseException)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise EngineError("; ".join(str(e) for e in errors))
        return list(results)  # type: ignore[arg-type]
