"""An env's workspace through the agent program (no model): the files bash_fix's reset asks for are
in the program's work dir (``AGENTRL_WORKDIR``; in the sandbox also its current directory), the
commands it runs change them there, and the collected files score 1.0 with the env's check -- in the
sandbox and on the host alike; a collected file the program replaced with a symlink to a host file
is not collected (the check finds it missing). And in a rollout: the env's check scores what the
program left, whatever the model said."""

import asyncio
import sys
from pathlib import Path

import pytest

import agentrl.jobs.rollout as rollout_job
from agentrl.agents.program import ProgramResult, Workspace, run_command
from agentrl.agents.sandboxed import SandboxedCommand
from agentrl.config.schema import load_config
from agentrl.envs import bash_tasks
from agentrl.envs.registry import make
from agentrl.sandbox.base import Limits

AGENT = Path(__file__).with_name("workspace_agent.py")
URL = "http://127.0.0.1:9/v1"  # never connected to: the program makes no request


async def _episode(env, kind: str, isolation: str, arg: str = "") -> tuple[ProgramResult, float, str]:
    _, info = env.reset(options={"task": bash_tasks.generate_task(7, "train", [kind])})
    ws = Workspace.of(info)
    task = {"messages": info["messages"], "tools": info["tools"], "task": info["task"]}
    command = f"{sys.executable} {AGENT} {arg}"
    if isolation == "sandbox":
        jail = SandboxedCommand(command)
        try:
            res = await jail.run(URL, "sk-1", task, 60, Limits(), ws)
        finally:
            await jail.aclose()
    else:
        res = await run_command(command, URL, "sk-1", task, 60, ws)
    reward, why = await env.check_workspace(res.files)
    return res, reward, why


@pytest.fixture
def env():
    e = make("bash_fix", sandbox_backend="local")
    yield e
    e.close()


@pytest.mark.parametrize("isolation", ["sandbox", "host"])
@pytest.mark.parametrize("kind", ["set_config", "fix_script"])
def test_the_program_fixes_the_workspace_and_the_env_scores_it(env, isolation, kind):
    res, reward, why = asyncio.run(_episode(env, kind, isolation))
    assert res.error is None and res.result["solution_exit"] == 0, res
    assert set(env._task["files"]) <= set(res.result["files"])
    if isolation == "sandbox":
        assert res.result["cwd"] == res.result["workdir"]
    assert set(res.files) == set(env._task["collect"])
    assert reward == 1.0, why


@pytest.mark.parametrize("isolation", ["sandbox", "host"])
def test_a_symlink_to_a_host_file_is_not_collected(env, isolation):
    res, reward, why = asyncio.run(_episode(env, "write_file", isolation, "plant"))
    assert res.error is None and res.files == {}, res
    assert reward == 0.0 and "does not exist" in why


def test_a_malformed_workspace_is_refused():
    with pytest.raises(ValueError, match="relative path"):
        Workspace.of({"workspace": {"files": {"/etc/passwd": "x"}, "collect": []}})
    with pytest.raises(ValueError, match="list of paths"):
        Workspace.of({"workspace": {"files": {}, "collect": "a.txt"}})
    assert Workspace.of({}) is None


def test_in_a_rollout_the_env_scores_the_files_the_program_left(tmp_path):
    """The built-in model's reply is whatever it is (8 tokens: cut); the program then fixes the files, and
    the env's check of them is the reward (rollout.score_truncated: a cut last reply keeps it)."""
    cfg = load_config(
        [],
        [
            f"output_dir={tmp_path / 'run'}",
            "env.id=bash_fix",
            "env.kwargs={sandbox_backend: local, kinds: [count_lines]}",
            "agent.kind=proxy",
            f"agent.command={sys.executable} {AGENT} ask",
            "agent.reward=env",
            "rollout.num_prompts=2",
            "rollout.group_size=1",
            "rollout.max_new_tokens=8",
            "rollout.score_truncated=true",
        ],
    )
    trajs, _, _ = rollout_job.run_rollout(cfg, progress=False, note=lambda line: None)
    assert len(trajs) == 2
    for t in trajs:
        assert t.info["agent"]["requests"] == 1 and t.outcome.value in ("ok", "truncated_length"), t.outcome_detail
        assert t.reward == 1.0 and t.info["agent"]["check"].endswith(repr(t.task["expect"]["value"])), t.info
