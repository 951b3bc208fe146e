"""The learning tests' statistic: did a run's per-step rollout reward rise? Shared by the built-in
loop's learning test (tests/jobs/test_runner.py) and proxy mode's (tests/agents/test_proxy_run.py)."""

import json
from pathlib import Path


def step_rewards(run_dir: Path) -> list[float]:
    """``rollout/reward_mean`` of every training step, in order, from the run's ``metrics.jsonl``."""
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r["rollout/reward_mean"] for r in rows if "rollout/reward_mean" in r]


def rise(rewards: list[float], k: int) -> tuple[float, float]:
    """(mean of the first ``k`` steps' rewards, mean of the last ``k``)."""
    if len(rewards) < 2 * k:
        raise ValueError(f"{len(rewards)} steps cannot give two windows of {k}: {rewards}")
    return sum(rewards[:k]) / k, sum(rewards[-k:]) / k
