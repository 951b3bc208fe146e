"""Engine conformance: the same checks against every rollout engine, on the same weights.

Engines: ``local`` (LocalEngine, in process, fp32) and ``sglang`` (SGLangEngine attached to the
session's live SGLang server; skips with the reason where SGLang cannot run). The reference is an
HF transformers fp32 forward pass of the same weights.

The weights are the session's tiny random Qwen3 (``sglang_model_dir``) made *conformant-testable*
by :func:`conformance_weights`: a random init is near-uniform and never ends a turn, which would
make greedy trivially "repeat the last token" and multi-turn episodes impossible. The edit keeps
the architecture and makes the output context dependent, peaked, and likely to sample the eos id
(``<|im_end|>``) and a second marker id (7): a turn ends after a few to ~100 tokens. The SGLang server is switched
to these weights with ``/update_weights_from_disk`` for this module and switched back afterwards.

Tolerances on |logprob(engine) - logprob(HF fp32)|: LocalEngine runs the same fp32 weights through
a batched K/V cache, so only summation order differs (1e-3 is ~100x what is observed). The SGLang
server here runs on CPU in fp32 (``agentrl.engine.sglang.server`` passes ``--dtype float32`` there;
SGLang's own ``auto`` would serve this fp32 checkpoint in fp16, ~2e-2 off), so it too differs only
in summation order and kernels. Measured on these weights (48 prompts of 50-1,500 tokens x 64 new
tokens per temperature, against HF fp32 and against ``Trainer.logprobs``, both alike):
max 1.3e-5 at T=1, 1.8e-5 at T=0.7, 2.2e-5 at T=0.5, 1.1e-5 greedy, 1.1e-5 after a weight update.
1e-4 is ~5x the largest, and far below the error of reading the wrong position or the wrong
weights (checked below: the perturbed weights move logprobs by > 10x the tolerance). Every test
prints the max difference.
"""

from __future__ import annotations

import asyncio
import copy
import shutil

import components
import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.config.schema import RolloutConfig
from agentrl.engine.base import SamplingParams
from agentrl.envs.noop import NoopEnv
from agentrl.episodes.manager import EpisodeManager, make_specs
from agentrl.trajectory import Outcome

pytestmark = pytest.mark.timeout(600)

EOS = 2  # <|im_end|>: the tokenizer's eos and end-of-turn id
MARK = 7  # a second id the conformance weights make likely (an explicit stop id)
VOCAB = 2052  # the tiny model's vocabulary (checked in conf_dir)
TOL = {"local": 1e-3, "sglang": 1e-4}  # see the module docstring (SGLang fp32 on CPU: measured <= 2.2e-5)
ENGINES = ["local", pytest.param("sglang", marks=pytest.mark.sglang)]


def conformance_weights(model) -> None:
    """Edit a tiny random Qwen3 in place (see the module docstring). Residual dimension 0 becomes a
    constant positive channel: every embedding has 0.1 there (EOS 1.5, MARK 1.1) and no layer
    writes to it (row 0 of o_proj/down_proj is zero), so after the final norm (weight 300 on it)
    it adds a context-scaled bonus to the logits of EOS and MARK only. Louder layers and an 8x
    final norm make the rest of the distribution peaked and dependent on the whole context."""
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(2.0)
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "up_proj.weight", "v_proj.weight")):
                p.mul_(8.0)
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p[0].zero_()
        emb = model.model.embed_tokens.weight
        emb[:, 0] = 0.1
        emb[EOS, 0], emb[MARK, 0] = 1.5, 1.1
        model.model.norm.weight.mul_(8.0)
        model.model.norm.weight[0] = 300.0


@pytest.fixture(scope="module")
def conf_dir(sglang_model_dir, tmp_path_factory):
    """An HF dir (model + tokenizer) holding the conformance weights."""
    out = tmp_path_factory.mktemp("conformance-model")
    shutil.copytree(sglang_model_dir, out, dirs_exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(str(sglang_model_dir), dtype=torch.float32)
    assert model.config.vocab_size == VOCAB
    conformance_weights(model)
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def hf(conf_dir):
    """The fp32 HF reference model."""
    return AutoModelForCausalLM.from_pretrained(str(conf_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(conf_dir):
    return AutoTokenizer.from_pretrained(str(conf_dir))


@pytest.fixture(scope="module")
def sglang_url(request, sglang_model_dir, conf_dir):
    """The shared server, serving the conformance weights while this module runs."""
    server = request.getfixturevalue("sglang_server")
    _load_dir(server.url, conf_dir)
    yield server.url
    _load_dir(server.url, sglang_model_dir)


def _load_dir(url: str, path) -> None:
    r = httpx.post(f"{url}/update_weights_from_disk", json={"model_path": str(path)}, timeout=300)
    if r.status_code != 200 or not r.json().get("success"):
        raise RuntimeError(f"{url}/update_weights_from_disk {path} failed: HTTP {r.status_code} {r.text[:300]}")


@pytest.fixture(params=ENGINES)
async def engine(request, conf_dir):
    """A fresh engine of each kind on the conformance weights (per test: httpx clients belong to one loop)."""
    if request.param == "local":
        from agentrl.engine.local.engine import LocalEngine

        eng = LocalEngine.from_pretrained(conf_dir)
    else:
        from agentrl.engine.sglang.engine import SGLangEngine

        eng = SGLangEngine(urls=[request.getfixturevalue("sglang_url")])
    eng.kind = request.param
    await eng.start()
    yield eng
    await eng.close()


# --- references -------------------------------------------------------------------------------
def hf_logprobs(model, prompt: list[int], out: list[int], temperature: float = 1.0) -> torch.Tensor:
    """Teacher-forced logprobs of ``out`` after ``prompt`` (one forward over prompt + out)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp.gather(1, torch.tensor(out)[:, None]).flatten()


def hf_greedy(model, prompt: list[int], n: int, stop: set[int]) -> tuple[list[int], list[float]]:
    """Greedy continuation by full forwards; also each step's margin between the top two logprobs."""
    out, margins = [], []
    for _ in range(n):
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([prompt + out])).logits[0, -1].float(), -1)
        top = lp.topk(2)
        out.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        if out[-1] in stop:
            break
    return out, margins


def prompts(n: int, seed: int = 0, lo: int = 150, hi: int = 400) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(10, 2000, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def effective_stops(engine, params: SamplingParams) -> set[int]:
    """The ids that end a request. The Engine contract: ``stop_token_ids`` when given, else eos.
    SGLang's scheduler (``Req._check_token_based_finish``) always adds the model's eos ids, so for
    SGLangEngine eos stops too (documented in agentrl/engine/sglang/engine.py). Harmless for episodes: the
    episode manager's stop ids always contain eos."""
    if not params.stop_token_ids:
        return {EOS}
    return set(params.stop_token_ids) | ({EOS} if engine.kind == "sglang" else set())


async def generate_all(engine, ps, params) -> list:
    return await asyncio.gather(*(engine.generate(p, params) for p in ps))


def check_shape(engine, gen, params: SamplingParams) -> None:
    """Lengths agree; stop/length follow the stop set and max_new_tokens."""
    stops = effective_stops(engine, params)
    n = len(gen.token_ids)
    assert 1 <= n <= params.max_new_tokens
    assert len(gen.logprobs) == n and len(gen.versions) == n
    assert all(isinstance(t, int) and 0 <= t < VOCAB for t in gen.token_ids)
    assert not stops & set(gen.token_ids[:-1]), f"a stop id inside the output: {gen.token_ids}"
    if gen.finish_reason == "stop":
        assert gen.token_ids[-1] in stops
    else:
        assert gen.finish_reason == "length" and n == params.max_new_tokens and gen.token_ids[-1] not in stops


# --- token ids --------------------------------------------------------------------------------
async def test_prompt_ids_go_in_as_ids(engine, hf, tokenizer):
    """A prompt that text would re-tokenize differently: the engine must continue these exact ids
    (its logprobs match the reference on them, not on the re-tokenized text)."""
    text = "def function_name(argument): return argument + 12345"
    chars = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(c))[0] for c in text if c != " "]
    prompt = prompts(1, seed=9)[0] + tokenizer.encode("<|im_start|>user\n", add_special_tokens=False) + chars
    retok = tokenizer.encode(tokenizer.decode(prompt), add_special_tokens=False)
    assert retok != prompt, "the probe prompt must not survive a text round trip"
    params = SamplingParams(max_new_tokens=24, temperature=1.0)
    gens = await generate_all(engine, [prompt] * 4, params)
    diff = 0.0
    for gen in gens:
        check_shape(engine, gen, params)
        ref = hf_logprobs(hf, prompt, gen.token_ids)
        diff = max(diff, (ref - torch.tensor(gen.logprobs)).abs().max().item())
        assert gen.info["prompt_tokens"] == len(prompt)  # both engines report it (SGLang: meta_info)
    print(f"[{engine.kind}] non-canonical prompt: max |logprob - HF| = {diff:.2e}")
    assert diff <= TOL[engine.kind]


async def test_default_stop_is_eos(engine):
    params = SamplingParams(max_new_tokens=64, temperature=1.0)
    gens = await generate_all(engine, prompts(16, seed=1), params)
    for gen in gens:
        check_shape(engine, gen, params)
    assert sum(g.finish_reason == "stop" for g in gens) >= 8, "the conformance weights should end most requests"


async def test_explicit_stop_ids(engine):
    """stop_token_ids replace the default: a sampled MARK ends the request and is kept."""
    params = SamplingParams(max_new_tokens=64, temperature=1.0, stop_token_ids=(MARK,))
    gens = await generate_all(engine, prompts(16, seed=2), params)
    for gen in gens:
        check_shape(engine, gen, params)
    assert any(g.finish_reason == "stop" and g.token_ids[-1] == MARK for g in gens)
    eos_inside = sum(EOS in g.token_ids[:-1] for g in gens)
    if engine.kind == "local":  # the contract: eos is an ordinary token when stop ids are given
        assert eos_inside > 0, "EOS never sampled mid-output: stop ids are not honoured as given"
    print(f"[{engine.kind}] explicit stop ids: eos inside {eos_inside}/16 outputs")


async def test_stop_strings_end_at_the_token(engine, tokenizer):
    """A stop string ends the request right after the first token whose text completes it: the ids
    are the unstopped run's (greedy, one request at a time) up to that token, kept whole. The
    strings straddle two tokens, so the engine must decode more than the last one."""
    checked = 0
    for p in prompts(6, seed=14):
        ref = await engine.generate(p, SamplingParams(max_new_tokens=32, temperature=0.0, stop_token_ids=(MARK,)))
        if len(ref.token_ids) < 8:
            continue
        k = len(ref.token_ids) // 2
        before, upto = tokenizer.decode(ref.token_ids[:k]), tokenizer.decode(ref.token_ids[: k + 1])
        stop = upto[max(0, len(before) - 2) : len(before) + 1]
        cut = next(j for j in range(len(ref.token_ids)) if stop in tokenizer.decode(ref.token_ids[: j + 1]))
        params = SamplingParams(max_new_tokens=32, temperature=0.0, stop_token_ids=(MARK,), stop=("\x00never", stop))
        gen = await engine.generate(p, params)
        assert gen.finish_reason == "stop", (stop, gen.token_ids, ref.token_ids)
        assert gen.token_ids == ref.token_ids[: cut + 1], (stop, gen.token_ids, ref.token_ids)
        assert len(gen.logprobs) == len(gen.versions) == cut + 1
        checked += 1
    print(f"[{engine.kind}] stop strings: {checked} cut outputs checked")
    assert checked >= 2, "too few outputs long enough to cut"


@pytest.mark.parametrize("max_new", [1, 3, 17])
async def test_max_new_tokens(engine, max_new):
    params = SamplingParams(max_new_tokens=max_new, temperature=1.0)
    # the conformance weights make eos likely (and SGLang always stops on it), so a round of 8 may
    # end every request early; sample more rounds until one request runs into the limit
    for seed in range(3, 13):
        gens = await generate_all(engine, prompts(8, seed=seed), params)
        for gen in gens:
            check_shape(engine, gen, params)
        if any(len(g.token_ids) == max_new for g in gens):
            break
    assert any(len(g.token_ids) == max_new for g in gens), "no request reached max_new_tokens in 80"


# --- logprobs and greedy ------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_logprobs_match_hf(engine, hf, temperature):
    """Behaviour logprobs (of the temperature-scaled distribution) match a teacher-forced HF pass."""
    ps = prompts(12, seed=4)
    params = SamplingParams(max_new_tokens=48, temperature=temperature, stop_token_ids=(MARK,))
    gens = await generate_all(engine, ps, params)
    diffs = []
    for p, gen in zip(ps, gens):
        check_shape(engine, gen, params)
        ref = hf_logprobs(hf, p, gen.token_ids, temperature)
        diffs.append((ref - torch.tensor(gen.logprobs)).abs().max().item())
    n = sum(len(g.token_ids) for g in gens)
    print(f"[{engine.kind}] T={temperature}: max |logprob - HF| = {max(diffs):.2e} over {n} tokens")
    assert max(diffs) <= TOL[engine.kind]


async def test_greedy_matches_hf(engine, hf):
    """temperature 0 continues with HF's argmax. A divergence is allowed only where HF's own top
    two logprobs are closer than the engine's precision can resolve (TOL), and ends the comparison."""
    ps = prompts(6, seed=5)
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    gens = await generate_all(engine, ps, params)
    compared = 0
    for p, gen in zip(ps, gens):
        check_shape(engine, gen, params)
        ref, margins = hf_greedy(hf, p, 16, effective_stops(engine, params))
        for i, (a, b) in enumerate(zip(gen.token_ids, ref)):
            if a != b:
                assert margins[i] < TOL[engine.kind], f"greedy diverged at {i}: {gen.token_ids} vs HF {ref}"
                print(f"[{engine.kind}] greedy near-tie at step {i} (HF margin {margins[i]:.1e})")
                break
            compared += 1
        else:
            assert gen.token_ids == ref
    print(f"[{engine.kind}] greedy: {compared} tokens equal to HF")
    assert compared >= 20, "too few greedy tokens compared to mean anything"


# --- episodes ------------------------------------------------------------------------------------
async def test_64_concurrent_multi_turn_episodes(engine, hf, tokenizer):
    """64 three-turn episodes at once through the real EpisodeManager; every sampled token's
    behaviour logprob matches HF on the whole trajectory (the engine continued the exact ids)."""
    cfg = RolloutConfig(max_turns=4, max_new_tokens=128, max_context=4096, max_concurrency=64, temperature=1.0)
    mgr = EpisodeManager(engine, lambda: NoopEnv(n_turns=3), tokenizer, cfg, env_id="noop")
    specs = make_specs(8, 8, seed=0)
    trajs = await mgr.collect(specs)
    assert sorted(t.episode_id for t in trajs) == sorted(f"{s.group_id}-{s.sample_index}" for s in specs)
    outcomes = [t.outcome for t in trajs]
    assert all(o in (Outcome.OK, Outcome.TRUNCATED_LENGTH) for o in outcomes), [
        (t.outcome, t.outcome_detail) for t in trajs if t.outcome not in (Outcome.OK, Outcome.TRUNCATED_LENGTH)
    ]
    ok = [t for t in trajs if t.outcome == Outcome.OK]
    assert len(ok) >= 56, f"only {len(ok)}/64 episodes ended ok"
    assert all(len(t.turns) == 3 for t in ok)
    diff = 0.0
    for t in trajs:
        n = len(t.token_ids)
        assert len(t.loss_mask) == len(t.logprobs) == len(t.versions) == n
        idx = [i for i, m in enumerate(t.loss_mask) if m]
        assert all(t.versions[i] == engine.policy_version for i in idx)
        with torch.no_grad():
            logp = torch.log_softmax(hf(torch.tensor([t.token_ids])).logits[0].float(), -1)
        ref = logp[torch.tensor(idx) - 1].gather(1, torch.tensor([t.token_ids[i] for i in idx])[:, None]).flatten()
        diff = max(diff, (ref - torch.tensor([t.logprobs[i] for i in idx])).abs().max().item())
    print(
        f"[{engine.kind}] 64 episodes: {len(ok)} ok, "
        f"{sum(len(t.turns) for t in trajs)} turns, max |logprob - HF| over trajectories = {diff:.2e}"
    )
    assert diff <= TOL[engine.kind]


# --- weight updates ------------------------------------------------------------------------------
async def test_outputs_follow_a_weight_update(engine, hf):
    """After update_weights(perturbed, v) the logprobs are those of the new weights and every token
    is stamped v; the original weights are restored (and checked) afterwards."""
    original = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    new = copy.deepcopy(hf)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():  # only matrices that do not write the stop channel (conformance_weights)
        for name, p in new.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")):
                p.add_(0.5 * p.std() * torch.randn(p.shape, generator=g))
    perturbed = new.state_dict()
    ps = prompts(6, seed=6)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, stop_token_ids=(MARK,))
    tol = TOL[engine.kind]
    try:
        await engine.update_weights(perturbed, 7)
        assert engine.policy_version == 7
        pairs: list = []
        for _ in range(4):  # unseeded samples may stop early: sample again until there are enough tokens
            pairs += zip(ps, await generate_all(engine, ps, params))
            if sum(len(gen.token_ids) for _, gen in pairs) >= 3 * len(ps):
                break
        d_new = d_old = 0.0
        for p, gen in pairs:
            check_shape(engine, gen, params)
            assert gen.versions == [7] * len(gen.token_ids)
            lp = torch.tensor(gen.logprobs)
            d_new = max(d_new, (hf_logprobs(new, p, gen.token_ids) - lp).abs().max().item())
            d_old = max(d_old, (hf_logprobs(hf, p, gen.token_ids) - lp).abs().max().item())
        n = sum(len(gen.token_ids) for _, gen in pairs)
        print(
            f"[{engine.kind}] after update: max |logprob - HF(new)| = {d_new:.2e}, vs HF(old) = {d_old:.2e}"
            f" over {n} tokens"
        )
        assert n >= 3 * len(ps), "too few tokens to compare"
        assert d_old > 10 * tol, "the perturbation is too small to tell the weights apart"
        assert d_new <= tol
    finally:
        await engine.update_weights(original, 8)
    gens = await generate_all(engine, ps, params)
    d_back = max(
        (hf_logprobs(hf, p, g.token_ids) - torch.tensor(g.logprobs)).abs().max().item() for p, g in zip(ps, gens)
    )
    assert all(g.versions == [8] * len(g.token_ids) for g in gens)
    print(f"[{engine.kind}] restored: max |logprob - HF| = {d_back:.2e}")
    assert d_back <= tol


# --- seeds ---------------------------------------------------------------------------------------
async def test_seeded_sampling_is_reproducible(engine):
    if engine.kind == "sglang":
        r = httpx.get(f"{engine.urls[0]}/server_info", timeout=30)
        assert r.status_code == 200, r.text[:300]
        if not r.json().get("enable_deterministic_inference"):
            components.unavailable(
                "sglang-deterministic",
                "SGLang honours sampling_seed only with --enable-deterministic-inference "
                "(sampling_batch_info.py), which refuses torch_native, the CPU attention backend "
                "(arg_groups/overrides.py); this server runs without it",
            )
    ps = prompts(8, seed=7)
    seeded = [SamplingParams(max_new_tokens=32, temperature=1.0, seed=1000 + i) for i in range(len(ps))]
    a = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(ps, seeded)))
    b = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(reversed(ps), reversed(seeded))))
    assert [g.token_ids for g in a] == [g.token_ids for g in reversed(b)]
    other = await asyncio.gather(
        *(engine.generate(p, SamplingParams(max_new_tokens=32, seed=5000 + i)) for i, p in enumerate(ps))
    )
    assert [g.token_ids for g in other] != [g.token_ids for g in a], "the seed has no effect"
