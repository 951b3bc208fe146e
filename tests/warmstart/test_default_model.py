"""The built-in default model: built locally, SFT-warm-started once, cached by a fingerprint."""

from __future__ import annotations

import json

import pytest

from agentrl.warmstart import default_model

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def small_recipe(tmp_path, monkeypatch):
    """A tiny recipe (seconds, not a minute) in a private cache."""
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(
        default_model,
        "BASE",
        dict(hidden_size=32, num_layers=1, num_heads=1, intermediate_size=64, vocab_size=2048, arch="qwen3", seed=0),
    )
    monkeypatch.setattr(
        default_model,
        "WARM_START",
        dict(steps=3, batch_size=4, lr=1e-3, warmup_steps=1, min_lr_ratio=0.1, num_demos=8, difficulty=[1, 2], seed=0),
    )
    return tmp_path / "cache"


def test_default_model_is_built_warm_started_and_cached(small_recipe):
    from transformers import AutoModelForCausalLM

    path = default_model.resolve_model_path(None)
    assert path.parent == small_recipe / "models" and "sft" in path.name
    summary = json.loads((path / "sft_summary.json").read_text())
    assert summary["demonstrations"] == 8 and summary["steps"] == 3 and summary["model"] == str(path)
    model = AutoModelForCausalLM.from_pretrained(str(path))
    base = AutoModelForCausalLM.from_pretrained(str(default_model.base_model_path()))
    # the warm start changed the weights
    assert any((a - b).abs().max() > 0 for a, b in zip(model.parameters(), base.parameters()))
    mtime = (path / "config.json").stat().st_mtime_ns
    assert default_model.resolve_model_path(None) == path  # cached: not rebuilt
    assert (path / "config.json").stat().st_mtime_ns == mtime
    leftovers = [p.name for p in path.parent.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")]
    assert leftovers == []  # no half-built temp dirs


def test_recipe_change_builds_a_new_model(small_recipe, monkeypatch):
    first = default_model.fingerprint()
    monkeypatch.setitem(default_model.WARM_START, "steps", 4)
    assert default_model.fingerprint() != first


def test_a_failed_build_leaves_nothing_behind(small_recipe, monkeypatch):
    import agentrl.warmstart.sft

    def boom(*a, **k):
        raise RuntimeError("SFT crashed")

    monkeypatch.setattr(agentrl.warmstart.sft, "run_sft", boom)
    with pytest.raises(RuntimeError, match="SFT crashed"):
        default_model.default_model_path()
    models = small_recipe / "models"
    assert [p.name for p in models.iterdir() if "sft" in p.name and not p.name.endswith(".lock")] == []


def test_missing_model_dir_is_a_clear_error(tmp_path):
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match="missing"):
        default_model.resolve_model_path(str(tmp_path / "missing"))
