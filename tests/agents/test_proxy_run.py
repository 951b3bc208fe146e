"""A shortened `agentrl run --agent proxy` on code_exec with the built-in warm-started model: the
outside openai-client agent's recorded trajectories train end to end (staleness queue, ledger,
trainer, weight sync). It asserts the run completes its steps on trainable proxy episodes; whether
reward rises over so few steps is not asserted (see the report numbers in the run's metrics)."""

import asyncio
import sys
from pathlib import Path

import pytest

from agentrl.config.schema import load_config
from agentrl.jobs.run import Runner

pytest.importorskip("openai", reason="the example agent uses the official openai client")
AGENT = Path(__file__).resolve().parents[2] / "examples" / "agents" / "openai_loop.py"


@pytest.mark.slow
def test_run_trains_through_the_proxy(tmp_path):
    cfg = load_config(
        [],
        [
            f"output_dir={tmp_path}",
            "env.id=code_exec",
            "agent.kind=proxy",
            "agent.reward=env",
            f"agent.command={sys.executable} {AGENT}",
            "rollout.group_size=2",
            "rollout.max_new_tokens=96",
            "rollout.max_turns=4",
            "train.groups_per_step=2",
            "train.steps=3",
            "train.max_staleness=0",
            "eval.num_tasks=0",
            "logging.tensorboard=false",
        ],
    )
    summary = asyncio.run(Runner(cfg, progress=False).run())
    assert summary["steps"] == 3
    rollout = summary["rollout"]
    assert rollout["episodes"] >= 12 and rollout["infra_failures"] == 0, rollout
