"""The built-in TextWorld warm start: selected by ``model.path: builtin:textworld``, built once from its
own base (word-level tokenizer trained on TextWorld text too), cached beside (and independently of)
the default code_exec model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.warmstart import default_model, textworld_model

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def small_recipe(tmp_path, monkeypatch):
    """A tiny base and a 2-phase warm start (2 steps on 4 demonstrations, then 1 step on 6), in a private cache."""
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    small = dict(hidden_size=32, num_layers=1, num_heads=1, intermediate_size=64, vocab_size=2048, seed=0)
    monkeypatch.setattr(default_model, "BASE", dict(small, arch="qwen3"))
    monkeypatch.setattr(textworld_model, "TEXTWORLD_BASE", dict(small, tokenizer_style="words", corpus="textworld"))
    monkeypatch.setattr(
        textworld_model,
        "TEXTWORLD_WARM_START",
        dict(
            difficulty=[1],
            demo_seed=0,
            planner="explorer",
            loss_on="all",
            phases=[
                dict(num_demos=4, sft=dict(steps=2, batch_size=2, lr=1e-3, warmup_steps=1, min_lr_ratio=0.1, seed=0)),
                dict(num_demos=6, sft=dict(steps=1, batch_size=2, lr=1e-4, warmup_steps=0, min_lr_ratio=0.1, seed=0)),
            ],
        ),
    )
    return tmp_path / "cache"


def test_builtin_textworld_is_built_from_its_own_base_and_cached(small_recipe, capfd):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model.resolve_model_path("builtin:textworld")
    err = capfd.readouterr().err  # a long build says where it is
    assert "TextWorld warm start: phase 1/2, step 2/2, loss" in err and "phase 2/2, step 1/1, loss" in err
    assert path.parent == small_recipe / "models" and path.name.startswith("tiny-qwen3-textworld-sft-")
    summary = json.loads((path / "sft_summary.json").read_text())
    assert summary["examples"] == 6 and summary["steps"] == 1 and summary["model"] == str(path)
    assert summary["phase"] == 2 and summary["recipe"]["difficulty"] == [1]
    first = json.loads((Path(summary["base_model"]) / "sft_summary.json").read_text())  # phase 2 starts at phase 1
    assert first["phase"] == 1 and first["examples"] == 4 and first["steps"] == 2
    assert Path(summary["base_model"]).name.startswith("tiny-qwen3-textworld-sft-") and "phase1of2" in first["model"]
    tok = AutoTokenizer.from_pretrained(str(path))  # the base's word-level tokenizer, saved with the model
    demos = textworld_model._demos(tok, 6)  # loss_on="all": every token after the first is a target
    assert summary["target_tokens"] == sum(len(d.token_ids) - 1 for d in demos) > sum(sum(d.loss_mask) for d in demos)
    model = AutoModelForCausalLM.from_pretrained(str(path))
    base_dir = textworld_model.textworld_base_path()
    assert base_dir.parent == path.parent and base_dir.name.startswith("tiny-qwen3-textworld-base-")
    base = AutoModelForCausalLM.from_pretrained(str(base_dir))
    assert any((a - b).abs().max() > 0 for a, b in zip(model.parameters(), base.parameters()))
    name = tok.tokenize("laundry room")
    assert len(name) == 2 and name == tok.tokenize(' {"room": "laundry room"}')[-4:-2]
    assert name == tok.tokenize("Exits: laundry room, pantry.")[2:4]
    mtime = (path / "config.json").stat().st_mtime_ns
    assert default_model.resolve_model_path("builtin:textworld") == path  # cached: not rebuilt
    assert (path / "config.json").stat().st_mtime_ns == mtime
    # the default model and its base are other entries, not built by this one
    assert not any(p.name.startswith(("tiny-qwen3-sft-", "tiny-qwen3-base-")) for p in path.parent.iterdir())


def test_textworld_recipe_change_builds_a_new_model_and_leaves_the_default_key_alone(small_recipe, monkeypatch):
    base = textworld_model.textworld_base_path()
    default_key, first = default_model.fingerprint(), textworld_model.fingerprint(base)
    phase1 = textworld_model.fingerprint(base, 1)
    phases = textworld_model.TEXTWORLD_WARM_START["phases"]
    monkeypatch.setitem(textworld_model.TEXTWORLD_WARM_START, "phases", [phases[0], dict(phases[1], num_demos=5)])
    assert textworld_model.fingerprint(base) != first
    assert textworld_model.fingerprint(base, 1) == phase1  # a change in phase 2 keeps phase 1's model
    monkeypatch.setitem(textworld_model.TEXTWORLD_WARM_START, "difficulty", [2])
    assert textworld_model.fingerprint(base, 1) != phase1
    assert default_model.fingerprint() == default_key


def test_a_build_stopped_in_a_later_phase_resumes_from_the_cached_earlier_phase(small_recipe, monkeypatch):
    from agentrl.warmstart import sft

    real, calls = sft.run_sft, []

    def run_sft(start, out, cfg, **kw):
        calls.append(cfg.steps)
        if len(calls) == 2:
            raise KeyboardInterrupt  # stopped during phase 2
        return real(start, out, cfg, **kw)

    monkeypatch.setattr(sft, "run_sft", run_sft)
    with pytest.raises(KeyboardInterrupt):
        default_model.resolve_model_path("builtin:textworld")
    models = small_recipe / "models"
    assert [p.name for p in models.iterdir() if "phase1of2" in p.name and not p.name.startswith(".")]
    assert not [p for p in models.iterdir() if p.is_dir() and p.name.startswith(".")]  # no half-built model left
    path = default_model.resolve_model_path("builtin:textworld")
    assert calls == [2, 1, 1] and (path / "config.json").exists()  # phase 1 was not trained again
