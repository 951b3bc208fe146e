"""bench/bench_rollout_correction.py without running it: the overrides of one arm, a run's metrics read
back (steps without a metric kept as None), and the per-run summary (numbers worked by hand)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_rollout_correction as rc  # noqa: E402


def test_arm_sets_are_the_shared_async_settings_then_the_arm_then_the_seed_and_length():
    args = rc.parse(["--steps", "30", "--eval-tasks", "100", "--set", "x.y=1"])
    sets = rc.arm_sets("icepop", 3, args)
    assert sets[: len(rc.COMMON)] == rc.COMMON and "train.max_staleness=2" in sets
    assert "trainer.old_logprobs=current" in sets and "trainer.rollout_correction=icepop" in sets
    assert {"rollout.seed=3", "trainer.seed=3", "train.steps=30", "eval.num_tasks=100"} <= set(sets)
    assert sets[-1] == "x.y=1"  # --set comes last, so it wins
    assert "trainer.tis_cap=2" in rc.arm_sets("tis", 0, args) and "trainer.tis_cap=2" not in sets
    q = rc.parse(["--quick"])
    assert (q.arms, q.seeds, q.steps, q.eval_tasks) == (["tis", "icepop"], [0], 2, 4)
    with pytest.raises(SystemExit):
        rc.parse(["--arms", "ppo"])


def test_read_run_and_summary_by_hand(tmp_path):
    rows = [
        {"step": 0, "eval/solve_rate": 0.5, "eval/episodes": 10, "eval/infra_failures": 1},
        {"step": 1, "rollout/reward_mean": 0.2, "rollout/solve_rate": 0.2, "rollout/infra_failures": 0},
        {"step": 2, "rollout/reward_mean": 0.4, "rollout/solve_rate": 0.4, "train/rollout_masked_frac": 0.1},
        {"step": 3, "rollout/reward_mean": 0.9, "rollout/solve_rate": 0.8, "train/rollout_masked_frac": 0.0},
        {"step": 3, "eval/solve_rate": 0.7, "eval/episodes": 10, "eval/infra_failures": 0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = rc.read_run(tmp_path)
    assert run["per_step"]["step"] == [1, 2, 3]
    assert run["per_step"]["masked_frac"] == [None, 0.1, 0.0]  # step 1 logged no mask
    assert [e["solve_rate"] for e in run["evals"]] == [0.5, 0.7] and run["evals"][0]["infra_failures"] == 1
    assert run["run_s"] is None  # no summary.json: a run that did not finish
    (tmp_path / "summary.json").write_text(json.dumps({"wall_s": 12.5}))
    assert rc.read_run(tmp_path)["run_s"] == 12.5
    assert not rc.finished(tmp_path, 3)  # a summary without steps: stopped early or another layout
    (tmp_path / "summary.json").write_text(json.dumps({"wall_s": 12.5, "steps": 3}))
    assert rc.finished(tmp_path, 3) and not rc.finished(tmp_path, 40) and not rc.finished(tmp_path / "x", 3)
    s = rc.summarise(run["per_step"], run["evals"], last=2)
    assert s["steps"] == 3
    assert s["reward_first"] == pytest.approx(0.3) and s["reward_last"] == pytest.approx(0.65)
    assert s["reward_mean"] == pytest.approx(0.5) and s["solve_last"] == pytest.approx(0.6)
    assert s["masked_frac_mean"] == pytest.approx(0.05) and s["masked_frac_max"] == pytest.approx(0.1)
    assert s["masked_steps"] == 1 and s["tis_weight_mean"] is None
    assert (s["eval_start"]["episodes"], s["eval_end"]["solve_rate"]) == (10, 0.7)
