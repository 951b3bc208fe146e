"""Calls to one SGLang server besides ``/generate``: the :class:`Admin` an SGLang engine holds.

Owns: POST/GET to one server with errors mapped to EngineError, the ``/health`` probe, pushing a
version label (``/update_weight_version``, skipped when the server already has it). Its state is the
engine's ``httpx.AsyncClient`` (given at ``start``, one per event loop) and the default timeout.
Does not send ``/generate`` requests, recover a server (:mod:`agentrl.engine.sglang.supervision`)
or decide which label to push or when to pause (the engine and the weight syncs do).
"""

from __future__ import annotations

import httpx

from agentrl.engine.router import Backend
from agentrl.errors import EngineError


class Admin:
    """Admin calls to one server at a time (see the module docstring). ``client`` is set by the
    engine when it starts; ``request_timeout_s`` is the timeout of a POST given none."""

    def __init__(self, request_timeout_s: float) -> None:
        self.request_timeout_s = request_timeout_s
        self.client: httpx.AsyncClient | None = None

    async def post(self, b: Backend, path: str, payload: dict, timeout_s: float | None) -> dict:
        assert self.client is not None
        try:
            r = await self.client.post(
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

    async def get_json(self, b: Backend, path: str, timeout_s: float = 10.0) -> dict:
        assert self.client is not None
        try:
            r = await self.client.get(b.url + path, timeout=timeout_s)
            r.raise_for_status()
            return r.json()
        except (httpx.HTTPError, ValueError) as e:
            raise EngineError(f"SGLang server {b.url}: GET {path} failed: {type(e).__name__}: {e}") from e

    async def probe(self, b: Backend, timeout_s: float = 5.0) -> bool:
        """Whether ``b`` answers ``/health`` with 200."""
        assert self.client is not None
        try:
            return (await self.client.get(b.url + "/health", timeout=timeout_s)).status_code == 200
        except (httpx.HTTPError, RuntimeError):
            return False

    async def push_label(self, b: Backend, version: int) -> None:
        """Set ``b``'s ``weight_version`` to ``str(version)`` unless it was pushed already."""
        v = str(version)
        if b.pushed_version != v:
            await self.post(b, "/update_weight_version", {"new_version": v, "abort_all_requests": False}, 30.0)
            b.pushed_version = v
