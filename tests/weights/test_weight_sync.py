"""Weight sync paths (agentrl.weights).

Unit tests run everywhere. The SGLang tests push perturbed weights into a live SGLang server through
each path and check that its greedy tokens and logprobs then match an HF transformers forward pass
of the NEW weights, and that tokens are stamped with the pushed version (SGLang's
``meta_info.weight_version`` and the engine's per-token versions). They skip, saying why, where
SGLang cannot start."""

from __future__ import annotations

import asyncio
import base64
import pickle

import pytest
import torch

from agentrl.engine.base import SamplingParams
from agentrl.errors import ConfigError, EngineError
from agentrl.weights.base import buckets
from agentrl.weights.disk import DiskSync
from agentrl.weights.distributed import DistributedSync
from agentrl.weights.factory import resolve_sync_kind
from agentrl.weights.inprocess import InProcessSync
from agentrl.weights.tensor import TensorSync, serialize_named_tensors

PROMPT = [5, 17, 42, 99, 7, 300, 12, 64]
MAX_NEW = 8


# -- units -------------------------------------------------------------------------------------
def test_buckets_respect_the_byte_budget_and_keep_order():
    named = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([10, 10, 30, 5, 5])]  # 40, 40, 120, 20, 20 bytes
    got = [[n for n, _ in b] for b in buckets(named, 80)]
    assert got == [["t0", "t1"], ["t2"], ["t3", "t4"]]
    assert [n for b in buckets(named, 1) for n, _ in b] == [n for n, _ in named]


def test_cpu_payload_is_in_band_and_round_trips():
    named = [("a", torch.arange(6, dtype=torch.float32).reshape(2, 3)), ("b", torch.ones(4, dtype=torch.bfloat16))]
    data = base64.b64decode(serialize_named_tensors(named))
    assert b"rebuild_storage_fd" not in data and b"rebuild_storage_filename" not in data  # no shared memory
    back = pickle.loads(data)
    assert [n for n, _ in back] == ["a", "b"]
    for (_, x), (_, y) in zip(named, back):
        assert x.dtype == y.dtype and torch.equal(x, y)


def test_resolve_sync_kind_auto_and_bad_combinations():
    assert resolve_sync_kind("auto", "local") == "inprocess"
    assert resolve_sync_kind("auto", "sglang", "cpu") == "disk"
    assert resolve_sync_kind("auto", "sglang", "cuda") == "distributed"
    assert resolve_sync_kind("tensor", "sglang") == "tensor"
    with pytest.raises(ConfigError, match="'inprocess'.*engine.kind='sglang'"):
        resolve_sync_kind("inprocess", "sglang")
    with pytest.raises(ConfigError, match="'disk'.*engine.kind='local'"):
        resolve_sync_kind("disk", "local")
    with pytest.raises(ConfigError, match="'nfs'"):
        resolve_sync_kind("nfs", "sglang")


def test_bad_inputs_are_named():
    with pytest.raises(EngineError, match="'w' is a str"):
        asyncio.run(InProcessSync(object()).push({"w": "nope"}, 1))
    with pytest.raises(EngineError, match="empty"):
        asyncio.run(InProcessSync(object()).push({}, 1))
    with pytest.raises(EngineError, match="backend must be 'nccl' or 'gloo', got 'mpi'"):
        DistributedSync(object(), backend="mpi")
    with pytest.raises(EngineError, match="version must be an int >= 0, got -1"):
        asyncio.run(TensorSync(object()).push({"w": torch.zeros(2)}, -1))


def test_disk_sync_needs_a_model_dir_with_config(tmp_path):
    # refused before generation is paused or anything is written (the engine is never touched)
    with pytest.raises(EngineError, match=f"model_path {tmp_path} has no config.json"):
        asyncio.run(DiskSync(object(), tmp_path / "w", model_path=tmp_path).push({"w": torch.zeros(2)}, 1))
    assert not any((tmp_path / "w").iterdir())


def test_inprocess_sync_loads_weights_into_the_local_engine(tiny_model_dir):
    from agentrl.engine.local.engine import LocalEngine

    async def main():
        eng = LocalEngine.from_pretrained(str(tiny_model_dir))
        await eng.start()
        try:
            new = perturbed(tiny_model_dir, seed=11)
            stats = await InProcessSync(eng).push(new, 3)
            assert eng.policy_version == 3 and stats.version == 3
            assert stats.bytes == sum(t.numel() * t.element_size() for t in new.values())
            gen = await eng.generate(PROMPT, SamplingParams(max_new_tokens=MAX_NEW, temperature=0))
            assert gen.versions == [3] * len(gen.token_ids)
            check_against_hf(tiny_model_dir, new, gen, TOL["local"], old=load_weights(tiny_model_dir))
        finally:
            await eng.close()

    asyncio.run(main())


# -- helpers -----------------------------------------------------------------------------------
def load_weights(model_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def perturbed(model_dir, seed: int) -> dict[str, torch.Tensor]:
    """The model's weights plus noise large enough to change greedy outputs."""
    g = torch.Generator().manual_seed(seed)
    sd = load_weights(model_dir)
    return {k: v + 0.08 * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in sd.items()}


#: |logprob(engine) - logprob(HF fp32)| allowed: the local engine runs fp32 (summation order only);
#: SGLang runs fp32 on CPU too (agentrl.engine.sglang.server: --dtype float32). Measured here, greedy
#: after pushing perturbed weights (6 pushes x 8 prompts x 32 tokens, against HF fp32 and against
#: Trainer.logprobs): max 3.3e-6; 2e-5 is ~6x that. (The perturbation moves logprobs by > 10x it.)
TOL = {"local": 1e-3, "sglang": 2e-5}


def check_against_hf(model_dir, state_dict, gen, tol: float, old: dict | None = None) -> float:
    """The engine's greedy tokens must be the argmax of an HF fp32 forward pass of ``state_dict``
    (up to near-ties within ``tol``: the comparison ends at the first such tie) and its logprobs
    that model's (temperature-1) logprobs. With ``old`` weights, also checks that they are told
    apart: the old model's logprobs of the same tokens are > 10x ``tol`` away. Returns the max
    difference to the new weights."""
    from transformers import AutoModelForCausalLM

    def logprobs(sd):
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        _, unexpected = model.load_state_dict(sd, strict=False)
        assert not unexpected, unexpected
        model.eval()
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([PROMPT + gen.token_ids])).logits[0].float(), -1)
        return lp[len(PROMPT) - 1 : len(PROMPT) - 1 + len(gen.token_ids)]

    steps = logprobs(state_dict)
    n = len(gen.token_ids)
    for i, tok in enumerate(gen.token_ids):
        best = int(steps[i].argmax())
        if best != tok:  # only a near-tie may differ, and the sequences part there
            assert steps[i, best] - steps[i, tok] <= tol, f"step {i}: engine took {tok}, HF argmax {best}"
            n = i + 1
            break
    idx = torch.tensor(gen.token_ids[:n])[:, None]
    ref = steps[:n].gather(1, idx)[:, 0]
    diff = (ref - torch.tensor(gen.logprobs[:n])).abs().max().item()
    print(f"max |logprob - HF(new weights)| over {n} tokens: {diff:.2e}")
    assert diff <= tol, f"logprobs differ from HF of the new weights by {diff}"
    if old is not None:
        d_old = (logprobs(old)[:n].gather(1, idx)[:, 0] - torch.tensor(gen.logprobs[:n])).abs().max().item()
        print(f"max |logprob - HF(old weights)|: {d_old:.2e}")
        assert d_old > 10 * tol, "the perturbation is too small to tell old and new weights apart"
    return diff


# -- live SGLang -------------------------------------------------------------------------------
@pytest.fixture
def weight_server(sglang_server_restored):
    """The session's server; the tests change its weights, so its own are loaded back after each."""
    return sglang_server_restored


def run_push(server, model_dir, make_sync, version: int, seed: int) -> tuple:
    """Push perturbed weights through ``make_sync(engine)``; return (stats, generation, raw answer)."""
    import httpx

    from agentrl.engine.sglang.engine import SGLangEngine

    async def main():
        eng = SGLangEngine(urls=[server.url])
        sync = make_sync(eng)
        try:
            await eng.start()
            new = perturbed(model_dir, seed)
            before = await eng.generate(PROMPT, SamplingParams(max_new_tokens=MAX_NEW, temperature=0))
            stats = await sync.push(new, version)
            assert eng.policy_version == version
            gen = await eng.generate(PROMPT, SamplingParams(max_new_tokens=MAX_NEW, temperature=0))
            async with httpx.AsyncClient(timeout=60) as c:
                raw = (
                    await c.post(
                        server.url + "/generate",
                        json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
                    )
                ).json()
            return new, before, stats, gen, raw
        finally:
            await sync.close()
            await eng.close()

    new, before, stats, gen, raw = asyncio.run(main())
    assert raw["meta_info"]["weight_version"] == str(version)
    assert gen.versions == [version] * len(gen.token_ids)
    assert stats.version == version and stats.bytes > 0 and stats.seconds > 0
    diff = check_against_hf(model_dir, new, gen, TOL["sglang"], old=load_weights(model_dir))
    return stats, before, gen, diff


@pytest.mark.sglang
def test_disk_sync_serves_the_new_weights(weight_server, sglang_model_dir, tmp_path):
    made = {}

    def make(eng):
        made["sync"] = DiskSync(eng, tmp_path / "weights", keep=1)
        return made["sync"]

    stats, *_ = run_push(weight_server, sglang_model_dir, make, version=5, seed=1)
    assert stats.path == "disk" and "write_s" in stats.phases
    # written atomically, the old dirs cleaned, config/tokenizer copied beside the weights
    dirs = sorted(p.name for p in (tmp_path / "weights").iterdir())
    assert dirs == ["v00000005"]
    written = {p.name for p in (tmp_path / "weights" / dirs[0]).iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= written


@pytest.mark.sglang
def test_tensor_sync_serves_the_new_weights(weight_server, sglang_model_dir):
    # a small bucket budget forces several /update_weights_from_tensor calls per push
    stats, *_ = run_push(
        weight_server, sglang_model_dir, lambda e: TensorSync(e, bucket_bytes=1 << 20), version=6, seed=2
    )
    assert stats.path == "tensor"


@pytest.mark.sglang
def test_distributed_sync_over_gloo_serves_the_new_weights(weight_server, sglang_model_dir):
    # NCCL needs GPUs; SGLang's group accepts backend="gloo", which runs on this CPU for real
    syncs = []

    def make(eng):
        syncs.append(DistributedSync(eng, backend="gloo", bucket_bytes=1 << 20, timeout_s=120))
        return syncs[-1]

    stats, *_ = run_push(weight_server, sglang_model_dir, make, version=7, seed=3)
    assert stats.path == "distributed" and "connect_s" in stats.phases


@pytest.mark.sglang
def test_distributed_sync_pushes_twice_over_one_group(weight_server, sglang_model_dir):
    from agentrl.engine.sglang.engine import SGLangEngine

    async def main():
        eng = SGLangEngine(urls=[weight_server.url])
        sync = DistributedSync(eng, backend="gloo", timeout_s=120)
        try:
            await eng.start()
            s1 = await sync.push(perturbed(sglang_model_dir, 4), 8)
            new = perturbed(sglang_model_dir, 5)
            s2 = await sync.push(new, 9)
            gen = await eng.generate(PROMPT, SamplingParams(max_new_tokens=MAX_NEW, temperature=0))
            return s1, s2, new, gen
        finally:
            await sync.close()
            await eng.close()

    s1, s2, new, gen = asyncio.run(main())
    assert "connect_s" in s1.phases and "connect_s" not in s2.phases
    assert gen.versions == [9] * len(gen.token_ids)
    check_against_hf(sglang_model_dir, new, gen, TOL["sglang"], old=perturbed(sglang_model_dir, 4))
