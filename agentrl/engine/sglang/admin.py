"""Admin calls of :class:`agentrl.engine.sglang.engine.SGLangEngine` to its servers.

Owns, as a mixin of that engine (it uses the engine's state: ``router.backends``, ``_client``,
``_running``, ``_paused``, ``_version``, ``request_timeout_s`` and ``start``): POST/GET to one server
with errors mapped to EngineError, ``post_all`` (one call on every server, recovering a server found
dead), pushing the policy version label, ``pause``/``resume``/``flush_cache`` around weight updates,
and ``server_stats`` for metrics. Does not send ``/generate`` requests or restart servers (the
engine and :mod:`agentrl.engine.sglang.supervision` do), or decide when to pause (the weight syncs).
"""

from __future__ import annotations

import asyncio

import httpx

from agentrl.engine.router import Backend
from agentrl.engine.sglang.wire import ENGINE_COUNTERS, load_stats
from agentrl.errors import EngineError


class Admin:
    """Mixin: calls to every server besides ``/generate`` (see the module docstring)."""

    async def _post(self, b: Backend, path: str, payload: dict, timeout_s: float | None) -> dict:
        assert self._client is not None
        try:
            r = await self._client.post(
                b.url + path, json=payload, timeout=timeout_s if timeout_s is not None else self.request_timeout_s
            )
        except httpx.HTTPError as e:
            raise EngineError(f"SGLang server {b.url}: POST {path} failed: {type(e).__name__}: {e}") from e
        try:
            body = r.json()
        except ValueError:
            body = {"text": r.text}
        if not isinstance(body, dict):
            body = {"result": body}
        if r.status_code != 200 or body.get("success") is False:
            msg = body.get("message") or body.get("error") or body.get("text") or r.text
            raise EngineError(f"SGLang server {b.url}: POST {path} -> HTTP {r.status_code}: {str(msg)[:500]}")
        return body

    async def _get_json(self, b: Backend, path: str, timeout_s: float = 10.0) -> dict:
        assert self._client is not None
        try:
            r = await self._client.get(b.url + path, timeout=timeout_s)
            r.raise_for_status()
            return r.json()
        except (httpx.HTTPError, ValueError) as e:
            raise EngineError(f"SGLang server {b.url}: GET {path} failed: {type(e).__name__}: {e}") from e

    async def post_all(self, path: str, payload: dict, *, timeout_s: float | None = None) -> list[dict]:
        """POST ``payload`` to ``path`` on every server (waiting out restarts in progress; a server
        found dead is recovered as for ``/generate`` and asked once more); the answers in server
        order. Raises EngineError naming each server that failed and why."""
        await self.start()

        async def one(b: Backend) -> dict:
            async with b.lock:
                epoch = b.epoch
            try:
                return await self._post(b, path, payload, timeout_s)
            except EngineError as e:  # the server died since its last request: recover, then once more
                if not isinstance(e.__cause__, httpx.TransportError) or not await self._recover(b, epoch):
                    raise
            return await self._post(b, path, payload, timeout_s)

        results = await asyncio.gather(*(one(b) for b in self.router.backends), return_exceptions=True)
        if path.startswith("/update_weights_from"):  # the servers it reached now hold current weights
            for b, r in zip(self.router.backends, results):
                b.serves_stale = b.serves_stale and isinstance(r, BaseException)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise EngineError("; ".join(str(e) for e in errors))
        return list(results)  # type: ignore[arg-type]

    async def _push_version(self, b: Backend, version: int | None = None) -> None:
        if version is None and b.serves_stale:
            return  # keep stamping its tokens with the version it really serves
        v = str(self._version if version is None else version)
        if b.pushed_version != v:
            await self._post(b, "/update_weight_version", {"new_version": v, "abort_all_requests": False}, 30.0)
            b.pushed_version = v

    async def pause(self) -> None:
        """Stop generating on every server: new requests wait in the engine, running ones are
        retracted into the servers' queues (their HTTP requests stay open) until :meth:`resume`."""
        await self.start()
        self._paused = True
        assert self._running is not None
        self._running.clear()
        await self.post_all("/pause_generation", {"mode": "retract"})

    async def resume(self) -> None:
        """Tell every server the current policy version, then continue generation."""
        await self.start()
        errors = await asyncio.gather(*(self._push_version(b) for b in self.router.backends), return_exceptions=True)
        bad = [e for e in errors if isinstance(e, BaseException)]
        await self.post_all("/continue_generation", {})
        self._paused = False
        assert self._running is not None
        self._running.set()
        if bad:
            raise EngineError("; ".join(str(e) for e in bad))

    async def flush_cache(self) -> None:
        """Drop every server's prefix cache (SGLang refuses while requests run: pause first)."""
        await self.post_all("/flush_cache", {})

    async def server_stats(self) -> dict[str, float]:
        """Numbers for metrics: the server side from SGLang's ``/v1/loads`` (keys documented in
        :func:`agentrl.engine.sglang.wire.load_stats`: KV-cache use, running/waiting requests, cache
        hit rate, throughput), plus ``engine/servers``, ``engine/inflight`` (requests this engine
        awaits) and the counters since start ``engine/resends``, ``engine/restarts``,
        ``engine/connect_errors``, ``engine/lost``, ``engine/http_errors``."""
        await self.start()
        loads = await asyncio.gather(
            *(self._get_json(b, "/v1/loads", 10.0) for b in self.router.backends), return_exceptions=True
        )
        out = load_stats(loads)
        out["engine/servers"] = float(len(self.router.backends))
        out["engine/inflight"] = float(sum(b.inflight for b in self.router.backends))
        out["engine/resends"] = float(self.resends)
        totals = self.router.totals()
        for k in ENGINE_COUNTERS:
            out["engine/" + k] = float(totals[k])
        return out
