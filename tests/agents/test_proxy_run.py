"""`agentrl run --agent proxy` on code_exec with the built-in warm-started model: outside agent
programs train end to end (staleness queue, ledger, trainer, weight sync), the held-out eval plays
the same agent program, the runner's counters reach metrics.jsonl and summary.json, the recording
endpoint is closed when the run ends or fails, and the run learns."""

import asyncio
import json
import sys
from pathlib import Path

import probe_agents  # noqa: E402  (the official openai client, which litellm brings)
import pytest
from reward_curve import rise, step_rewards

from agentrl.config.schema import load_config
from agentrl.errors import InfraFailureError
from agentrl.jobs.run import Runner

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents"


def _cfg(out, *sets):
    return load_config(
        [],
        [
            f"output_dir={out}",
            "env.id=code_exec",
            "agent.kind=proxy",
            "rollout.group_size=2",
            "rollout.max_new_tokens=96",
            "rollout.max_turns=4",
            "train.groups_per_step=2",
            "train.max_staleness=0",
            "logging.tensorboard=false",
            *sets,
        ],
    )


def _rows(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def test_counters_reach_the_metrics_and_summary_and_the_endpoint_closes(tmp_path):
    """`agentrl run --agent proxy` through the CLI with the example agent in-process (agent.callable)."""
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    probe_agents.URLS.clear()
    out = tmp_path / "run"
    sets = [
        "agent.callable=probe_agents:example_agent",
        "agent.reward=env",
        "rollout.group_size=2",
        "rollout.max_new_tokens=96",
        "rollout.max_turns=4",
        "train.groups_per_step=2",
        "train.max_staleness=0",
        "eval.num_tasks=0",
        "logging.tensorboard=false",
    ]
    args = ["run", "--env", "code_exec", "--agent", "proxy", "--steps", "2", "--out", str(out), "-q"]
    res = CliRunner().invoke(app, [*args, *(a for kv in sets for a in ("--set", kv))], terminal_width=200)
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["rollout"]["infra_failures"] == 0, summary["rollout"]
    steps = [r for r in _rows(out) if "rollout/reward_mean" in r]
    per_step = [r["agent/episodes"] for r in steps]
    # by each step's row, every episode of the batches trained so far has finished and been counted
    assert all(sum(per_step[: k + 1]) >= 4 * (k + 1) for k in range(2)), per_step
    total = summary["agent"]
    assert sum(per_step) <= total["episodes"] == len(probe_agents.URLS)
    assert sum(r["agent/requests"] for r in steps) <= total["requests"]
    assert total["requests"] >= total["episodes"] and total["program_crashes"] == 0
    shown = {line.split()[1]: line.split()[3] for line in res.output.splitlines() if " agent_" in line}
    assert shown["agent_requests"] == str(total["requests"]), res.output  # in the run's summary table
    assert len(set(probe_agents.URLS)) == 1  # one endpoint per run
    probe_agents.assert_closed(probe_agents.URLS[0])


def test_eval_plays_the_agent_program_and_counts_each_task_once(tmp_path):
    """forgetful_loop rewrites its history (three segments per episode) and reports reward 1.0: an
    eval through the built-in loop would score the tiny model's own answers (about half solved)."""
    out = tmp_path / "run"
    cfg = _cfg(
        out,
        f"agent.command={sys.executable} {EXAMPLES / 'forgetful_loop.py'}",
        "train.steps=1",
        "train.groups_per_step=1",
        "eval.num_tasks=4",
    )
    summary = asyncio.run(Runner(cfg, progress=False).run())
    evals = [r for r in _rows(out) if "eval/episodes" in r]
    assert len(evals) == 2  # at the start and at the end
    for r in evals:
        assert r["eval/episodes"] == 4 and r["eval/solve_rate"] == 1.0 and r["eval/infra_failures"] == 0, r
        assert r["eval/agent/episodes"] == 4 and r["eval/agent/split_trajectories"] == 8, r
    assert summary["eval_solve_rate_start"] == summary["eval_solve_rate_end"] == 1.0
    assert summary["agent"]["episodes"] >= 2  # the training episodes are counted apart from the evals'


def test_a_failing_run_closes_the_endpoint(tmp_path):
    """Every episode of the first eval crashes: the run stops (infrastructure failure) and the
    endpoint is gone; the eval plays the agent program, not the built-in loop (which would not crash)."""
    probe_agents.URLS.clear()
    cfg = _cfg(tmp_path / "run", "agent.callable=probe_agents:crashing_agent", "train.steps=1", "eval.num_tasks=4")
    with pytest.raises(InfraFailureError, match="first evaluation ended env_error"):
        asyncio.run(Runner(cfg, progress=False).run())
    assert len(probe_agents.URLS) == 4
    probe_agents.assert_closed(probe_agents.URLS[0])


def test_the_run_learns_through_the_proxy(tiny_model_dir, tmp_path):
    """The example agent (examples/agents/openai_loop.py: the official openai client), in-process as
    agent.callable, trained through the recording endpoint on the loop's own learning task
    (``test/Short-v0``: one reply, reward 1 - chars/40, so shorter replies score higher) for 20 steps:
    the per-step rollout reward must rise as the built-in loop's does (tests/jobs/test_runner.py), so
    the trajectories stitched from the client's completions carry the tokens, masks and logprobs the
    update needs. A run that does not learn keeps its first reward level (a random tiny model's
    replies), so the test can fail.

    The same agent on the default recipe (code_exec, the built-in warm-started model, 10 steps of 32 x 8,
    500 held-out tasks) rose by +0.138 / +0.108 (seeds 0 / 1): that measurement takes 12-26 minutes on 2
    cores, so it is a benchmark (BENCHMARKS.md, bring your own agent), not a test."""
    from short_run import short_run_cfg

    probe_agents.URLS.clear()
    out = tmp_path / "run"
    sets = ["agent.kind=proxy", "agent.callable=probe_agents:example_agent", "agent.reward=env"]
    summary = asyncio.run(Runner(short_run_cfg(tiny_model_dir, out, 20, sets), progress=False).run())
    assert summary["steps"] == 20 and summary["rollout"]["infra_failures"] == 0, summary["rollout"]
    assert summary["agent"]["program_crashes"] == 0 and len(set(probe_agents.URLS)) == 1
    rewards = step_rewards(out)
    first, last = rise(rewards, 4)
    assert last > first + 0.1, f"reward did not rise through the proxy: {rewards}"


def test_score_truncated_scores_a_cut_last_reply_with_the_env(tiny_model_dir, tmp_path):
    """rollout.score_truncated with agent.reward=env: a last reply cut at its token limit is handed to
    env.step and keeps its reward (outcome still truncated_length), as in the built-in loop; off, it scores 0."""
    import short_run  # noqa: F401  (registers test/Short-v0)

    import agentrl.jobs.rollout as rollout_job

    rewards = {}
    for score in (False, True):
        cfg = load_config(
            [],
            [
                f"output_dir={tmp_path / str(score)}",
                f"model.path={tiny_model_dir}",
                "env.id=test/Short-v0",
                "env.kwargs={}",
                "agent.kind=proxy",
                "agent.callable=probe_agents:example_agent",
                "agent.reward=env",
                "rollout.num_prompts=4",
                "rollout.group_size=2",
                "rollout.max_new_tokens=4",
                "rollout.max_turns=1",
                f"rollout.score_truncated={str(score).lower()}",
            ],
        )
        trajs, _, _ = rollout_job.run_rollout(cfg, progress=False, note=lambda line: None)
        cut = [t for t in trajs if t.outcome.value == "truncated_length"]
        assert len(cut) >= 4, [t.outcome.value for t in trajs]  # a random tiny model rarely stops within 4 tokens
        rewards[score] = [t.reward for t in cut]
    assert rewards[False] == [0.0] * len(rewards[False])
    assert any(r > 0 for r in rewards[True]), rewards  # 1 - chars/40: a 4-token reply is shorter than 40 chars
