"""The practice start (``agentrl.warmstart.textworld_practice``): its cache over a fake build that records its
calls, and the real build shortened (1 world, 2 games, 2 SFT steps). The full build (4-9 minutes) runs in
``bench/bench_credit.py --env textworld --model practice`` when the cache has no start of the current recipe."""

import pytest

from agentrl.warmstart import textworld_practice


def test_practice_start_is_built_once_per_world_count_and_then_reused(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    built = []

    def fake_build(dest, worlds, log):  # a stand-in for the 6-minute SFT: writes what a model dir must have
        built.append(worlds)
        for step in (1, 50, 51, 200):  # the SFT's steps call log; a long build says where it is
            log(step, {"loss": 1.0 / step})
        (dest / "config.json").write_text("{}")
        return dest

    monkeypatch.setattr(textworld_practice, "build_practice_start", fake_build)
    a = textworld_practice.practice_model_path(4)
    said = [line for line in capfd.readouterr().err.splitlines() if ", step " in line]
    steps = [line.split(", step ")[1].split(",")[0] for line in said]
    assert steps == ["1/200", "50/200", "200/200"], said  # the first step, every 50, the last
    assert said[1].startswith("agentrl: TextWorld practice start, step 50/200, loss 0.020, ")
    assert a.parent == tmp_path / "models" and a.name.startswith("tiny-qwen3-textworld-practice-4w-")
    assert textworld_practice.practice_model_path(4) == a and built == [4]  # reused, not rebuilt
    b = textworld_practice.practice_model_path(8)
    assert b != a and built == [4, 8]


def test_practice_start_refuses_no_worlds(tmp_path):
    with pytest.raises(ValueError, match="worlds must be >= 1"):
        textworld_practice.build_practice_start(tmp_path / "start", 0)


def test_the_real_build_shortened_trains_on_the_worlds_games_and_writes_a_loadable_model(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    short = dict(textworld_practice.PRACTICE, variants=2, sft=dict(textworld_practice.PRACTICE["sft"], steps=2))
    monkeypatch.setattr(textworld_practice, "PRACTICE", short)
    losses = []
    dest = textworld_practice.build_practice_start(tmp_path / "start", 1, log=lambda step, m: losses.append(m["loss"]))
    assert dest == tmp_path / "start" and len(losses) == 2 and all(loss > 0 for loss in losses)
    model = AutoModelForCausalLM.from_pretrained(str(dest))
    assert model.config.hidden_size == textworld_practice.TEXTWORLD_BASE["hidden_size"]
