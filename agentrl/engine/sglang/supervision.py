"""Crash recovery and health checks of :class:`agentrl.engine.sglang.engine.SGLangEngine`'s servers.

Owns, as a mixin of that engine (it uses the engine's state: ``router.backends``, ``_servers``,
``_client``, ``_tasks``, weights and version fields, ``restart_dead``, ``MAX_RESTARTS``,
``HEALTH_INTERVAL_S``): recovering a backend after a failed request (restart a supervised server
that died, or probe an attached one), restarting a server and bringing it back to the current
weights and version, ``/health`` probes, and the periodic health-check loop. The policy these
implement is described in the engine's module docstring ("Failures"). Does not send requests or
decide about re-sending them (the engine does).
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from agentrl.engine.router import Backend
from agentrl.engine.sglang.server import SGLangServer

log = logging.getLogger("agentrl.engine.sglang")


class Supervision:
    """Mixin: recovery of failed servers and health checks (see the module docstring)."""

    async def _recover(self, b: Backend, epoch: int, *, again: bool = False) -> bool:
        """After a failure seen at ``epoch``: restart ``b`` if it is supervised and dead. Returns
        whether ``b`` should be tried again (False: route around it). A server whose last restart
        failed is restarted again only by the health checks (``again``): requests fail fast.

        The recovery is the engine's own task: the request that found the server dead may be
        cancelled mid-restart (its episode's turn deadline), and ``b.lock`` must stay held until the
        restart ends, or a weight push would reach the half-restarted server and fail the run."""
        task = asyncio.ensure_future(self._recover_locked(b, epoch, again))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def _recover_locked(self, b: Backend, epoch: int, again: bool) -> bool:
        async with b.lock:
            if b.epoch != epoch:  # another request already recovered it
                return b.healthy
            server = self._servers.get(b.index)
            if server is not None and self.restart_dead:
                if server.alive() and await self._probe(b):
                    b.healthy = True
                    return True
                if b.counts["restarts"] >= self.MAX_RESTARTS or (b.failed_restart and not again):
                    b.healthy = False
                    return False
                await self._restart(b, server)
                return b.healthy
            b.healthy = await self._probe(b)
            return b.healthy

    async def _restart(self, b: Backend, server: SGLangServer) -> None:
        """Restart a dead supervised server (caller holds ``b.lock``), reload the latest weights and
        tell it the version it serves."""
        b.healthy = False
        b.counts["restarts"] += 1
        log.warning("SGLang server %s died; restarting (log: %s)", b.url, server.log_path)
        try:
            await asyncio.to_thread(server.restart)
            self._follow_server(b)
            b.pushed_version = None
            served = self._base_version
            if self.weights_path is not None:
                await self._post(b, "/update_weights_from_disk", {"model_path": self.weights_path}, None)
                served = self.weights_version if self.weights_version is not None else self._version
            b.serves_stale = served != self._version
            if b.serves_stale:
                log.warning(
                    "restarted SGLang server %s serves version %s, not %s (no weights_path)",
                    b.url,
                    served,
                    self._version,
                )
            await self._push_version(b, served)
            b.healthy, b.failed_restart = True, False
        except Exception as e:  # the server stays down; its requests fail with EngineError
            b.failed_restart = True
            log.error("restarting SGLang server %s failed: %s", b.url, e)
        finally:
            b.epoch += 1

    def _follow_server(self, b: Backend) -> None:
        """``b``'s URL as its supervised server has it: a launch that found its port taken by another
        program listens on a fresh one (``SGLangServer.PORT_ATTEMPTS``)."""
        server = self._servers.get(b.index)
        if server is not None and server.url.rstrip("/") != b.url:
            log.warning("SGLang server %s listens at %s now (its port was taken)", b.url, server.url)
            b.url = server.url.rstrip("/")

    async def _probe(self, b: Backend, timeout_s: float = 5.0) -> bool:
        assert self._client is not None
        try:
            return (await self._client.get(b.url + "/health", timeout=timeout_s)).status_code == 200
        except (httpx.HTTPError, RuntimeError):
            return False

    async def _watch(self) -> None:
        """Health checks: restart a supervised server found dead; bring an attached one back when its
        ``/health`` answers again."""
        while not self._closed:
            await asyncio.sleep(self.HEALTH_INTERVAL_S)
            for b in self.router.backends:
                server = self._servers.get(b.index)
                if b.lock.locked():
                    continue
                if server is None:
                    b.healthy = await self._probe(b)
                elif self.restart_dead and not server.alive() and b.counts["restarts"] < self.MAX_RESTARTS:
                    t = asyncio.create_task(self._recover(b, b.epoch, again=True))
                    self._tasks.add(t)
                    t.add_done_callback(self._tasks.discard)
