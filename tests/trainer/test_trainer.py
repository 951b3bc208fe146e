"""The FSDP2 trainer on one process: learning signal, masking, accumulation, checkpoints, ref, critic."""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest
import torch
from trainer_helpers import assert_engine_reproduces_trainer, make_samples, max_diff

from agentrl.config.schema import field_docs
from agentrl.errors import ConfigError
from agentrl.trainer import Trainer, TrainerConfig, TrainSample
from agentrl.trainer.optim import lr_lambda


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl.warmstart.tiny_model import build_model

    return str(build_model(tmp_path_factory.mktemp("trainer-model"), hidden_size=64, num_layers=2))


def params(t: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in t.full_state_dict().items()}


def masked_mean(lps: list[list[float]], samples: list[TrainSample], i: int) -> float:
    s = samples[i]
    return sum(lp * m for lp, m in zip(lps[i], s.loss_mask)) / sum(s.loss_mask)


# -- config --------------------------------------------------------------------------------------
def test_every_field_is_documented_and_checked():
    docs = field_docs(TrainerConfig)
    assert docs and all(d for _, d, _ in docs)
    with pytest.raises(ConfigError, match="adam_betas"):
        TrainerConfig(adam_betas=[0.9]).check()
    with pytest.raises(ConfigError, match="loss_norm_len"):
        TrainerConfig(loss_agg="seq-mean-token-sum-norm").check()
    with pytest.raises(ConfigError, match="warmup_steps"):
        TrainerConfig(lr_schedule="cosine", warmup_steps=5, total_steps=5).check()


def test_lr_schedule_warmup_then_cosine():
    f = lr_lambda(TrainerConfig(lr_schedule="cosine", warmup_steps=2, total_steps=6, min_lr_ratio=0.1))
    assert [round(f(s), 4) for s in range(8)] == [0.5, 1.0, 1.0, 0.8682, 0.55, 0.2318, 0.1, 0.1]
    g = lr_lambda(TrainerConfig(warmup_steps=4))
    assert [g(s) for s in (0, 3, 4, 100)] == [0.25, 1.0, 1.0, 1.0]


def test_unknown_loss_name_lists_the_choices(model_dir):
    with pytest.raises(ConfigError, match=r"trainer.policy_loss: 'ppo' is not one of \["):
        Trainer(model_dir, TrainerConfig(policy_loss="ppo"))


# -- learning signal -----------------------------------------------------------------------------
def test_sft_loss_decreases_on_a_fixed_batch(model_dir):
    samples = make_samples(6)
    cfg = TrainerConfig(policy_loss="sft", lr=3e-3, micro_batch_tokens=64)
    with Trainer(model_dir, cfg) as t:
        losses = [t.train_step(samples)["loss"] for _ in range(6)]
        assert t.version == 6
    assert losses[-1] < losses[0] - 0.5, losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_ppo_clip_moves_logprobs_with_the_advantage(model_dir):
    samples = make_samples(4, adv=[1.0, -1.0, 1.0, -1.0])
    with Trainer(model_dir, TrainerConfig(lr=1e-3, old_logprobs="current")) as t:
        before = t.logprobs(samples)
        for s, lp in zip(samples, before):  # engine == trainer: on-policy
            s.behaviour_logprobs = [x * m for x, m in zip(lp, s.loss_mask)]
        m = t.train_step(samples)
        after = t.logprobs(samples)
    assert m["clipfrac"] == 0.0 and abs(m["ratio"] - 1.0) < 1e-6
    assert m["mismatch/abs_diff_max"] < 1e-5
    for i, s in enumerate(samples):
        delta = masked_mean(after, samples, i) - masked_mean(before, samples, i)
        assert delta * s.advantages[-1] > 0, (i, delta)


def test_mask0_tokens_contribute_nothing(model_dir):
    a = make_samples(5, adv=[1.0, -0.5, 2.0, -1.0, 0.3])
    b = [dataclasses.replace(s) for s in a]
    for s in b:  # scribble on every mask-0 position of every per-token input
        s.advantages = [x if m else 1e3 for x, m in zip(s.advantages, s.loss_mask)]
        s.behaviour_logprobs = [x if m else -50.0 for x, m in zip(s.behaviour_logprobs, s.loss_mask)]
    cfg = TrainerConfig(lr=1e-3, micro_batch_tokens=48, kl_coef=0.1, entropy_coef=0.01, tis_cap=2.0)
    updates = []
    for batch in (a, b):
        with Trainer(model_dir, cfg) as t:
            t.train_step(batch)
            updates.append(params(t))
    assert max_diff(*updates) == 0.0


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_gradient_accumulation_matches_one_big_micro_batch(model_dir, agg):
    samples = make_samples(8, seed=1, adv=[1.0, -1.0, 0.5, 2.0, -0.3, 1.0, -2.0, 0.7])
    runs = {}
    for name, mbt, batching in (("small", 40, "pack"), ("large", 4096, "pack"), ("padded", 64, "pad")):
        cfg = TrainerConfig(lr=1e-3, micro_batch_tokens=mbt, batching=batching, loss_agg=agg)
        with Trainer(model_dir, cfg) as t:
            m = t.train_step(samples)
            runs[name] = (m, params(t))
    assert runs["small"][0]["micro_batches"] > 3 and runs["large"][0]["micro_batches"] == 1
    for other in ("small", "padded"):
        # Adam's first step is ~ lr * g / |g|: for near-zero gradients float summation-order noise
        # is amplified, so the update is compared at 1% of lr; loss and grad norm tightly.
        assert max_diff(runs["large"][1], runs[other][1]) < 1e-2 * 1e-3
        assert runs[other][0]["loss"] == pytest.approx(runs["large"][0]["loss"], rel=1e-6)
        assert runs[other][0]["grad_norm"] == pytest.approx(runs["large"][0]["grad_norm"], rel=1e-5)


def test_activation_checkpointing_gives_the_same_update(model_dir):
    samples = make_samples(4)
    out = []
    for ac in (False, True):
        with Trainer(model_dir, TrainerConfig(lr=1e-3, activation_checkpointing=ac, micro_batch_tokens=48)) as t:
            t.train_step(samples)
            out.append(params(t))
    assert max_diff(*out) < 1e-6


def test_metrics_report_the_step(model_dir):
    samples = make_samples(4)
    cfg = TrainerConfig(lr=1e-3, max_grad_norm=1e-3, tis_cap=2.0, warmup_steps=2, micro_batch_tokens=48)
    with Trainer(model_dir, cfg) as t:
        m = t.train_step(samples)
        m2 = t.train_step(samples)
    for k in (
        "loss",
        "pg_loss",
        "kl",
        "entropy",
        "clipfrac",
        "grad_norm",
        "lr",
        "tokens",
        "tokens_per_s",
        "tis_weight",
        "mismatch/abs_diff_mean",
        "mismatch/kl_k3",
        "mismatch/frac_capped",
    ):
        assert k in m or (k == "kl" and "kl" not in m), k
    assert m["tokens"] == sum(len(s.token_ids) for s in samples)
    assert m["loss_tokens"] == sum(sum(s.loss_mask) for s in samples)
    assert m["lr"] == pytest.approx(5e-4) and m2["lr"] == pytest.approx(1e-3)
    assert m["padding_frac"] == 0.0 and m["grad_norm"] > 1e-3  # reported before clipping
    assert 0 < m["tis_weight"] <= 2.0 and m["entropy"] > 0


def test_too_long_sample_is_a_clear_error(model_dir):
    samples = make_samples(2)
    with Trainer(model_dir, TrainerConfig(micro_batch_tokens=16)) as t:
        with pytest.raises(ValueError, match=r"sample \d has \d+ tokens, more than max_tokens=16"):
            t.train_step(samples)


# -- reference model and critic -----------------------------------------------------------------
def test_reference_kl_is_zero_at_step_zero_then_grows(model_dir):
    samples = make_samples(4)
    with Trainer(model_dir, TrainerConfig(lr=3e-3, kl_coef=0.1, kl_estimator="k1")) as t:
        assert t.ref_logprobs(samples) == t.logprobs(samples)
        first = t.train_step(samples)
        second = t.train_step(samples)
        ref, pol = t.ref_logprobs(samples), t.logprobs(samples)
    assert first["kl"] == 0.0
    assert abs(second["kl"]) > 1e-4 and ref != pol


def test_critic_value_loss_decreases(model_dir):
    samples = make_samples(6, returns=True)
    cfg = TrainerConfig(lr=1e-3, critic_lr=3e-3, value_clip=None, micro_batch_tokens=64)
    with Trainer(model_dir, cfg, critic=True) as t:
        v0 = t.values(samples)
        assert all(v == 0.0 for row in v0 for v in row)  # zero-initialised head
        vl = [t.train_step(samples)["value_loss"] for _ in range(8)]
        v = t.values(samples)
    assert vl[-1] < 0.5 * vl[0], vl
    assert [len(r) for r in v] == [len(s.token_ids) for s in samples] and all(r[0] == 0.0 for r in v)


def test_critic_needs_returns(model_dir):
    with Trainer(model_dir, TrainerConfig(), critic=True) as t:
        with pytest.raises(ValueError, match="no returns"):
            t.train_step(make_samples(2))


# -- weights and checkpoints ---------------------------------------------------------------------
def test_full_state_dict_loads_into_a_fresh_hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    samples = make_samples(3)
    with Trainer(model_dir, TrainerConfig(lr=1e-2)) as t:
        t.train_step(samples)
        sd = t.full_state_dict()
        lps = t.logprobs(samples)
        snapshot = {k: v.clone() for k, v in sd.items()}
        t.train_step(samples)
    assert max_diff(sd, snapshot) == 0.0  # a snapshot, not views of the live weights
    fresh = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    fresh.load_state_dict(sd, strict=True)
    assert max_diff(sd, fresh.state_dict()) == 0.0
    s = samples[0]
    with torch.no_grad():
        logits = fresh(torch.tensor([s.token_ids])).logits[0]
    ref = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(s.token_ids[1:])[:, None])[:, 0]
    assert (ref - torch.tensor(lps[0][1:])).abs().max() < 1e-5


def test_save_load_resumes_bit_for_bit(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ck = tmp_path / "ck"
    batch1, batch2 = make_samples(5, seed=1, returns=True), make_samples(5, seed=2, returns=True)
    cfg = TrainerConfig(lr=1e-3, lr_schedule="cosine", warmup_steps=1, total_steps=10, kl_coef=0.05)
    with Trainer(model_dir, cfg, critic=True) as a:
        a.train_step(batch1)
        (tmp_path / "ck.tmp").mkdir()  # a crashed earlier save must not get in the way
        a.save(ck, extra={"data_position": 17})
        rng_a = (torch.rand(3), np.random.rand(2), random.random())
        m_a = a.train_step(batch2)
        p_a, v_a = params(a), a.values(batch2)
    assert (ck / "COMPLETE").exists() and not (tmp_path / "ck.tmp").exists()
    with Trainer(model_dir, cfg, critic=True) as b:
        assert b.load(ck) == {"data_position": 17} and b.version == 1
        rng_b = (torch.rand(3), np.random.rand(2), random.random())
        m_b = b.train_step(batch2)
        p_b, v_b = params(b), b.values(batch2)
    assert torch.equal(rng_a[0], rng_b[0]) and np.array_equal(rng_a[1], rng_b[1]) and rng_a[2] == rng_b[2]
    assert max_diff(p_a, p_b) <= 1e-6
    assert m_a["lr"] == m_b["lr"] and abs(m_a["loss"] - m_b["loss"]) <= 1e-6
    assert max(abs(x - y) for ra, rb in zip(v_a, v_b) for x, y in zip(ra, rb)) <= 1e-6
    # The directory is an ordinary HF model directory.
    assert "varlen" not in (ck / "config.json").read_text()
    hf = AutoModelForCausalLM.from_pretrained(ck)
    AutoTokenizer.from_pretrained(ck)
    state = json.loads((ck / "trainer_state.json").read_text())
    assert state["version"] == 1 and state["world_size"] == 1
    with Trainer(model_dir, cfg, critic=True) as c:
        c.load(ck)
        assert max_diff(c.full_state_dict(), hf.state_dict()) == 0.0


def test_load_refuses_an_incomplete_checkpoint(model_dir, tmp_path):
    (tmp_path / "half").mkdir()
    with Trainer(model_dir, TrainerConfig()) as t:
        with pytest.raises(FileNotFoundError, match="not a complete trainer checkpoint"):
            t.load(tmp_path / "half")
        t.save(tmp_path / "ck")
        t.save(tmp_path / "ck", extra={"again": True})  # overwriting an existing checkpoint
        assert t.load(tmp_path / "ck") == {"again": True}


def test_process_group_is_shared_and_released(model_dir):
    import torch.distributed as dist

    assert not dist.is_initialized()
    a = Trainer(model_dir, TrainerConfig())
    b = Trainer(model_dir, TrainerConfig())
    a.close()
    assert dist.is_initialized()  # b still uses it
    b.logprobs(make_samples(1))
    b.close()
    assert not dist.is_initialized()


def test_weight_sync_to_the_local_engine_reproduces_trainer_logprobs(model_dir):
    """full_state_dict -> LocalEngine.update_weights; the engine then samples with the trainer's
    distribution, so the trainer's recomputed logprobs match the engine's (mismatch ~ 0)."""
    assert_engine_reproduces_trainer(model_dir, TrainerConfig(lr=1e-2, policy_loss="sft"))


# -- several optimizer steps per train_step (PPO epochs x mini-batches) ----------------------------


def test_mini_batches_equal_that_many_sequential_steps(model_dir):
    """With the sft loss (no ratio) and one sample repeated, 2 mini-batches of one train_step are the
    same two optimizer steps as two 1-sample train_steps; the version and the schedule advance once."""
    s = make_samples(1, seed=4)
    common = dict(lr=1e-3, policy_loss="sft")
    with Trainer(model_dir, TrainerConfig(**common, mini_batches=2)) as t:
        m = t.train_step(s * 2)
        split = params(t)
        assert t.version == 1 and m["optimizer_steps"] == 2 and m["version"] == 1.0
        assert t.scheduler.last_epoch == 1
    with Trainer(model_dir, TrainerConfig(**common)) as t:
        t.train_step(s)
        t.train_step(s)
        seq = params(t)
    assert max_diff(split, seq) < 1e-7


def test_epochs_take_the_ratio_against_the_start_of_the_step(model_dir):
    """old_logprobs='current': one pass has ratio 1 exactly; a second epoch sees the moved policy
    (ratio != 1, and with a large lr the clip engages), while the start logprobs stay the denominator."""
    samples = make_samples(6, seed=5, adv=[1.0, -1.0, 2.0, -2.0, 1.0, -1.0])
    base = dict(lr=5e-2, old_logprobs="current", micro_batch_tokens=4096)
    with Trainer(model_dir, TrainerConfig(**base)) as t:
        one = t.train_step(samples)
    with Trainer(model_dir, TrainerConfig(**base, ppo_epochs=3, mini_batches=2)) as t:
        three = t.train_step(samples)
    assert one["ratio"] == pytest.approx(1.0, abs=1e-6) and one["clipfrac"] == 0.0
    assert three["optimizer_steps"] == 6 and three["clipfrac"] > 0.0
    assert three["loss_tokens"] == 3 * one["loss_tokens"]


def test_mini_batches_never_exceed_the_samples(model_dir):
    with Trainer(model_dir, TrainerConfig(lr=1e-3, mini_batches=8)) as t:
        m = t.train_step(make_samples(3))
    assert m["optimizer_steps"] == 3


def test_norm_lr_scale_moves_only_the_gains_faster(model_dir):
    """Adam's first step is lr * g/|g| per parameter, so with the same gradients the weights move the
    same and the normalization gains move norm_lr_scale times as far."""
    samples = make_samples(4, seed=6, adv=[1.0, -1.0, 0.5, -0.5])
    moved = {}
    for scale in (1.0, 10.0):
        with Trainer(model_dir, TrainerConfig(lr=1e-4, norm_lr_scale=scale)) as t:
            before = params(t)
            m = t.train_step(samples)
            moved[scale] = {k: (v - before[k]).abs() for k, v in params(t).items()}
            assert m["lr"] == pytest.approx(1e-4)
    gains = [k for k in moved[1.0] if moved[1.0][k].ndim == 1 and "norm" in k]
    assert "model.norm.weight" in gains and len(gains) >= 5
    for k in moved[1.0]:
        if k in gains:
            ratio = moved[10.0][k].max() / moved[1.0][k].max()
            assert 9.0 < ratio < 11.0, (k, ratio)
        else:
            assert torch.allclose(moved[10.0][k], moved[1.0][k], atol=1e-9), k


def test_resuming_with_another_norm_lr_scale_is_a_clear_error(model_dir, tmp_path):
    with Trainer(model_dir, TrainerConfig(lr=1e-3)) as t:
        t.train_step(make_samples(2))
        t.save(tmp_path / "ck")
    with Trainer(model_dir, TrainerConfig(lr=1e-3, norm_lr_scale=10)) as t:
        with pytest.raises(ConfigError, match="trainer.norm_lr_scale"):
            t.load(tmp_path / "ck")


def test_an_interrupted_step_changes_nothing(model_dir):
    """A stop set while a step runs (here: after its first micro-batch) ends the call before the
    optimizer step, with its gradients dropped: the next step is exactly a fresh trainer's first."""
    import threading

    from agentrl.trainer.trainer import StepInterrupted

    samples = make_samples(6)
    cfg = TrainerConfig(lr=1e-2, micro_batch_tokens=32, seed=1)
    with Trainer(model_dir, cfg) as fresh:
        fresh.train_step(samples)
        want = params(fresh)
    with Trainer(model_dir, cfg) as t:
        before = params(t)
        stop, real, calls = threading.Event(), t._micro_step, []

        def micro_step(*a):
            calls.append(1)
            real(*a)
            stop.set()

        t._micro_step = micro_step
        with pytest.raises(StepInterrupted, match="before micro-batch 2 of"):
            t.train_step(samples, stop)
        assert len(calls) == 1 and t.version == 0
        assert all(p.grad is None for p in t.model.parameters())
        assert max_diff(params(t), before) == 0.0
        t._micro_step = real
        t.train_step(samples, threading.Event())
        assert t.version == 1 and max_diff(params(t), want) == 0.0
