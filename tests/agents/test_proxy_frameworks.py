"""Agent frameworks as the proxy's agent program, each in one short `agentrl run` (the built-in model,
its sandbox, one training step): mini-swe-agent, unmodified (examples/agents/mini_swe_agent.py: its
DefaultAgent, LitellmModel and LocalEnvironment), on bash_fix; and an agent on the official `anthropic`
client (examples/agents/anthropic_loop.py: Messages with tools, tool_use / tool_result) on code_exec.

Each run records the harness's own conversation (its prompts and tool schema in the rendered prompt),
token-exact (the trainer's log-probabilities of the recorded ids equal the sampler's), and trains one
step on it. Learning is a benchmark (BENCHMARKS.md, agent frameworks), not asserted here."""

import asyncio
import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

from agentrl.config.schema import load_config
from agentrl.jobs.run import Runner

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents"


def _run(out: Path, env: str, command: str, *sets: str) -> tuple[dict, dict, list[dict], AutoTokenizer]:
    """One step of 1 group x 2 through ``command`` (in the sandbox); the summary, the step's metrics
    row, the step's saved trajectories and the run's tokenizer."""
    cfg = load_config(
        [],
        [
            f"output_dir={out}",
            f"env.id={env}",
            "env.kwargs.sandbox_backend=local",  # the same backend on every machine (auto may pick docker)
            "agent.kind=proxy",
            f"agent.command={command}",
            "agent.reward=env",
            "rollout.group_size=2",
            "rollout.max_turns=4",
            "train.groups_per_step=1",
            "train.max_staleness=0",
            "train.steps=1",
            "eval.num_tasks=0",
            "logging.tensorboard=false",
            *sets,
        ],
    )
    summary = asyncio.run(Runner(cfg, progress=False).run())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "train/optimizer_steps" in r)
    trajs = [json.loads(line) for line in (out / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    return summary, step, trajs, AutoTokenizer.from_pretrained(out / "checkpoints" / "step_000001")


def _check_trained(summary: dict, step: dict, trajs: list[dict]) -> None:
    assert summary["steps"] == 1 and summary["rollout"]["infra_failures"] == 0, summary["rollout"]
    agent = summary["agent"]
    assert agent["episodes"] >= 2 and agent["program_crashes"] == 0 and agent["requests"] >= agent["episodes"], agent
    assert step["train/optimizer_steps"] == 1 and step["train/seqs"] == len(trajs) >= 2, step
    # the recorded ids are the sampled ones: the trainer's log-probabilities of them equal the sampler's
    assert step["train/mismatch/abs_diff_max"] < 1e-3, step
    for t in trajs:
        assert len(t["token_ids"]) == len(t["loss_mask"]) == len(t["logprobs"])
        assert sum(t["loss_mask"]) == sum(turn["n_sampled"] for turn in t["turns"]) > 0


def test_mini_swe_agent_on_bash_fix_records_and_trains(tmp_path):
    """mini-swe-agent's stock prompts are long (about 1600 tokens) and the tiny model's 32-token
    replies hold no tool call: each reply is a format error to mini-swe-agent, which drops it from its
    history (a rewrite: a new segment per request) -- every request is still recorded and trained."""
    command = f"MSWEA_STEP_LIMIT=2 {sys.executable} {EXAMPLES / 'mini_swe_agent.py'}"
    summary, step, trajs, tok = _run(tmp_path / "run", "bash_fix", command, "rollout.max_new_tokens=32")
    _check_trained(summary, step, trajs)
    assert {t["env_id"] for t in trajs} == {"bash_fix"}
    for t in trajs:
        prompt = tok.decode(t["token_ids"][: t["prompt_len"]])
        assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in prompt  # mini-swe-agent's own instance template
        assert "Execute a bash command" in prompt  # its bash tool's schema, rendered by the chat template
        assert t["task"]["prompt"] in prompt


def test_the_anthropic_sdk_agent_on_code_exec_records_and_trains(tmp_path):
    """The warm-started model calls the python tool and answers: one trajectory per episode holding
    the tool_use turn, the tool_result (context, mask 0) and the answer."""
    command = f"{sys.executable} {EXAMPLES / 'anthropic_loop.py'}"
    summary, step, trajs, tok = _run(tmp_path / "run", "code_exec", command, "rollout.max_new_tokens=96")
    _check_trained(summary, step, trajs)
    assert summary["agent"]["split_trajectories"] == 0
    multi = [t for t in trajs if len(t["turns"]) >= 2]
    assert multi, [t["turns"] for t in trajs]
    for t in multi:
        first, second = t["turns"][0], t["turns"][1]
        gap = range(first["start"] + first["n_sampled"], second["start"])
        assert len(gap) > 0 and all(t["loss_mask"][i] == 0 for i in gap)  # the tool_result, not trained on
        assert "<tool_call>" in tok.decode(t["token_ids"][first["start"] : first["start"] + first["n_sampled"]])
