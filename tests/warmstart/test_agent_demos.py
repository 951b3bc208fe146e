"""Oracle demonstrations of an agent program (agentrl.warmstart.agent_demos), as
examples/agents/mini_swe_agent_demos.py makes them: mini-swe-agent itself, unmodified, through the
recording proxy against the oracle, on bash_fix. The rows `export-sft` writes load in `agentrl sft`,
re-render to the very ids the proxy recorded, hold mini-swe-agent's own prompts and bash tool, and each
row's command, replayed on its task's files, passes the env's check (which the untouched files fail)."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.agents.config import AgentConfig
from agentrl.envs import bash_tasks
from agentrl.envs.registry import make
from agentrl.errors import ConfigError
from agentrl.jobs.export_sft import export_sft
from agentrl.warmstart.agent_demos import run_agent_demonstrations
from agentrl.warmstart.chat_data import load_chat_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "agents"))
import mini_swe_agent_demos as demos  # noqa: E402


def _check(task: dict, files: dict[str, bytes]) -> tuple[float, str]:
    env = make("bash_fix", sandbox_backend="local")
    try:
        env.reset(options={"task": task})
        return asyncio.run(env.unwrapped.check_workspace(files))
    finally:
        env.close()


def test_mini_swe_agent_demos_export_replay_and_render_token_exact(tmp_path, tiny_tokenizer):
    pool = demos.train_tasks(40)
    tasks = [next(t for t in pool if t["kind"] == kind) for kind in bash_tasks.KINDS]  # one task of each kind
    run = demos.make_demos(tiny_tokenizer, tasks, max_concurrency=4)
    assert run.failed == [] and [t.task["id"] for t in run.good] == [t["id"] for t in tasks]

    demos.write_demos(tmp_path, run.good)
    counts = export_sft(tmp_path, tmp_path / "sft.jsonl", min_reward=1.0)
    assert (counts.kept, counts.episodes) == (4, 4)
    rows = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    examples = load_chat_jsonl(tmp_path / "sft.jsonl", tiny_tokenizer)  # what `agentrl sft --data` trains on

    for task, traj, row, ex in zip(tasks, run.good, rows, examples):
        # the row re-renders to the ids the proxy recorded: the prompt, both turns, the observation between
        assert ex.token_ids == traj.token_ids and ex.loss_mask == traj.loss_mask
        assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
        assert [t["function"]["name"] for t in row["tools"]] == ["bash"]  # mini-swe-agent's tool, from its request
        user = row["messages"][1]["content"]
        assert user.startswith(f"Please solve this issue: {task['prompt']}")  # its stock instance template
        assert demos.SUBMIT in user
        calls = [json.loads(m["tool_calls"][0]["function"]["arguments"]) for m in row["messages"][2::2]]
        assert calls == [{"command": task["solution"]}, {"command": demos.SUBMIT}]

        work = tmp_path / "replay" / task["id"]
        work.mkdir(parents=True)
        for name, text in task["files"].items():
            (work / name).write_text(text)
        before = {p: (work / p).read_bytes() for p in task["collect"] if (work / p).exists()}
        assert _check(task, before)[0] == 0.0  # the task is not done by itself
        subprocess.run(["bash", "-c", calls[0]["command"]], cwd=work, check=True, timeout=30)
        after = {p: (work / p).read_bytes() for p in task["collect"] if (work / p).exists()}
        reward, reason = _check(task, after)
        assert reward == 1.0, (task["kind"], reason)


def test_a_script_the_program_does_not_follow_is_a_failed_demo(tiny_tokenizer):
    """A reference action that does not solve the task (here: no command at all) is reported, not kept."""
    task = demos.train_tasks(1)[0]
    agent = AgentConfig(kind="proxy", callable="mini_swe_agent:run", reward="env", isolation="host", timeout_s=120)
    run = asyncio.run(
        run_agent_demonstrations(
            tiny_tokenizer,
            lambda: make("bash_fix", sandbox_backend="local"),
            [task],
            agent,
            lambda t: [demos.bash_call("Nothing to do.", "true"), demos.bash_call(demos.DONE, demos.SUBMIT)],
            env_id="bash_fix",
        )
    )
    assert run.good == [] and len(run.failed) == 1
    assert run.failed[0][1].startswith("the env scored the reference actions 0, not 1"), run.failed
    with pytest.raises(ConfigError, match="agent.kind must be 'proxy'"):
        asyncio.run(run_agent_demonstrations(tiny_tokenizer, lambda: None, [task], AgentConfig(), lambda t: []))
