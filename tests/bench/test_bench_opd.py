"""bench/bench_opd.py without running it: its arguments (defaults, --quick, a bad budget), the
overrides of one seed, and the per-arm summary over seeds (numbers worked by hand)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_opd  # noqa: E402


def test_arguments_defaults_and_quick():
    a = bench_opd.parse([])
    assert (a.arms, a.seeds, a.budget_s) == (["sft", "grpo", "opd"], [0, 1, 2], 900.0)
    q = bench_opd.parse(["--quick", "--arms", "opd", "mix", "--set", "x.y=1"])
    assert (q.arms, q.seeds, q.budget_s, q.eval_tasks) == (["opd", "mix"], [0], 20.0, 8)
    assert q.sets[-1] == "x.y=1" and "rollout.group_size=2" in q.sets
    with pytest.raises(SystemExit):
        bench_opd.parse(["--budget-s", "0"])
    with pytest.raises(SystemExit):
        bench_opd.parse(["--arms", "dpo"])


def test_seed_sets_seed_the_tasks_the_trainer_and_the_sft_data():
    assert bench_opd.seed_sets(3) == ["rollout.seed=3", "trainer.seed=3", "sft.seed=3"]


def test_summary_is_the_mean_and_spread_over_seeds():
    def arm(solve, kl, wall, steps):
        return {"solve_rate": solve, "reverse_kl": kl, "wall_s": wall, "steps": steps}

    results = [
        {"seed": 0, "start": arm(0.1, 2.0, 0, 0), "arms": {"opd": arm(0.3, 1.0, 100.0, 10)}},
        {"seed": 1, "start": arm(0.2, 3.0, 0, 0), "arms": {"opd": arm(0.5, 0.5, 110.0, 12)}},
    ]
    (row,) = bench_opd.summarise(results, ["opd"])
    assert row["seeds"] == 2
    assert row["solve_start"] == pytest.approx((0.15, 0.0707107), abs=1e-6)
    assert row["solve_end"] == pytest.approx((0.4, 0.1414214), abs=1e-6)
    assert row["kl_start"][0] == pytest.approx(2.5) and row["kl_end"][0] == pytest.approx(0.75)
    assert (row["wall_s"], row["steps"]) == (105.0, 11.0)
