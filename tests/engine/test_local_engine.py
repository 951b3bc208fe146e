"""LocalEngine: continuous batching is exact, sampling follows the params, errors never hang."""

from __future__ import annotations

import asyncio

import pytest
import torch
from engine_helpers import build_tiny, load_sharp

from agentrl.engine.base import SamplingParams
from agentrl.engine.local.engine import LocalEngine
from agentrl.engine.local.kv_batch import KVBatch
from agentrl.errors import EngineError

NO_STOP = (10**9,)  # an id the model can never sample: runs go exactly to max_new_tokens

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def model(model_dir):
    return load_sharp(model_dir)


@pytest.fixture
async def engine(model):
    eng = LocalEngine(model, max_batch_size=4, seed=0)
    yield eng
    await eng.close()


def prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 40) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(10, 2000, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def full_forward_logprobs(model, prompt, out, temperature=1.0) -> torch.Tensor:
    """Logprobs of ``out`` under one plain forward pass over prompt + out."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp.gather(1, torch.tensor(out)[:, None]).flatten()


async def test_batched_equals_alone_greedy(engine):
    ps = prompts(10)
    params = [SamplingParams(max_new_tokens=5 + 7 * i, temperature=0.0, stop_token_ids=NO_STOP) for i in range(10)]
    together = await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(ps, params)))
    assert engine.stats["prefills"] > 1  # max_batch_size=4: later requests joined a running batch
    for p, sp, got in zip(ps, params, together):
        alone = await engine.generate(p, sp)
        assert got.token_ids == alone.token_ids
        assert got.finish_reason == "length" and len(got.token_ids) == sp.max_new_tokens
        assert max(abs(a - b) for a, b in zip(got.logprobs, alone.logprobs)) < 1e-4


async def test_logprobs_match_full_forward(engine, model):
    ps = prompts(12, seed=1)
    temps = [1.0, 0.7, 0.0]
    params = [
        SamplingParams(max_new_tokens=10 + 5 * i, temperature=temps[i % 3], seed=i, stop_token_ids=NO_STOP)
        for i in range(12)
    ]

    async def staggered(i):
        await asyncio.sleep(0.01 * i)  # arrivals spread over the decode of the others
        return await engine.generate(ps[i], params[i])

    outs = await asyncio.gather(*(staggered(i) for i in range(12)))
    worst = 0.0
    for p, sp, out in zip(ps, params, outs):
        ref = full_forward_logprobs(model, p, out.token_ids, sp.temperature)
        worst = max(worst, (ref - torch.tensor(out.logprobs)).abs().max().item())
    print(f"max |logprob - full forward| = {worst:.2e}")
    assert worst < 1e-4


async def test_cache_layout_changes_stay_exact(model):
    """Arrivals ordered short-to-long (the window must shift right for a longer prompt), rows
    leaving from the middle, the window growing and compacting: every token still matches."""
    eng = LocalEngine(model, max_batch_size=3)
    g = torch.Generator().manual_seed(9)
    ps = [torch.randint(10, 2000, (n,), generator=g).tolist() for n in (2, 5, 9, 30, 4, 80, 3, 120, 7, 50)]
    news = torch.randint(1, 90, (len(ps),), generator=g).tolist()

    async def arrive(i):
        await asyncio.sleep(0.003 * i)
        return await eng.generate(ps[i], SamplingParams(max_new_tokens=news[i], seed=i, stop_token_ids=NO_STOP))

    try:
        outs = await asyncio.gather(*(arrive(i) for i in range(len(ps))))
    finally:
        await eng.close()
    for p, n, out in zip(ps, news, outs):
        assert len(out.token_ids) == n
        ref = full_forward_logprobs(model, p, out.token_ids)
        assert (ref - torch.tensor(out.logprobs)).abs().max().item() < 1e-4


def test_kv_batch_random_ops_keep_every_row_intact():
    """KVBatch alone against a list of per-row tensors, through joins, steps and leaves."""
    g = torch.Generator().manual_seed(0)
    kv = KVBatch(max_rows=6, max_cols=200)
    ref: list[torch.Tensor] = []  # per row: its K values [L] (one head, dim 1, one layer)
    layouts = set()
    for _ in range(400):
        op = torch.rand(1, generator=g).item()
        if op < 0.2 and kv.n < 6:
            k = int(torch.randint(1, 7 - kv.n, (1,), generator=g))
            lens = torch.randint(1, 40, (k,), generator=g).tolist()
            p = max(lens)
            vals = torch.randn(k, 1, p, 1, generator=g)
            valid = torch.arange(p)[None, :] >= (p - torch.tensor(lens))[:, None]
            kv.add_rows({0: vals}, {0: -vals}, valid)
            ref += [vals[i, 0, p - n :, 0] for i, n in enumerate(lens)]
        elif op < 0.35 and kv.n:
            gone = set(torch.randperm(kv.n, generator=g)[: int(torch.randint(1, kv.n + 1, (1,), generator=g))].tolist())
            for src, dst in kv.remove_rows(gone):
                ref[dst] = ref[src]
            del ref[kv.n :]
        elif kv.n and max(len(r) for r in ref) < 190:
            valid = kv.begin_step()
            new = torch.randn(kv.n, 1, 1, 1, generator=g)
            keys, values = kv.update(new, -new, 0)
            assert keys.shape[2] == valid.shape[1] == kv.width + 1
            kv.end_step()
            ref = [torch.cat([r, new[i, 0, :, 0]]) for i, r in enumerate(ref)]
        layouts.add((kv.valid.shape, kv.start, kv.end))
        for i, r in enumerate(ref):
            window = kv.valid[i, kv.start : kv.end]
            assert int(window.sum()) == len(r) and bool(window[-len(r) :].all())
            assert torch.equal(kv.k[0][i, 0, kv.start : kv.end, 0][window], r)
            assert torch.equal(kv.v[0][i, 0, kv.start : kv.end, 0][window], -r)
    assert len({shape for shape, _, _ in layouts}) > 3  # the buffers were re-laid out several times


async def test_new_request_joins_mid_decode(engine):
    long = asyncio.create_task(
        engine.generate(prompts(1)[0], SamplingParams(max_new_tokens=150, temperature=0.0, stop_token_ids=NO_STOP))
    )
    while engine.stats["steps"] < 20:
        await asyncio.sleep(0.005)
    short = await engine.generate(
        prompts(1, seed=5)[0], SamplingParams(max_new_tokens=5, temperature=0.0, stop_token_ids=NO_STOP)
    )
    assert not long.done()  # the short one finished while the long one was still decoding
    long_out = await long
    assert short.info["admitted_step"] >= 20
    assert short.info["finished_step"] - short.info["admitted_step"] == 4  # 1 token from prefill + 4 steps
    assert short.info["finished_step"] < long_out.info["finished_step"]


async def test_stop_tokens_and_length(model):
    eng = LocalEngine(model, max_batch_size=4, max_context=64)
    try:
        p = prompts(1, seed=2)[0]
        free = await eng.generate(p, SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=NO_STOP))
        stop = free.token_ids[5]
        out = await eng.generate(p, SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=(stop,)))
        first = free.token_ids.index(stop)
        assert out.finish_reason == "stop" and out.token_ids == free.token_ids[: first + 1]
        assert len(out.logprobs) == len(out.versions) == len(out.token_ids)
        # max_context cuts prompt + completion
        capped = await eng.generate(p, SamplingParams(max_new_tokens=500, temperature=0.0, stop_token_ids=NO_STOP))
        assert capped.finish_reason == "length" and len(p) + len(capped.token_ids) == 64
        # no stop ids given: the model's eos is the stop id
        assert eng.eos_token_ids == (model.generation_config.eos_token_id,)
    finally:
        await eng.close()


async def test_seeded_sampling_is_independent_of_the_batch(engine):
    p = prompts(1, seed=3)[0]
    sp = SamplingParams(max_new_tokens=40, temperature=1.0, top_p=0.95, seed=123, stop_token_ids=NO_STOP)
    alone = await engine.generate(p, sp)
    noise = [engine.generate(q, SamplingParams(max_new_tokens=30, stop_token_ids=NO_STOP)) for q in prompts(6, seed=4)]
    crowded, *_ = await asyncio.gather(engine.generate(p, sp), *noise)
    assert crowded.token_ids == alone.token_ids
    other = await engine.generate(
        p, SamplingParams(max_new_tokens=40, temperature=1.0, top_p=0.95, seed=124, stop_token_ids=NO_STOP)
    )
    assert other.token_ids != alone.token_ids


async def test_top_k_and_top_p_filters(engine):
    p = prompts(1, seed=6)[0]
    greedy = await engine.generate(p, SamplingParams(max_new_tokens=20, temperature=0.0, stop_token_ids=NO_STOP))
    for sp in (
        SamplingParams(max_new_tokens=20, top_k=1, seed=1, stop_token_ids=NO_STOP),
        SamplingParams(max_new_tokens=20, top_p=1e-6, seed=1, stop_token_ids=NO_STOP),
    ):
        assert (await engine.generate(p, sp)).token_ids == greedy.token_ids
    # logprobs are of the temperature-scaled distribution before filtering: not all 0 under top_k=1
    out = await engine.generate(p, SamplingParams(max_new_tokens=20, top_k=1, seed=1, stop_token_ids=NO_STOP))
    assert out.logprobs == pytest.approx(greedy.logprobs, abs=1e-5)
    # top_k=5: every sampled token is among the 5 most likely
    out = await engine.generate(
        p, SamplingParams(max_new_tokens=30, top_k=5, temperature=5.0, seed=2, stop_token_ids=NO_STOP)
    )
    engine_model = engine.model
    with torch.no_grad():
        logits = engine_model(torch.tensor([p + out.token_ids])).logits[0, len(p) - 1 : -1]
    top5 = logits.topk(5, dim=-1).indices
    assert all(t in top5[i].tolist() for i, t in enumerate(out.token_ids))


async def test_update_weights(model_dir, tmp_path):
    eng = LocalEngine(load_sharp(model_dir), max_batch_size=4)
    new_dir = build_tiny(tmp_path / "new", seed=1)
    new_model = load_sharp(new_dir)
    p = prompts(1, seed=7)[0]
    sp = SamplingParams(max_new_tokens=15, temperature=0.0, stop_token_ids=NO_STOP)
    try:
        before = await eng.generate(p, sp)
        assert set(before.versions) == {0}
        long = asyncio.create_task(
            eng.generate(p, SamplingParams(max_new_tokens=200, temperature=0.0, stop_token_ids=NO_STOP))
        )
        while eng.stats["steps"] < 20:
            await asyncio.sleep(0.005)
        await eng.update_weights(new_model.state_dict(), version=3)
        assert eng.policy_version == 3
        after = await eng.generate(p, sp)
        spanning = await long
        ref = LocalEngine(new_model, max_batch_size=4)
        expected = await ref.generate(p, sp)
        await ref.close()
        assert after.token_ids == expected.token_ids != before.token_ids
        assert after.logprobs == pytest.approx(expected.logprobs, abs=1e-5)
        assert set(after.versions) == {3}
        # the in-flight request switched versions between two tokens, never back
        assert spanning.versions[0] == 0 and spanning.versions[-1] == 3
        assert spanning.versions == sorted(spanning.versions)
        with pytest.raises(EngineError, match="shape"):
            await eng.update_weights({"lm_head.weight": torch.zeros(3, 3)}, version=4)
        with pytest.raises(EngineError, match="unknown"):
            await eng.update_weights({"nope": torch.zeros(3)}, version=4)
        assert eng.policy_version == 3
    finally:
        await eng.close()


async def test_bad_requests(engine):
    with pytest.raises(EngineError, match="empty"):
        await engine.generate([], SamplingParams())
    with pytest.raises(EngineError, match="vocabulary"):
        await engine.generate([1, 10**7], SamplingParams())
    eng = LocalEngine(engine.model, max_context=32)
    with pytest.raises(EngineError, match="40 tokens.*max_context=32"):
        await eng.generate([5] * 40, SamplingParams())
    await eng.close()
    # the engine still serves after rejecting
    out = await engine.generate([5, 6, 7], SamplingParams(max_new_tokens=3, stop_token_ids=NO_STOP))
    assert len(out.token_ids) == 3


async def test_worker_crash_fails_everything(model_dir, monkeypatch):
    eng = LocalEngine.from_pretrained(model_dir, max_batch_size=2)
    running = [
        asyncio.create_task(eng.generate(p, SamplingParams(max_new_tokens=300, stop_token_ids=NO_STOP)))
        for p in prompts(4)
    ]
    while eng.stats["steps"] < 3:
        await asyncio.sleep(0.005)

    def boom(*args, **kwargs):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(eng.model, "forward", boom)
    for t in running:  # both the decoding rows and the waiting requests
        with pytest.raises(EngineError, match="injected fault"):
            await asyncio.wait_for(t, 10)
    with pytest.raises(EngineError, match="crashed"):
        await eng.generate([1, 2, 3], SamplingParams())
    await eng.close()


async def test_close_fails_in_flight(model):
    eng = LocalEngine(model, max_batch_size=2)
    running = [
        asyncio.create_task(eng.generate(p, SamplingParams(max_new_tokens=500, stop_token_ids=NO_STOP)))
        for p in prompts(3)
    ]
    while eng.stats["steps"] < 2:
        await asyncio.sleep(0.005)
    await eng.close()
    for t in running:
        with pytest.raises(EngineError, match="closed"):
            await asyncio.wait_for(t, 10)
    with pytest.raises(EngineError, match="closed"):
        await eng.generate([1, 2], SamplingParams())


async def test_cancelled_request_leaves_the_batch(engine):
    victim = asyncio.create_task(
        engine.generate([4, 5, 6], SamplingParams(max_new_tokens=1000, stop_token_ids=NO_STOP))
    )
    while engine.stats["steps"] < 3:
        await asyncio.sleep(0.005)
    victim.cancel()
    out = await engine.generate([7, 8], SamplingParams(max_new_tokens=10, stop_token_ids=NO_STOP))
    assert len(out.token_ids) == 10
    await asyncio.sleep(0.05)
    steps = engine.stats["steps"]
    await asyncio.sleep(0.2)
    assert engine.stats["steps"] == steps < 100  # the cancelled row was retired, not decoded to 1000


async def test_64_concurrent_requests(model):
    eng = LocalEngine(model, max_batch_size=64)
    try:
        ps = prompts(64, seed=8)
        g = torch.Generator().manual_seed(0)
        lens = torch.randint(1, 60, (64,), generator=g).tolist()
        outs = await asyncio.gather(
            *(eng.generate(p, SamplingParams(max_new_tokens=n, stop_token_ids=NO_STOP)) for p, n in zip(ps, lens))
        )
        assert [len(o.token_ids) for o in outs] == lens
        assert eng.stats["steps"] <= max(lens)  # every request decoded in one shared batch
    finally:
        await eng.close()


async def test_generation_passes_the_kv_cache_under_the_installed_transformers_name(engine, recwarn):
    """transformers renamed the forward's ``past_key_values`` to ``cache`` (the old name warns on every
    call): the engine uses whichever name the model's forward takes, so a run prints no such warning."""
    import inspect

    takes = inspect.signature(engine.model.forward).parameters
    assert engine._cache_arg in takes
    out = await engine.generate(
        prompts(1)[0], SamplingParams(max_new_tokens=4, temperature=0.0, stop_token_ids=NO_STOP)
    )
    assert len(out.token_ids) == 4
    assert not [w for w in recwarn if "past_key_values" in str(w.message)]
