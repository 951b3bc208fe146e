"""The SGLang rollout engine: token ids in, sampled ids + logprobs out, over SGLang's HTTP API.

Owns: attaching to running servers by URL or supervising :class:`SGLangServer` processes (restarting
a dead one), one shared ``httpx.AsyncClient`` sized for thousands of requests in flight, routing
(:mod:`agentrl.engine.router`: least-loaded, sticky per session), ``/generate`` requests and the
mapping of their answers to :class:`Generation`, crash recovery (the :class:`Supervision` mixin in
:mod:`agentrl.engine.sglang.supervision`), and admin calls to every server (the :class:`Admin`
mixin in :mod:`agentrl.engine.sglang.admin`: pause/resume/flush around weight updates, server stats
for metrics). Does not: launch flags (the launcher, ``agentrl.engine.sglang.server``), choose or
run weight-sync paths (``agentrl.weights`` drives this engine through ``pause``/``post_all``/
``resume``; the seam's own ``update_weights`` goes through disk, ``agentrl.engine.sglang.disk``),
render chat.

Conventions (match :class:`agentrl.engine.local.engine.LocalEngine` where SGLang allows):

- Ids and logprobs are SGLang's ``output_ids`` / ``meta_info.output_token_logprobs``, never
  re-tokenized. A matched stop id is kept in ``token_ids`` (SGLang keeps it; checked per answer).
- SGLang stops on ``stop_token_ids`` AND on the model's eos ids (``ignore_eos`` would disable both),
  so unlike LocalEngine an eos id missing from ``stop_token_ids`` still stops a request.
- Stop strings (``params.stop``) go as SGLang's ``stop``; SGLang searches the decoded tail of the
  output as LocalEngine does, and with ``no_stop_trim`` the matched token stays in ``output_ids``.
- ``seed`` is sent as ``sampling_seed``; SGLang honours it only when the server runs with
  ``--enable-deterministic-inference``.
- Per-token versions come from SGLang's ``meta_info.weight_versions`` spans. The engine keeps every
  server's ``weight_version`` equal to ``str(policy_version)`` (pushed at start and on ``resume``);
  a span that is not an integer is stamped with ``policy_version``.
- ``pause`` uses SGLang's ``retract`` mode: running requests go back to the server's queue and their
  HTTP requests stay open; after ``resume`` they continue (their K/V recomputed, so the cache can be
  flushed in between). ``abort`` mode would end them; ``in_place`` forbids flushing the cache.

Failures: a request never delivered (connection refused) is retried ``retries`` times with
exponential backoff. A request delivered and then lost (the connection died: the server crashed) is
re-sent exactly once, after the server is restarted (supervised) or to another healthy server
(attached); a second loss, a non-200 answer or a timeout raise EngineError naming the server.
Health checks every ``HEALTH_INTERVAL_S`` restart a supervised server that died while idle (and
retry a failed restart; requests do not wait on one) and bring an attached server back when its
``/health`` answers. A restarted server reloads ``weights_path`` (:meth:`note_weights`) when set,
else it serves its original weights and keeps that version label, so stamps stay honest. A
supervised server whose port another program took is launched on a fresh one; the engine follows
its URL (at ``start`` and after a restart).
Prompt ids outside the vocabulary are refused here: SGLang 0.5.23's scheduler dies on them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from agentrl.engine.base import Engine, Generation, SamplingParams, check_prompt
from agentrl.engine.router import Backend, Router
from agentrl.engine.sglang.admin import Admin
from agentrl.engine.sglang.disk import load_from_disk
from agentrl.engine.sglang.server import SGLangServer
from agentrl.engine.sglang.supervision import Supervision
from agentrl.engine.sglang.wire import model_limits, sampling_params, to_generation
from agentrl.errors import EngineError

log = logging.getLogger(__name__)

_ENGINE_KWARGS = ("max_connections", "request_timeout_s", "retries", "backoff_s", "restart_dead", "max_context")


class SGLangEngine(Supervision, Admin, Engine):
    """Drives one or many SGLang servers. ``urls``: attach to running servers; ``servers``: supervise
    these :class:`SGLangServer` objects (restarted when they die if ``restart_dead``; not stopped
    by :meth:`close` unless the engine launched them with :meth:`launch`)."""

    #: seconds between health checks of the servers (restarts a supervised server that died idle)
    HEALTH_INTERVAL_S = 5.0
    #: a supervised server restarted this many times is left dead (its requests then fail)
    MAX_RESTARTS = 5

    def __init__(
        self,
        urls: Sequence[str] = (),
        *,
        servers: Sequence[SGLangServer] = (),
        max_connections: int = 2048,
        request_timeout_s: float = 600.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        restart_dead: bool = True,
        max_context: int | None = None,
    ) -> None:
        if bool(urls) == bool(servers):
            raise EngineError("SGLangEngine needs either urls= (attach) or servers= (supervise), not both or neither")
        if max_connections < 1 or request_timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise EngineError(
                f"bad SGLangEngine limits: max_connections={max_connections}, "
                f"request_timeout_s={request_timeout_s}, retries={retries}, backoff_s={backoff_s}"
            )
        self._servers = {i: s for i, s in enumerate(servers)}
        self.router = Router([s.url for s in servers] if servers else list(urls))
        self.max_connections, self.request_timeout_s = max_connections, request_timeout_s
        self.retries, self.backoff_s, self.restart_dead = retries, backoff_s, restart_dead
        self._max_context = max_context
        self._vocab: int | None = None
        self._version = 0
        self._base_version = 0  # what a server serves right after (re)starting from its model path
        #: a full checkpoint of the served weights on disk (set by weight syncs through
        #: :meth:`note_weights`); a restarted server reloads it instead of serving stale weights
        self.weights_path: str | None = None
        self.weights_version: int | None = None
        self._owned = False
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: asyncio.Event | None = None  # cleared while paused
        self._paused = False
        self._closed = False
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self._monitor: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        #: requests that were re-sent after a loss (each at most once)
        self.resends = 0

    @classmethod
    def launch(
        cls, model_path: str | Path, *, num_servers: int = 1, device: str = "cpu", **server_kwargs: Any
    ) -> SGLangEngine:
        """Start ``num_servers`` SGLang servers on ``model_path`` (in parallel) and return an engine
        that owns them: :meth:`close` stops them. Keyword arguments named like the constructor's
        (``retries``, ``max_context``, ...) go to the engine, the rest to :class:`SGLangServer`."""
        if num_servers < 1:
            raise EngineError(f"num_servers must be >= 1, got {num_servers}")
        ekw = {k: server_kwargs.pop(k) for k in _ENGINE_KWARGS if k in server_kwargs}
        server_kwargs.setdefault("reap_with_owner", True)  # no server outlives a SIGKILLed owner
        servers = [SGLangServer(model_path, device=device, **server_kwargs) for _ in range(num_servers)]
        try:
            for s in servers:
                s.start(wait=False)
            for s in servers:
                s.wait_ready()
        except BaseException:
            for s in servers:
                s.kill()
            raise
        eng = cls(servers=servers, **ekw)
        eng._owned = True
        return eng

    # --- properties ---------------------------------------------------------------------------
    @property
    def urls(self) -> list[str]:
        return [b.url for b in self.router.backends]

    @property
    def policy_version(self) -> int:  # type: ignore[override]
        return self._version

    def set_policy_version(self, v: int) -> None:
        """Stamp tokens sampled from now on with ``v``; servers learn it at the next :meth:`resume`."""
        self._version = int(v)

    def note_weights(self, path: str | Path, version: int) -> None:
        """Record that ``path`` (an HF dir loadable by ``/update_weights_from_disk``) holds the weights
        of ``version``: a server restarted after a crash loads it before taking requests."""
        self.weights_path, self.weights_version = str(path), int(version)

    @property
    def max_context(self) -> int | None:
        if self._max_context is None and self._servers:
            self._max_context, self._vocab = model_limits(self._servers[0].model_path)
        return self._max_context

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._closed:
            raise EngineError("the SGLang engine is closed")
        if self._started and self._loop is loop:
            return
        if self._start_lock is None or self._loop is not loop:
            self._start_lock, self._loop = asyncio.Lock(), loop
            self._started = False
        async with self._start_lock:
            if self._started:
                return
            self._client = httpx.AsyncClient(
                limits=httpx.Limits(
                    max_connections=self.max_connections, max_keepalive_connections=self.max_connections
                ),
                timeout=httpx.Timeout(self.request_timeout_s, connect=10.0, pool=self.request_timeout_s),
            )
            self._running = asyncio.Event()
            if not self._paused:
                self._running.set()
            for b in self.router.backends:  # fresh locks for this loop
                b.lock = asyncio.Lock()
                self._follow_server(b)
            await self._learn_limits()
            self._base_version = self._version
            await asyncio.gather(*(self._push_version(b) for b in self.router.backends), return_exceptions=True)
            self._monitor = asyncio.create_task(self._watch())
            self._started = True

    async def close(self) -> None:
        self._closed = True
        if self._running is not None:
            self._running.set()  # wake requests waiting on a pause; they then fail as closed
        for t in [self._monitor, *self._tasks]:
            if t is not None:
                t.cancel()
        if self._client is not None:
            await self._client.aclose()
        if self._owned:
            await asyncio.gather(*(asyncio.to_thread(s.stop) for s in self._servers.values()))

    async def _learn_limits(self) -> None:
        """max_context and vocab size: given, else the model's config.json, else the server's limits."""
        mc, vocab = self._max_context, None
        path = self._servers[0].model_path if self._servers else None
        info = None
        if path is None:
            for b in self.router.backends:
                try:
                    info = await self._get_json(b, "/server_info", timeout_s=10.0)
                    path = info.get("model_path")
                    break
                except EngineError as e:
                    b.healthy = False
                    log.warning("%s", e)
        pos, vocab = model_limits(path)
        if mc is None:
            mc = pos if pos is not None else (info or {}).get("max_req_input_len")
        self._max_context, self._vocab = mc, vocab

    # --- generation ---------------------------------------------------------------------------
    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, session: str | None = None
    ) -> Generation:
        await self.start()
        prompt = [int(t) for t in prompt_ids]  # a copy: the caller's list keeps growing
        check_prompt(prompt, self._vocab, self._max_context)
        n = params.max_new_tokens
        if self._max_context is not None:
            n = min(n, self._max_context - len(prompt))
        payload = {"input_ids": prompt, "sampling_params": sampling_params(params, n), "return_logprob": True}
        data, backend, resent = await self._send_generate(payload, session)
        gen = to_generation(data, backend.url, self._version)
        gen.info["resent"] = resent
        return gen

    async def _gate(self) -> None:
        assert self._running is not None
        await self._running.wait()
        if self._closed:
            raise EngineError("the SGLang engine is closed")

    async def _send_generate(self, payload: dict, session: str | None) -> tuple[dict, Backend, bool]:
        assert self._client is not None
        resent, connect_failures = False, 0
        exclude: set[Backend] = set()
        while True:
            await self._gate()
            b = self.router.pick(session, exclude)
            async with b.lock:  # waits while this server restarts
                epoch = b.epoch
            b.inflight += 1
            b.counts["sent"] += 1
            if resent:
                b.counts["resent"] += 1
            try:
                resp = await self._client.post(b.url + "/generate", json=payload)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:  # never delivered: retry with backoff
                b.counts["connect_errors"] += 1
                connect_failures += 1
                if self._closed or connect_failures > self.retries:
                    raise EngineError(
                        f"SGLang server {b.url} unreachable after {connect_failures} tries: {type(e).__name__}: {e}"
                    ) from e
                if not await self._recover(b, epoch):
                    exclude.add(b)
                await asyncio.sleep(self.backoff_s * 2 ** (connect_failures - 1))
                continue
            except httpx.TimeoutException as e:
                raise EngineError(
                    f"SGLang server {b.url} did not answer /generate within {self.request_timeout_s}s"
                ) from e
            except httpx.TransportError as e:  # delivered, then lost: re-send once
                b.counts["lost"] += 1
                if self._closed:
                    raise EngineError("the SGLang engine was closed during the request") from e
                if resent:
                    raise EngineError(
                        f"SGLang server {b.url} lost the request again after its one re-send: {type(e).__name__}: {e}"
                    ) from e
                resent = True
                self.resends += 1
                if not await self._recover(b, epoch):
                    exclude.add(b)
                continue
            except RuntimeError as e:  # httpx after aclose()
                raise EngineError(f"the SGLang engine was closed: {e}") from e
            finally:
                b.inflight -= 1
            if resp.status_code != 200:
                b.counts["http_errors"] += 1
                raise EngineError(
                    f"SGLang server {b.url} answered /generate with HTTP {resp.status_code}: {resp.text[:500]}"
                )
            try:
                data = resp.json()
            except ValueError as e:
                b.counts["http_errors"] += 1
                raise EngineError(f"SGLang server {b.url} answered /generate with non-JSON: {resp.text[:300]}") from e
            b.counts["ok"] += 1
            return data, b, resent

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Through a checkpoint on disk (:func:`agentrl.engine.sglang.disk.load_from_disk`); the weight
        syncs in ``agentrl.weights`` drive this engine for the other paths."""
        await load_from_disk(self, state_dict, version)
