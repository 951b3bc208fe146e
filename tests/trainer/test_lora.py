"""LoRA on the FSDP2 trainer: what trains, the merged weights engines get, checkpoints, the critic."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from trainer_helpers import assert_engine_reproduces_trainer, make_samples, max_diff

from agentrl.config.schema import field_docs, load_config
from agentrl.errors import ConfigError
from agentrl.trainer import Trainer, TrainerConfig
from agentrl.trainer import lora as L
from agentrl.trainer.checkpoint import gather_model
from agentrl.trainer.config import LORA_TARGETS, LoraConfig

HIDDEN, LAYERS, INTER, RANK = 64, 2, 256, 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from agentrl.warmstart.tiny_model import build_model

    return str(
        build_model(
            tmp_path_factory.mktemp("lora-model"), hidden_size=HIDDEN, num_layers=LAYERS, intermediate_size=INTER
        )
    )


def lora_cfg(rank: int = RANK, **kw) -> TrainerConfig:
    return TrainerConfig(lr=1e-2, lora=LoraConfig(rank=rank, alpha=8.0), **kw)


def raw(t: Trainer, critic: bool = False) -> dict[str, torch.Tensor]:
    """The gathered state dict with adapters (not merged)."""
    return {k: v.clone() for k, v in gather_model(t.critic if critic else t.model).items()}


# -- config --------------------------------------------------------------------------------------
def test_lora_fields_are_documented_set_from_the_command_line_and_checked():
    docs = {name: d for name, d, _ in field_docs(TrainerConfig)}
    assert {
        "lora.rank",
        "lora.alpha",
        "lora.dropout",
        "lora.target_modules",
        "lora.export_merged",
        "lora.train_norms",
    } <= set(docs)
    assert all(docs[k] for k in docs if k.startswith("lora."))
    cfg = load_config([], ["trainer.lora.rank=8", "trainer.lora.target_modules=[q_proj,v_proj]"]).trainer
    assert cfg.lora.rank == 8 and cfg.lora.target_modules == ["q_proj", "v_proj"] and cfg.lora.scaling == 4.0
    with pytest.raises(ConfigError, match="trainer.lora.target_modules: empty"):
        TrainerConfig(lora=LoraConfig(rank=4, target_modules=[])).check()
    with pytest.raises(ConfigError, match="trainer.lora.rank"):
        load_config([], ["trainer.lora.rank=-1"])


def test_unknown_target_modules_name_the_models_linear_layers(model_dir):
    with pytest.raises(ConfigError, match=r"none of \['qkv'\].*q_proj"):
        Trainer(model_dir, TrainerConfig(lora=LoraConfig(rank=4, target_modules=["qkv"])))


# -- what trains ---------------------------------------------------------------------------------
def test_trainable_parameters_are_exactly_the_adapters(model_dir):
    # per layer: r * (in + out) for q, k, v, o (64 -> 64), gate, up (64 -> 256) and down (256 -> 64)
    per_layer = RANK * (4 * (HIDDEN + HIDDEN) + 3 * (HIDDEN + INTER))
    with Trainer(model_dir, lora_cfg()) as t:
        assert L.count_trainable(t.model) == LAYERS * per_layer == 11776
        in_optim = [p for g in t.optimizer.param_groups for p in g["params"]]
        assert sum(p.numel() for p in in_optim) == LAYERS * per_layer
        names = {id(p): n for n, p in t.model.named_parameters()}
        assert all(L.is_adapter(names[id(p)]) for p in in_optim)
        assert len([n for n in names.values() if L.is_adapter(n)]) == LAYERS * len(LORA_TARGETS) * 2
        assert all(p.dtype == torch.float32 for p in in_optim)
    # norm_lr_scale's gain group is empty under LoRA (the gains are frozen): still one group
    with Trainer(model_dir, lora_cfg(norm_lr_scale=300.0)) as t:
        assert len(t.optimizer.param_groups) == 1


def test_steps_change_only_the_adapters_and_the_value_head(model_dir):
    samples = make_samples(4, returns=True)
    with Trainer(model_dir, lora_cfg(kl_coef=0.05), critic=True) as t:
        before, critic_before = raw(t), raw(t, critic=True)
        merged0 = t.full_state_dict()
        losses = [t.train_step(samples)["loss"] for _ in range(3)]
        after, critic_after = raw(t), raw(t, critic=True)
    assert losses[-1] < losses[0]
    for sd0, sd1 in ((before, after), (critic_before, critic_after)):
        frozen = [k for k in sd0 if not L.is_adapter(k) and not k.startswith("value_head.")]
        assert frozen and all(torch.equal(sd0[k], sd1[k]) for k in frozen)  # bitwise
        assert all(not torch.equal(sd0[k], sd1[k]) for k in sd0 if ".lora_B." in k)
    assert not torch.equal(critic_before["value_head.weight"], critic_after["value_head.weight"])
    # B starts at 0: before any step the merged weights are the base model's, bit for bit
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    assert set(merged0) == set(base) and max_diff(merged0, base) == 0.0


def test_activation_checkpointing_with_adapter_dropout_gives_the_same_update(model_dir):
    samples = make_samples(4)
    out = []
    for ac in (False, True):
        cfg = TrainerConfig(
            lr=1e-3,
            activation_checkpointing=ac,
            micro_batch_tokens=48,
            lora=LoraConfig(rank=RANK, alpha=8.0, dropout=0.1),
        )
        with Trainer(model_dir, cfg) as t:
            t.train_step(samples)
            out.append(raw(t))
    assert max_diff(*out) < 1e-6
    assert max(out[0][k].abs().max().item() for k in out[0] if ".lora_B." in k) > 0


# -- merged weights ------------------------------------------------------------------------------
def test_merged_weight_is_base_plus_scaled_b_at_a_by_hand(model_dir):
    with Trainer(model_dir, lora_cfg()) as t:
        for _ in range(2):
            t.train_step(make_samples(3))
        sd, merged = raw(t), t.full_state_dict()
    p = "model.layers.1.mlp.down_proj"
    A, B, W = sd[f"{p}.lora_A.default.weight"], sd[f"{p}.lora_B.default.weight"], sd[f"{p}.base_layer.weight"]
    assert A.shape == (RANK, INTER) and B.shape == (HIDDEN, RANK)
    hand = [
        [
            W[i, j].item() + sum(B[i, k].item() * A[k, j].item() for k in range(RANK)) * (8.0 / RANK)
            for j in range(0, INTER, 37)
        ]
        for i in range(0, HIDDEN, 7)
    ]
    got = merged[f"{p}.weight"][::7, ::37]
    assert torch.allclose(got.double(), torch.tensor(hand, dtype=torch.float64), atol=1e-6)
    assert not torch.equal(merged[f"{p}.weight"], W)
    assert not any(L.is_adapter(k) or ".base_layer." in k for k in merged)


def test_merged_state_dict_is_pure_and_rejects_a_half_adapter():
    A, B = torch.ones(2, 3), torch.full((4, 2), 0.5)
    sd = {
        "m.p.base_layer.weight": torch.zeros(4, 3),
        "m.p.base_layer.bias": torch.ones(4),
        "m.p.lora_A.default.weight": A,
        "m.p.lora_B.default.weight": B,
        "m.norm.weight": torch.ones(3),
    }
    out = L.merged_state_dict(sd, 2.0)
    assert set(out) == {"m.p.weight", "m.p.bias", "m.norm.weight"}
    assert torch.equal(out["m.p.weight"], torch.full((4, 3), 2.0)) and torch.equal(
        sd["m.p.base_layer.weight"], torch.zeros(4, 3)
    )
    with pytest.raises(ValueError, match="lora_B"):
        L.merged_state_dict({k: v for k, v in sd.items() if "lora_B" not in k}, 2.0)
    with pytest.raises(ValueError, match="no lora_A partner"):
        L.merged_state_dict({k: v for k, v in sd.items() if "lora_A" not in k}, 2.0)
    assert L.from_peft(L.to_peft(sd)).keys() == {"m.p.lora_A.default.weight", "m.p.lora_B.default.weight"}


def test_weight_sync_of_merged_weights_to_the_local_engine(model_dir):
    """The merged full_state_dict goes through the existing LocalEngine.update_weights path; the
    engine then samples with the trainer's distribution (mismatch ~ 0)."""
    assert_engine_reproduces_trainer(model_dir, lora_cfg(policy_loss="sft"))


# -- checkpoints ---------------------------------------------------------------------------------
def test_save_load_resumes_bit_for_bit_with_adapters(model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ck = tmp_path / "ck"
    batch1, batch2 = make_samples(5, seed=1, returns=True), make_samples(5, seed=2, returns=True)
    cfg = lora_cfg(lr_schedule="cosine", warmup_steps=1, total_steps=10, kl_coef=0.05)
    with Trainer(model_dir, cfg, critic=True) as a:
        a.train_step(batch1)
        a.save(ck, extra={"data_position": 3})
        rng_a = (torch.rand(3), np.random.rand(2), random.random())
        m_a = a.train_step(batch2)
        p_a, c_a, v_a = raw(a), raw(a, critic=True), a.values(batch2)
    with Trainer(model_dir, cfg, critic=True) as b:
        assert b.load(ck) == {"data_position": 3} and b.version == 1
        rng_b = (torch.rand(3), np.random.rand(2), random.random())
        m_b = b.train_step(batch2)
        p_b, c_b, v_b = raw(b), raw(b, critic=True), b.values(batch2)
    assert torch.equal(rng_a[0], rng_b[0]) and np.array_equal(rng_a[1], rng_b[1]) and rng_a[2] == rng_b[2]
    assert max_diff(p_a, p_b) == 0.0 and max_diff(c_a, c_b) == 0.0
    assert m_a["lr"] == m_b["lr"] and m_a["loss"] == m_b["loss"] and v_a == v_b
    # adapters in peft format; the trainable state only; the top level is the merged HF export
    crit = json.loads((ck / "trainer_state.json").read_text())
    assert crit["lora_rank"] == RANK
    from safetensors.torch import load_file

    critic_keys = set(load_file(str(ck / "critic" / "critic.safetensors")))
    assert critic_keys and all(L.is_adapter(k) or k.startswith("value_head.") for k in critic_keys)
    merged = AutoModelForCausalLM.from_pretrained(ck)
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(ck / "adapter"))
    ids = torch.tensor([batch1[0].token_ids])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, peft(input_ids=ids).logits, atol=1e-5)


def test_adapter_only_checkpoints_and_mismatched_resumes_are_clear(model_dir, tmp_path):
    cfg = TrainerConfig(lr=1e-2, lora=LoraConfig(rank=RANK, alpha=8.0, export_merged=False))
    with Trainer(model_dir, cfg) as t:
        t.train_step(make_samples(2))
        t.save(tmp_path / "lora")
    assert not (tmp_path / "lora" / "model.safetensors").exists()
    assert (tmp_path / "lora" / "adapter" / "adapter_model.safetensors").exists()
    with Trainer(model_dir, TrainerConfig()) as full:
        with pytest.raises(ConfigError, match="trainer.lora.rank=4, this trainer has 0"):
            full.load(tmp_path / "lora")
        full.save(tmp_path / "full")
    with Trainer(model_dir, lora_cfg()) as t:
        with pytest.raises(ConfigError, match="trainer.lora.rank=0, this trainer has 4"):
            t.load(tmp_path / "full")
    other = TrainerConfig(lora=LoraConfig(rank=RANK, alpha=16.0))
    with Trainer(model_dir, other) as t:
        with pytest.raises(ConfigError, match="alpha 8.0"):
            t.load(tmp_path / "lora")
    narrow = TrainerConfig(lora=LoraConfig(rank=RANK, alpha=8.0, target_modules=["q_proj"]))
    with Trainer(model_dir, narrow) as t:
        with pytest.raises(ConfigError, match="target_modules"):
            t.load(tmp_path / "lora")


# -- lora.train_norms: the normalization gains train beside the adapters --------------------------
GAINS = LAYERS * (32 + 32 + HIDDEN + HIDDEN) + HIDDEN  # q_norm, k_norm (head_dim 32), 2 layernorms; model.norm


def norms_cfg(**kw) -> TrainerConfig:
    return TrainerConfig(lr=1e-2, lora=LoraConfig(rank=RANK, alpha=8.0, train_norms=True), **kw)


def test_train_norms_trains_the_gains_at_the_gain_rate_and_engines_get_them(model_dir):
    with Trainer(model_dir, norms_cfg(norm_lr_scale=10.0)) as t:
        gains = L.trained_gains(t.model)
        assert len(gains) == 4 * LAYERS + 1 and sum(dict(t.model.named_parameters())[g].numel() for g in gains) == GAINS
        assert L.count_trainable(t.model) == 11776 + GAINS  # the adapters (above) + the gains
        adapters_group, gains_group = t.optimizer.param_groups
        assert gains_group["lr"] == pytest.approx(10 * adapters_group["lr"]) and adapters_group["lr"] == 1e-2
        assert sum(p.numel() for p in gains_group["params"]) == GAINS
        before = raw(t)
        t.train_step(make_samples(4))
        after, merged = raw(t), t.full_state_dict()
    assert all(not torch.equal(before[g], after[g]) for g in gains)
    frozen = [k for k in before if not L.is_adapter(k) and k not in gains]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)
    assert all(torch.equal(merged[g], after[g]) for g in gains)  # what weight sync sends


def test_train_norms_checkpoint_resumes_and_loads_in_peft(model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ck, batch = tmp_path / "ck", make_samples(3, seed=4)
    with Trainer(model_dir, norms_cfg(norm_lr_scale=10.0)) as a:
        a.train_step(make_samples(3, seed=3))
        a.save(ck)
        a.train_step(batch)
        p_a = raw(a)
    with Trainer(model_dir, norms_cfg(norm_lr_scale=10.0)) as b:
        b.load(ck)
        b.train_step(batch)
        assert max_diff(p_a, raw(b)) == 0.0
    saved = json.loads((ck / "adapter" / "adapter_config.json").read_text())
    assert sorted(saved["modules_to_save"]) == [
        "input_layernorm",
        "k_norm",
        "norm",
        "post_attention_layernorm",
        "q_norm",
    ]
    merged = AutoModelForCausalLM.from_pretrained(ck)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    assert not torch.equal(merged.model.norm.weight, base.model.norm.weight)  # the export has the trained gains
    peft = PeftModel.from_pretrained(base, str(ck / "adapter"))
    ids = torch.tensor([batch[0].token_ids])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, peft(input_ids=ids).logits, atol=1e-5)
    with Trainer(model_dir, lora_cfg()) as c:
        with pytest.raises(ConfigError, match="with trained normalization gains.*train_norms=false"):
            c.load(ck)


def test_peft_names_of_adapters_and_gains_round_trip():
    sd = {
        "model.layers.0.self_attn.q_proj.lora_A.default.weight": torch.ones(2, 3),
        "model.layers.0.self_attn.q_proj.base_layer.weight": torch.zeros(3, 3),
        "model.norm.weight": torch.full((3,), 2.0),
    }
    files = L.to_peft(sd, ["model.norm.weight"])
    assert set(files) == {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
        "base_model.model.model.norm.weight",
    }
    back = L.from_peft(files)
    assert set(back) == {"model.layers.0.self_attn.q_proj.lora_A.default.weight", "model.norm.weight"}
    assert torch.equal(back["model.norm.weight"], sd["model.norm.weight"])
    assert set(L.to_peft(sd)) == {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"}
    with pytest.raises(ValueError, match="prefix"):
        L.from_peft({"model.norm.weight": torch.ones(1)})
