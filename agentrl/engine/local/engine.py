"""The in-process rollout engine: HF transformers with continuous batching.

Owns a worker thread that runs the model (so the event loop stays free for thousands of episodes)
and, every iteration: applies pending weight updates, admits waiting requests up to
``max_batch_size`` (one left-padded prefill per group of prompts), runs ONE decode step for every
sequence in flight over a batched K/V cache (:mod:`agentrl.engine.local.kv_batch`), samples, and retires
finished sequences. Requests join and leave at every step, so a short request never waits for the
longest one in flight. Results go back to the caller's event loop with ``call_soon_threadsafe``.
The request records and that hand-off are :mod:`agentrl.engine.local.requests`; the sampling of
one token per row is :mod:`agentrl.engine.local.sampling`.

Conventions (the same as SGLang's ``return_logprob``):

- ``logprobs`` are those of the distribution sampled from after temperature scaling and *before*
  top-k/top-p filtering; at temperature 0 (greedy) those of the unscaled softmax.
- Stop ids are ``params.stop_token_ids`` when given, else the engine's eos ids (the model's
  generation config, or ``eos_token_ids=`` at construction; ``()`` never stops on eos). A sampled
  stop id is kept in ``token_ids`` and ends the request with "stop"; ``max_new_tokens`` or
  ``max_context`` (prompt + completion) ends it with "length".
- Stop strings (``params.stop``): after every sampled token the tail of the request's sampled ids
  is decoded (enough tokens to hold the longest string: one token per UTF-8 byte, plus one) and
  searched; a hit ends the request with "stop", that token kept and nothing trimmed. Decoding needs
  the tokenizer: ``tokenizer=`` at construction, else loaded from the model's directory the first
  time a request brings stop strings (an engine over an in-memory model without one refuses them).
- ``params.seed`` gives the request its own ``torch.Generator``: its samples do not depend on what
  else is in the batch. Unseeded requests share the engine's generator (seeded by ``seed=``).
- ``update_weights`` copies tensors into the model in place between two decode steps. Sequences in
  flight keep the K/V their prefix got from the old weights (as SGLang does without a cache flush);
  every token is stamped with the version of the weights that sampled it.
- ``session`` (one per episode) keys a prefix cache (:mod:`agentrl.engine.local.prefix_cache`): a finished
  request leaves its K/V there and the session's next one prefills only the tokens after the prefix
  they share (:mod:`agentrl.engine.local.prefill`): O(T), not O(T^2), prefill for T turns, the same
  tokens and logprobs up to float rounding. Prompts are shared across sessions too: a prefilled
  prompt's K/V stay in the cache for any request that starts the same way (GRPO siblings, the system
  prompt and tool block every task repeats), and requests admitted together that share a long
  prefix prefill it once (the others wait a round). A weight update flushes it (as SGLang's flush_cache).

Does not: page the K/V cache, run on several devices, support
sliding-window attention, or guard a model shared with a trainer that mutates it while generating.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agentrl.common.cores import CoreShare
from agentrl.engine.base import Engine, Generation, SamplingParams, check_prompt
from agentrl.engine.local import requests as local_requests
from agentrl.engine.local.kv_batch import KVBatch, additive_mask
from agentrl.engine.local.narrow_linears import NarrowLinears
from agentrl.engine.local.prefill import PrefillBatch, build_prefill, defer_followers, plan_groups, sharing_pays
from agentrl.engine.local.prefix_cache import CachedPrefix, PrefixCache
from agentrl.engine.local.requests import LocalRequest, WeightUpdate, check_update, deliver, notify
from agentrl.engine.local.sampling import filter_top_k_top_p, sample_tokens
from agentrl.errors import EngineError
from agentrl.models.device import choose

_SUPPORTED_ATTENTION = ("sdpa", "eager")

__all__ = ["LocalEngine", "filter_top_k_top_p", "placement"]


def placement(device: str | torch.device, dtype: torch.dtype | str) -> tuple[str, torch.dtype]:
    """(device, torch dtype) the engine loads a model with; ``auto`` resolved by
    ``agentrl.models.device.choose`` (ConfigError names a bad value)."""
    name = str(dtype).removeprefix("torch.")
    device, name = choose(str(device), name, torch.cuda.is_available(), what="model")
    return device, getattr(torch, name)


def cache_kwarg(model) -> str:
    """The model forward's name for the KV cache: ``cache`` in newer transformers (which deprecate
    ``past_key_values``, warning on every call), ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class LocalEngine(Engine):
    """Continuous-batching engine over an HF causal LM (tested with Qwen2) in this process."""

    def __init__(
        self,
        model: Any,
        *,
        device: str | torch.device = "auto",
        dtype: torch.dtype | str = "auto",
        max_batch_size: int = 64,
        max_context: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
        prefill_tokens: int = 8192,
        seed: int = 0,
        tokenizer: Any | None = None,
        prefix_cache_tokens: int = 32768,
        linear_dtype: torch.dtype | str | None = None,
    ) -> None:
        """``model``: a path to an HF directory (loaded with ``dtype`` on ``device``) or an already
        loaded ``PreTrainedModel``, used as is and shared, not copied (``device``/``dtype`` ignored).
        ``device``/``dtype`` ``auto``: cuda + bfloat16 when a CUDA GPU is visible, else cpu + float32
        (``placement``). ``prefill_tokens`` bounds the padded tokens of one prefill forward.
        ``tokenizer`` (anything with ``decode(ids) -> str``) is only used for stop strings; when
        ``model`` is a path it defaults to that directory's tokenizer, loaded on first use.
        ``prefix_cache_tokens`` caps the tokens whose K/V the per-session prefix cache keeps (0: off).
        ``linear_dtype`` (e.g. bfloat16 under a float32 model): the linear layers' weights and products in
        that dtype, converted in place, while activations, attention, the K/V and the logits keep the
        model's (``NarrowLinears``); None or the model's own dtype: unchanged."""
        self._tokenizer = tokenizer
        self._tokenizer_dir = str(model) if isinstance(model, (str, Path)) else None
        if isinstance(model, (str, Path)):
            from transformers import AutoModelForCausalLM

            device, dtype = placement(device, dtype)
            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype, attn_implementation="sdpa")
            model.to(device).eval()
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        cfg = model.config
        attn = getattr(cfg, "_attn_implementation", "sdpa")
        if attn not in _SUPPORTED_ATTENTION:
            raise EngineError(f"attention implementation {attn!r} is not supported; use one of {_SUPPORTED_ATTENTION}")
        if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
            raise EngineError(f"only full-attention models are supported, got layer_types={cfg.layer_types}")
        self.model = model
        self._dtype = next(model.parameters()).dtype  # activations, K/V and masks, whatever the linears hold
        self._narrow = self._narrow_linears(model, linear_dtype)
        self._cache_arg = cache_kwarg(model)
        self.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.prefill_tokens = prefill_tokens
        self._max_context = int(max_context or cfg.max_position_embeddings)
        self._vocab = int(cfg.vocab_size)
        if eos_token_ids is None:
            gen_cfg = getattr(model, "generation_config", None)
            eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
            eos = cfg.eos_token_id if eos is None else eos
            eos_token_ids = () if eos is None else ([eos] if isinstance(eos, int) else eos)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids or ())  # or (): the config said None
        self._gen = torch.Generator().manual_seed(seed)
        self._version = 0
        self._cond = threading.Condition()
        self._waiting: deque[LocalRequest] = deque()
        self._updates: list[WeightUpdate] = []
        self._rows: list[LocalRequest] = []  # row i of the K/V cache is self._rows[i]
        self._admitted: list[LocalRequest] = []  # taken from the queue, not yet in rows
        self._kv = KVBatch(max_rows=max_batch_size, max_cols=self._max_context)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._dead: BaseException | None = None
        self._prefix = PrefixCache(prefix_cache_tokens)
        #: the CPU cores this engine shares with a trainer in the same process (None: torch's setting as is);
        #: set before start, e.g. by ``agentrl run``
        self.cores: CoreShare | None = None
        #: counters for tests and metrics; prefilled_tokens counts the prompt tokens computed (not
        #: reused); prefix_*: the prefix cache's hits, tokens_reused, evictions, flushes
        self.stats = {"steps": 0, "prefills": 0, "generated_tokens": 0, "prefilled_tokens": 0}
        self._sync_prefix_stats()

    def _narrow_linears(self, model: Any, linear_dtype: torch.dtype | str | None) -> NarrowLinears | None:
        if linear_dtype is None:
            return None
        name = str(linear_dtype).removeprefix("torch.")
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"linear_dtype {linear_dtype!r} is not a floating dtype (bfloat16, float16, float32)")
        return None if dtype == self._dtype else NarrowLinears(model, dtype)

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: Any) -> LocalEngine:
        return cls(path, **kwargs)

    @property
    def policy_version(self) -> int:  # type: ignore[override]
        return self._version

    @property
    def max_context(self) -> int:
        return self._max_context

    # --- asyncio side -------------------------------------------------------------------------
    async def start(self) -> None:
        with self._cond:
            self._check_usable()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="agentrl-local-engine", daemon=True)
                self._thread.start()

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, session: str | None = None
    ) -> Generation:
        return await self._submit(prompt_ids, params, None, session)

    async def generate_streaming(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        on_token: Callable[[int, float], None],
        *,
        session: str | None = None,
    ) -> Generation:
        return await self._submit(prompt_ids, params, on_token, session)

    async def _submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        on_token: Callable[[int, float], None] | None,
        session: str | None,
    ) -> Generation:
        prompt = [int(t) for t in prompt_ids]
        check_prompt(prompt, self._vocab, self._max_context)
        if params.stop and self._tokenizer is None:  # load it here, not on the worker thread
            await asyncio.to_thread(self._stop_decoder)
        await self.start()
        loop = asyncio.get_running_loop()
        gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        req = LocalRequest(
            prompt=prompt,
            params=params,
            stop_ids=frozenset(params.stop_token_ids or self.eos_token_ids),
            limit=min(params.max_new_tokens, self._max_context - len(prompt)),
            loop=loop,
            future=loop.create_future(),
            generator=gen,
            stop_strs=params.stop,
            stop_window=max((len(s.encode()) for s in params.stop), default=0) + 1,
            on_token=on_token,
            session=session,
        )
        with self._cond:
            self._check_usable()
            self._waiting.append(req)
            self._cond.notify()
        try:
            return await req.future
        except asyncio.CancelledError:
            req.cancelled = True  # the worker drops it at its next step
            raise

    def _stop_decoder(self) -> Any:
        """The tokenizer stop strings are decoded with (loaded from the model dir on first use)."""
        if self._tokenizer is None:
            self._tokenizer = local_requests.load_stop_tokenizer(self._tokenizer_dir)
        return self._tokenizer

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        check_update(self.model.state_dict(keep_vars=True), state_dict)
        await self.start()
        loop = asyncio.get_running_loop()
        upd = WeightUpdate(state_dict, int(version), loop, loop.create_future())
        with self._cond:
            self._check_usable()
            self._updates.append(upd)
            self._cond.notify()
        await upd.future

    async def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join)
        self._prefix.clear()  # the worker is gone: free the cached K/V now
        self._fail_all(EngineError("the local engine was closed"))

    def _check_usable(self) -> None:
        if self._dead is not None:
            raise EngineError(f"the local engine worker crashed: {self._dead!r}")
        if self._closed:
            raise EngineError("the local engine is closed")

    def _fail_all(self, error: EngineError) -> None:
        with self._cond:
            reqs = [*self._waiting, *self._admitted, *self._rows]
            updates, self._updates = self._updates, []
            self._waiting.clear()
            self._admitted, self._rows = [], []
        for r in reqs:
            deliver(r.loop, r.future, error=error)
        for u in updates:
            deliver(u.loop, u.future, error=error)

    # --- worker thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if self.cores is not None and not (self._waiting or self._rows):
                        self.cores.busy("engine", False)  # idle: the trainer may take every core
                    while not (self._closed or self._waiting or self._rows or self._updates):
                        self._cond.wait()
                    if self._closed:
                        return
                    updates, self._updates = self._updates, []
                    room = self.max_batch_size - len(self._rows)
                    while room > 0 and self._waiting:
                        req = self._waiting.popleft()
                        if not req.cancelled:
                            self._admitted.append(req)
                            room -= 1
                for upd in updates:
                    self._apply_update(upd)
                if self.cores is not None and (self._admitted or self._rows):
                    self.cores.busy("engine", True)
                    self.cores.apply("engine")
                with torch.inference_mode():
                    if self._admitted:
                        self._prefill()
                    self._retire([r for r in self._rows if r.cancelled])
                    if self._rows:
                        self._decode()
        except BaseException as exc:  # never leave a caller hanging
            with self._cond:
                self._dead = exc
            self._fail_all(EngineError(f"the local engine worker crashed: {exc!r}"))

    def _apply_update(self, upd: WeightUpdate) -> None:
        params = self.model.state_dict(keep_vars=True)
        state = dict(upd.state_dict)
        if self._narrow is not None:
            state.update(self._narrow.tied_updates(state))
        with torch.no_grad():
            for name, tensor in state.items():
                params[name].copy_(tensor)
        self._version = upd.version
        self._prefix.clear()  # every cached K/V came from the old weights
        self._sync_prefix_stats()
        deliver(upd.loop, upd.future, None)

    def _sync_prefix_stats(self) -> None:
        self.stats.update({f"prefix_{k}": v for k, v in self._prefix.stats.items()})

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=pos.to(self.device),
            **{self._cache_arg: cache},
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float().cpu()

    def _prefill(self) -> None:
        """Prefill the admitted requests on top of what the prefix cache holds, in rounds: a request
        that shares a long prefix with another admitted one waits for that one's prompt to be
        shared (``defer_followers``)."""
        pending = self._admitted
        while pending:
            found = [self._prefix.match(r.session, r.prompt) for r in pending]
            now, later = list(range(len(pending))), []
            if self._prefix.enabled:
                now, later = defer_followers([r.prompt for r in pending], [n for _, n in found])
            waiting = [pending[i].prompt for i in later]
            share = [sharing_pays(pending[i].prompt, found[i][1], waiting) for i in now]
            self._prefill_round([pending[i] for i in now], [found[i] for i in now], share)
            pending = [pending[i] for i in later]
        self._sync_prefix_stats()

    def _prefill_round(
        self, reqs: list[LocalRequest], found: list[tuple[CachedPrefix | None, int]], share: list[bool]
    ) -> None:
        for idx in plan_groups([len(r.prompt) for r in reqs], [n for _, n in found], self.prefill_tokens):
            group = [reqs[i] for i in idx]
            batch = build_prefill(
                [r.prompt for r in group], [found[i][0] for i in idx], [found[i][1] for i in idx], self._dtype
            )
            logits = self._forward(batch.ids, batch.mask, batch.pos, batch.cache)
            self._kv.add_rows(batch.cache.keys, batch.cache.values, batch.valid)
            self._share_prompts(group, batch, [share[i] for i in idx])
            for i, r, reused in zip(idx, group, batch.reused):
                r.kv_len, r.admitted_step = len(r.prompt), self.stats["steps"]
                r.cached_tokens, r.cache_epoch = reused, self._prefix.epoch
                self._prefix.note_reuse(reused, found[i][0])
                self.stats["prefilled_tokens"] += len(r.prompt) - reused
            self._rows += group
            self._admitted = [r for r in self._admitted if r not in group]
            self.stats["prefills"] += 1
            self._sample(group, logits)

    def _share_prompts(self, group: list[LocalRequest], batch: PrefillBatch, share: list[bool]) -> None:
        """Offer the prompts of a prefill group marked in ``share`` to the prefix cache as shared
        entries (their K/V: each row's last ``len(prompt)`` columns, see ``build_prefill``)."""
        if not self._prefix.enabled:
            return
        layers = sorted(batch.cache.keys)
        for i, (r, keep) in enumerate(zip(group, share)):
            if not keep:
                continue
            n = len(r.prompt)
            keys = tuple(batch.cache.keys[layer][i, :, -n:].clone() for layer in layers)
            values = tuple(batch.cache.values[layer][i, :, -n:].clone() for layer in layers)
            self._prefix.share(CachedPrefix(tuple(r.prompt), keys, values), self._prefix.epoch)

    def _decode(self) -> None:
        rows = self._rows
        ids = torch.tensor([[r.tokens[-1]] for r in rows])
        pos = torch.tensor([[r.kv_len] for r in rows])
        valid = self._kv.begin_step()
        mask = additive_mask(valid.cpu(), self._dtype)[:, None, None, :]
        logits = self._forward(ids, mask, pos, self._kv)
        self._kv.end_step()
        for r in rows:
            r.kv_len += 1
        self.stats["steps"] += 1
        self._sample(rows, logits)

    def _sample(self, reqs: list[LocalRequest], logits: torch.Tensor) -> None:
        """Sample one token per request from ``logits`` [n, V], record it, retire the finished."""
        tokens, chosen = sample_tokens(logits, [r.params for r in reqs], [r.generator for r in reqs], self._gen)
        finished = []
        for r, t, lp_t in zip(reqs, tokens, chosen):
            r.tokens.append(t)
            r.logprobs.append(lp_t)
            r.versions.append(self._version)
            if r.on_token is not None:
                notify(r.loop, r.on_token, t, lp_t)
            if t in r.stop_ids or (r.stop_strs and r.hit_stop_string(self._tokenizer)):
                r.reason = "stop"
            elif len(r.tokens) >= r.limit:
                r.reason = "length"
            if r.reason:
                finished.append(r)
        self.stats["generated_tokens"] += len(reqs)
        self._keep_prefixes(finished)  # before the answers: a caller's next turn finds them
        for r in finished:
            info = {
                "prompt_tokens": len(r.prompt),
                "cached_tokens": r.cached_tokens,
                "admitted_step": r.admitted_step,
                "finished_step": self.stats["steps"],
                "latency_s": time.perf_counter() - r.submitted,
            }
            deliver(r.loop, r.future, Generation(r.tokens, r.logprobs, r.reason, r.versions, info))
        self._retire(finished)

    def _keep_prefixes(self, finished: list[LocalRequest]) -> None:
        """Store the K/V of finished requests that carry a session (and whose K/V are all from
        the current weights) in the prefix cache, before their rows leave the batch."""
        keep = [r for r in finished if r.session is not None and r.cache_epoch == self._prefix.epoch]
        if not keep or not self._prefix.enabled:
            return
        row = {id(r): i for i, r in enumerate(self._rows)}
        for r in keep:
            assert r.session is not None  # keep holds requests with a session
            keys, values = self._kv.row_kv(row[id(r)])
            if keys[0].shape[1] != r.kv_len:
                raise EngineError(f"K/V of a finished row holds {keys[0].shape[1]} tokens, expected {r.kv_len}")
            ids = tuple((r.prompt + r.tokens)[: r.kv_len])
            self._prefix.store(r.session, CachedPrefix(ids, keys, values), r.cache_epoch)
        self._sync_prefix_stats()

    def _retire(self, reqs: list[LocalRequest]) -> None:
        if not reqs:
            return
        for r in reqs:
            r.done = True
        gone = {i for i, r in enumerate(self._rows) if r.done}
        for src, dst in self._kv.remove_rows(gone):
            self._rows[dst] = self._rows[src]
        with self._cond:  # _fail_all reads the rows from the event loop's thread
            del self._rows[self._kv.n :]
