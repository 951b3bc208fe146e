"""LocalEngine with bfloat16 linear layers under a float32 model: the products narrow, everything else stays
float32, batching stays exact, and a weight update that sends a tied weight once still reaches its copy."""

from __future__ import annotations

import asyncio

import pytest
import torch
from engine_helpers import build_tiny, load_sharp

from agentrl.engine.base import SamplingParams
from agentrl.engine.local.engine import LocalEngine
from agentrl.engine.local.narrow_linears import NarrowLinears

NO_STOP = (10**9,)
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tiny"))


def prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(10, 2000, (int(torch.randint(3, 40, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]


def test_linears_narrow_and_the_rest_stays_wide(model_dir):
    model = load_sharp(model_dir)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: the case that must be untied
    ids = torch.tensor([prompts(1, seed=3)[0]])
    with torch.no_grad():
        wide = model(ids).logits
    narrow = NarrowLinears(model, torch.bfloat16)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert narrow.layers == len(linears) > 0
    assert all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert model.model.embed_tokens.weight.dtype == torch.float32
    assert narrow.tied == {"lm_head.weight": "model.embed_tokens.weight"}
    seen = []
    model.model.layers[0].self_attn.register_forward_hook(
        lambda mod, args, kwargs, out: seen.append(out[0].dtype), with_kwargs=True
    )
    with torch.no_grad():
        got = model(ids).logits
    assert got.dtype == torch.float32 and seen == [torch.float32]  # attention ran on float32 activations
    # close to the float32 model (bfloat16 products: ~3 significant digits), and not the same numbers
    assert torch.allclose(got, wide, atol=0.1 * wide.abs().max().item()) and not torch.equal(got, wide)


async def test_engine_stays_exact_with_narrow_linears(model_dir):
    eng = LocalEngine(load_sharp(model_dir), max_batch_size=4, seed=0, linear_dtype="bfloat16")
    ref = load_sharp(model_dir)
    NarrowLinears(ref, torch.bfloat16)
    ps = prompts(8, seed=1)
    sp = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=NO_STOP)
    try:
        together = await asyncio.gather(*(eng.generate(p, sp) for p in ps))
        for p, got in zip(ps, together):
            alone = await eng.generate(p, sp)
            assert got.token_ids == alone.token_ids
            with torch.no_grad():
                logits = ref(torch.tensor([p + got.token_ids])).logits[0, len(p) - 1 : -1]
            full = torch.log_softmax(logits, -1).gather(1, torch.tensor(got.token_ids)[:, None]).flatten()
            assert max(abs(a - b) for a, b in zip(got.logprobs, full.tolist())) < 1e-3
        assert all(k.dtype == torch.float32 for k in eng._kv.k)  # the K/V kept the model's dtype
    finally:
        await eng.close()


async def test_update_that_sends_a_tied_weight_once_reaches_the_copy(model_dir, tmp_path):
    eng = LocalEngine(load_sharp(model_dir), max_batch_size=4, linear_dtype=torch.bfloat16)
    new = load_sharp(build_tiny(tmp_path / "new", seed=1))
    ref = LocalEngine(load_sharp(tmp_path / "new" / "m"), max_batch_size=4, linear_dtype=torch.bfloat16)
    sent = {k: v for k, v in new.state_dict().items() if k != "lm_head.weight"}  # the embedding only
    p = prompts(1, seed=7)[0]
    sp = SamplingParams(max_new_tokens=15, temperature=0.0, stop_token_ids=NO_STOP)
    try:
        await eng.update_weights(sent, version=1)
        got, expected = await eng.generate(p, sp), await ref.generate(p, sp)
        assert got.token_ids == expected.token_ids
        assert got.logprobs == pytest.approx(expected.logprobs, abs=1e-5)
        assert eng.model.lm_head.weight.dtype == torch.bfloat16
        assert torch.equal(eng.model.lm_head.weight, new.model.embed_tokens.weight.to(torch.bfloat16))
    finally:
        await eng.close()
        await ref.close()


def test_bad_linear_dtype_is_named(model_dir):
    with pytest.raises(ValueError, match="'int8'"):
        LocalEngine(load_sharp(model_dir), linear_dtype="int8")
