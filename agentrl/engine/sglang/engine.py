"""The SGLang rollout engine: token ids in, sampled ids + logprobs out, over SGLang's HTTP API.

Owns: attaching to running servers by URL or supervising :class:`SGLangServer` processes (restarting
a dead one), one shared ``httpx.AsyncClient`` sized for thousands of requests in flight, routing
(:mod:`agentrl.engine.router`: least-loaded, sticky per session), ``/generate`` requests and the
mapping of their answers to :class:`Generation`, pause/resume/flush around weight updates and
server stats for metrics. It holds its parts and drives them: a :class:`Supervisor`
(:mod:`agentrl.engine.sglang.supervision`: crash recovery, health checks, a call on every server)
and an :class:`Admin` (:mod:`agentrl.engine.sglang.admin`: calls to one server besides
``/generate``); they share the :class:`Served` record (policy version, weights on disk) the engine
sets and do not know the engine (the supervisor is handed the ``/health`` probe as a function: the
engine's ``_probe``, which ``agentrl.distributed``'s client overrides). Does not: launch flags (the launcher,
``agentrl.engine.sglang.server``), choose or run weight-sync paths (``agentrl.weights`` drives this
engine through ``pause``/``post_all``/``resume``; the seam's own ``update_weights`` goes through
disk, ``agentrl.engine.sglang.disk``), render chat.

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
Health checks every ``Supervisor.HEALTH_INTERVAL_S`` restart a supervised server that died while idle (and
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
from agentrl.engine.sglang.handle import ServerHandle
from agentrl.engine.sglang.server import SGLangServer
from agentrl.engine.sglang.supervision import Served, Supervisor
from agentrl.engine.sglang.wire import ENGINE_COUNTERS, load_stats, model_limits, sampling_params, to_generation
from agentrl.errors import EngineError

log = logging.getLogger(__name__)

_ENGINE_KWARGS = ("max_connections", "request_timeout_s", "retries", "backoff_s", "restart_dead", "max_context")


class SGLangEngine(Engine):
    """Drives one or many SGLang servers. ``urls``: attach to running servers; ``servers``: supervise
    these :class:`ServerHandle` objects (an :class:`SGLangServer` or a Ray actor's server; restarted
    when they die if ``restart_dead``; not stopped by :meth:`close` unless the engine launched them
    with :meth:`launch`). Its parts: ``router``, ``admin`` (:class:`Admin`), ``supervisor``
    (:class:`Supervisor`) and ``served`` (:class:`Served`)."""

    def __init__(
        self,
        urls: Sequence[str] = (),
        *,
        servers: Sequence[ServerHandle] = (),
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
        self.router = Router([s.url for s in servers] if servers else list(urls))
        self.max_connections, self.request_timeout_s = max_connections, request_timeout_s
        self.retries, self.backoff_s = retries, backoff_s
        self.served = Served()
        self.admin = Admin(request_timeout_s)
        # _probe stays the engine's so that a client of servers launched elsewhere can override it
        self.supervisor = Supervisor(
            self.router, dict(enumerate(servers)), self.admin, self.served, restart_dead=restart_dead, probe=self._probe
        )
        self._max_context = max_context
        self._vocab: int | None = None
        self._owned = False
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: asyncio.Event | None = None  # cleared while paused
        self._paused = False
        self._closed = False
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        #: requests that were re-sent after a loss (each at most once)
        self.resends = 0
        #: one weight stager per server, able to write on its node (``agentrl.weights.object_store``);
        #: set by whoever launched the servers elsewhere (distributed mode), else none
        self.weight_stagers: list[Any] = []

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
        return self.served.policy

    def set_policy_version(self, v: int) -> None:
        """Stamp tokens sampled from now on with ``v``; servers learn it at the next :meth:`resume`."""
        self.served.policy = int(v)

    def note_weights(self, path: str | Path, version: int) -> None:
        """Record that ``path`` (an HF dir loadable by ``/update_weights_from_disk``) holds the weights
        of ``version``: a server restarted after a crash loads it before taking requests."""
        self.served.weights_path, self.served.weights_version = str(path), int(version)

    @property
    def weights_path(self) -> str | None:
        """The checkpoint a restarted server reloads (:meth:`note_weights`), if any."""
        return self.served.weights_path

    @property
    def weights_version(self) -> int | None:
        return self.served.weights_version

    @property
    def max_context(self) -> int | None:
        servers = self.supervisor.servers
        if self._max_context is None and servers:
            self._max_context, self._vocab = model_limits(servers[0].model_path)
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
            self.admin.client = self._client
            self._running = asyncio.Event()
            if not self._paused:
                self._running.set()
            for b in self.router.backends:  # fresh locks for this loop
                b.lock = asyncio.Lock()
                self.supervisor.follow(b)
            await self._learn_limits()
            self.served.base = self.served.policy
            await asyncio.gather(*(self._push_version(b) for b in self.router.backends), return_exceptions=True)
            self.supervisor.watch()
            self._started = True

    async def close(self) -> None:
        self._closed = True
        if self._running is not None:
            self._running.set()  # wake requests waiting on a pause; they then fail as closed
        self.supervisor.close()
        if self._client is not None:
            await self._client.aclose()
        if self._owned:
            await asyncio.gather(*(asyncio.to_thread(s.stop) for s in self.supervisor.servers.values()))

    async def _learn_limits(self) -> None:
        """max_context and vocab size: given, else the model's config.json, else the server's limits."""
        mc, vocab = self._max_context, None
        servers = self.supervisor.servers
        path = servers[0].model_path if servers else None
        info = None
        if path is None:
            for b in self.router.backends:
                try:
                    info = await self.admin.get_json(b, "/server_info", timeout_s=10.0)
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
        gen = to_generation(data, backend.url, self.served.policy)
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
                if not await self.supervisor.recover(b, epoch):
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
                if not await self.supervisor.recover(b, epoch):
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

    # --- admin: weight updates and metrics ----------------------------------------------------
    async def post_all(self, path: str, payload: dict, *, timeout_s: float | None = None) -> list[dict]:
        """POST ``payload`` to ``path`` on every server (:meth:`Supervisor.post_all`: a server found
        dead is recovered and asked once more); the answers in server order."""
        await self.start()
        return await self.supervisor.post_all(path, payload, timeout_s=timeout_s)

    async def _probe(self, b: Backend, timeout_s: float = 5.0) -> bool:
        return await self.admin.probe(b, timeout_s)

    async def _push_version(self, b: Backend, version: int | None = None) -> None:
        """Tell ``b`` the version it serves: ``version``, else the policy version unless ``b`` was
        restarted without the current weights (it keeps stamping with the version it really serves)."""
        if version is None and b.serves_stale:
            return
        await self.admin.push_label(b, self.served.policy if version is None else version)

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
            *(self.admin.get_json(b, "/v1/loads", 10.0) for b in self.router.backends), return_exceptions=True
        )
        out = load_stats(loads)
        out["engine/servers"] = float(len(self.router.backends))
        out["engine/inflight"] = float(sum(b.inflight for b in self.router.backends))
        out["engine/resends"] = float(self.resends)
        totals = self.router.totals()
        for k in ENGINE_COUNTERS:
            out["engine/" + k] = float(totals[k])
        return out
