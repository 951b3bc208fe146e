"""LocalEngine's per-session prefix cache: prefilling on top of cached K/V is exact.

Every engine test here runs the same seeded requests through an engine with the cache and one
without (same model), and requires the same tokens and logprobs, plus evidence the cache was used.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from engine_helpers import build_tiny, load_sharp

from agentrl.engine.base import SamplingParams
from agentrl.engine.local.engine import LocalEngine, cache_kwarg
from agentrl.engine.local.prefill import build_prefill
from agentrl.engine.local.prefix_cache import CachedPrefix

NO_STOP = (10**9,)  # never sampled: every request runs to max_new_tokens

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_sharp(build_tiny(tmp_path_factory.mktemp("tiny")))


def rand_ids(n: int, seed: int) -> list[int]:
    return torch.randint(10, 2000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def params(seed: int, n: int = 6) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=1.0, seed=seed, stop_token_ids=NO_STOP)


def assert_same(a, b) -> None:
    assert a.token_ids == b.token_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


# --- the forward itself ----------------------------------------------------------------------
def prefill(model, prompts, prefixes, cached):
    batch = build_prefill(prompts, prefixes, cached, model.dtype)
    with torch.inference_mode():
        out = model(
            input_ids=batch.ids,
            attention_mask=batch.mask,
            position_ids=batch.pos,
            **{cache_kwarg(model): batch.cache},
            use_cache=True,
            logits_to_keep=1,
        )
    return batch, out.logits[:, -1].float()


def cached_prefix(model, ids) -> CachedPrefix:
    batch, _ = prefill(model, [ids], [None], [0])
    keys = tuple(batch.cache.keys[i][0] for i in sorted(batch.cache.keys))
    values = tuple(batch.cache.values[i][0] for i in sorted(batch.cache.values))
    return CachedPrefix(tuple(ids), keys, values)


def test_prefill_on_cached_prefixes_equals_prefill_from_empty(model):
    """One group mixing: a long reuse, a short reuse that must re-feed cached tokens, and a miss."""
    full = [rand_ids(40, 1), rand_ids(30, 2), rand_ids(12, 3)]
    prefixes = [cached_prefix(model, full[0][:35]), cached_prefix(model, full[1][:28]), None]
    cached = [35, 28, 0]  # new tokens 5, 2, 12: P = 12, so row 1 reuses 18 and re-feeds 10
    batch, logits = prefill(model, full, prefixes, cached)
    assert batch.reused == [28, 18, 0]
    for i, ids in enumerate(full):
        alone, ref = prefill(model, [ids], [None], [0])
        torch.testing.assert_close(logits[i], ref[0], atol=1e-4, rtol=1e-4)
        cols = batch.valid[i]
        assert int(cols.sum()) == len(ids)
        for layer in batch.cache.keys:
            torch.testing.assert_close(
                batch.cache.keys[layer][i][:, cols], alone.cache.keys[layer][0], atol=1e-4, rtol=1e-4
            )
            torch.testing.assert_close(
                batch.cache.values[layer][i][:, cols], alone.cache.values[layer][0], atol=1e-4, rtol=1e-4
            )


# --- through the engine ----------------------------------------------------------------------
async def conversation(engine: LocalEngine, sessions: int, turns: int) -> list[list]:
    """``sessions`` episodes interleaved, ``turns`` each: every turn's prompt is the last prompt,
    its completion and a fresh observation of a length that differs per session and turn."""
    prompts = [rand_ids(20 + 7 * s, 100 + s) for s in range(sessions)]
    out: list[list] = [[] for _ in range(sessions)]
    for t in range(turns):
        gens = await asyncio.gather(
            *(engine.generate(prompts[s], params(1000 * s + t), session=f"ep{s}") for s in range(sessions))
        )
        for s, g in enumerate(gens):
            out[s].append(g)
            prompts[s] = prompts[s] + g.token_ids + rand_ids(2 + 3 * s + t, 10 * s + t)
    return out


async def pair(model, **kwargs):
    return LocalEngine(model, prefix_cache_tokens=0, **kwargs), LocalEngine(model, **kwargs)


async def test_multi_turn_interleaved_sessions_are_exact(model):
    plain, cached = await pair(model, max_batch_size=8)
    try:
        want = await conversation(plain, sessions=4, turns=5)
        got = await conversation(cached, sessions=4, turns=5)
        for ws, gs in zip(want, got):
            for w, g in zip(ws, gs):
                assert_same(g, w)
        assert all(g.info["cached_tokens"] == 0 for g in (gs[0] for gs in got))
        assert all(g.info["cached_tokens"] > 0 for gs in got for g in gs[1:])
        assert cached.stats["prefix_hits"] == 4 * 4
        assert (
            cached.stats["prefilled_tokens"] + cached.stats["prefix_tokens_reused"] == plain.stats["prefilled_tokens"]
        )
        assert cached.stats["prefilled_tokens"] < plain.stats["prefilled_tokens"] / 2
        assert plain.stats["prefix_hits"] == 0
    finally:
        await plain.close()
        await cached.close()


async def branches(eng: LocalEngine, base: list[int]) -> tuple[list[int], list]:
    """One session: a first turn, then prompts that extend, diverge from, cut short and repeat
    its history, each after a request that leaves the session a long cached entry again."""
    first = await eng.generate(base, params(1), session="s")
    history = base + first.token_ids
    cases = [
        history + rand_ids(4, 8),  # the next turn
        history[:20] + rand_ids(9, 9),  # diverges at token 20
        base[:12],  # shorter than what is cached
        history,  # a prefix of what is cached
    ]
    results = []
    for i, prompt in enumerate(cases):
        await eng.generate(history + rand_ids(3, 50 + i), params(90 + i), session="s")
        results.append(await eng.generate(prompt, params(2 + i), session="s"))
    return history, results


async def test_partial_match_and_shorter_prompt_are_exact(model):
    plain, cached = await pair(model, max_batch_size=4)
    base = rand_ids(30, 7)
    try:
        _, want = await branches(plain, base)
        history, got = await branches(cached, base)
        for w, g in zip(want, got):
            assert_same(g, w)
        reused = [g.info["cached_tokens"] for g in got]
        assert reused[0] >= len(history) and reused[1] == 20 and reused[2] == 11
        assert reused[3] == len(history) - 1  # the last prompt token is always computed
    finally:
        await plain.close()
        await cached.close()


async def stream_two_turns(eng: LocalEngine):
    """Two streamed turns of one session; the tokens streamed must be those returned."""
    streamed: list[int] = []
    first = await eng.generate_streaming(rand_ids(25, 3), params(5), lambda t, lp: streamed.append(t), session="x")
    prompt = rand_ids(25, 3) + first.token_ids + rand_ids(5, 4)
    second = await eng.generate_streaming(prompt, params(6), lambda t, lp: streamed.append(t), session="x")
    assert streamed == first.token_ids + second.token_ids
    return second


async def test_streaming_requests_use_the_cache(model):
    plain, cached = await pair(model, max_batch_size=4)
    try:
        want, got = await stream_two_turns(plain), await stream_two_turns(cached)
        assert_same(got, want)
        assert got.info["cached_tokens"] == 25 + 6 - 1
    finally:
        await plain.close()
        await cached.close()


async def test_weight_update_flushes_the_cache(model):
    eng = LocalEngine(model, max_batch_size=4)
    p = rand_ids(20, 5)
    try:
        g = await eng.generate(p, params(1), session="s")
        nxt = p + g.token_ids + rand_ids(3, 6)
        await eng.update_weights({"model.norm.weight": model.model.norm.weight.detach().clone()}, version=1)
        assert eng.stats["prefix_flushes"] == 1
        again = await eng.generate(nxt, params(2), session="s")
        assert again.info["cached_tokens"] == 0 and eng.stats["prefix_hits"] == 0
        third = await eng.generate(nxt + again.token_ids + [11], params(3), session="s")
        assert third.info["cached_tokens"] == len(nxt) + 6 - 1 and eng.stats["prefix_hits"] == 1
    finally:
        await eng.close()


async def test_token_budget_evicts_least_recent_sessions_and_zero_is_off(model):
    eng = LocalEngine(model, max_batch_size=4, prefix_cache_tokens=60)
    off = LocalEngine(model, max_batch_size=4, prefix_cache_tokens=0)
    try:
        a = await eng.generate(rand_ids(30, 1), params(1), session="a")  # keeps 30 + 6 - 1 = 35 tokens
        b = await eng.generate(rand_ids(30, 2), params(2), session="b")  # 70 > 60: a is evicted
        assert eng.stats["prefix_evictions"] == 1
        again_b = await eng.generate(rand_ids(30, 2) + b.token_ids, params(4), session="b")
        again_a = await eng.generate(rand_ids(30, 1) + a.token_ids, params(3), session="a")
        assert again_b.info["cached_tokens"] == 35 and again_a.info["cached_tokens"] == 0
        # a's prompt (36 new tokens) is shared at its prefill and pushes b out; then a's own 41 tokens
        # push that shared prompt out
        assert eng.stats["prefix_evictions"] == 3 and eng.stats["prefix_shared"] == 1
        g = await off.generate(rand_ids(30, 1), params(1), session="a")
        g2 = await off.generate(rand_ids(30, 1) + g.token_ids, params(2), session="a")
        assert g2.info["cached_tokens"] == 0 and off.stats["prefix_hits"] == 0
    finally:
        await eng.close()
        await off.close()


async def test_requests_without_a_session_are_not_cached(model):
    eng = LocalEngine(model, max_batch_size=4)
    p = rand_ids(20, 5)
    try:
        g = await eng.generate(p, params(1))
        g2 = await eng.generate(p + g.token_ids, params(2))
        assert g2.info["cached_tokens"] == 0 and eng.stats["prefix_hits"] == 0
    finally:
        await eng.close()


async def test_siblings_and_a_common_system_prompt_prefill_once_and_are_exact(model):
    """A GRPO-like admission: 3 tasks x 4 siblings, every prompt starting with the same 48-token
    system block. Each distinct prompt is computed once (the siblings reuse it, the other tasks the
    system block), with the same tokens and logprobs as without the cache."""
    system = rand_ids(48, 70)
    tasks = [system + rand_ids(40, 71 + t) for t in range(3)]
    requests = [(tasks[t], params(10 * t + s)) for t in range(3) for s in range(4)]
    plain, cached = await pair(model, max_batch_size=16)
    try:
        want = await asyncio.gather(*(plain.generate(p, sp) for p, sp in requests))
        got = await asyncio.gather(*(cached.generate(p, sp, session=f"e{i}") for i, (p, sp) in enumerate(requests)))
        for w, g in zip(want, got):
            assert_same(g, w)
        assert plain.stats["prefilled_tokens"] == 12 * 88
        # one whole prompt, then the other two tasks' own 40 tokens, then one token per sibling
        assert cached.stats["prefilled_tokens"] == 88 + 2 * 40 + 9 * 1
        assert cached.stats["prefix_shared"] == 3 and cached.stats["prefix_shared_tokens_reused"] == 2 * 48 + 9 * 87
    finally:
        await plain.close()
        await cached.close()
