"""BashFixEnv with the real bash tool and check, plus its task generator: every kind's reference
solution scores 1.0 through the built-in loop's tool, doing nothing or the wrong thing scores 0.0
with the check's reason, and the held-out split is disjoint."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from agentrl.envs import bash_tasks
from agentrl.envs.registry import make
from agentrl.errors import ConfigError


def bash_call(command: str) -> str:
    return "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "</tool_call>"


@pytest.fixture
def env():
    e = make("bash_fix", sandbox_backend="local")  # the same backend on every machine (auto may pick docker)
    yield e
    e.close()


def _task_of_kind(kind: str, split: str = "train") -> dict:
    return bash_tasks.generate_task(3, split, [kind])


def test_tasks_are_deterministic_json_able_and_split_by_content():
    for kind in bash_tasks.KINDS:
        a, b = _task_of_kind(kind), _task_of_kind(kind)
        assert a == b and a["kind"] == kind and json.loads(json.dumps(a)) == a
        assert set(a) >= {"id", "prompt", "files", "collect", "expect", "solution"}
    assert bash_tasks.generate_task(1) != bash_tasks.generate_task(2)
    rng1, rng2 = np.random.default_rng(5), np.random.default_rng(5)
    assert bash_tasks.sample_task(rng1) == bash_tasks.sample_task(rng2)
    train = {bash_tasks.generate_task(i, "train")["id"] for i in range(2000)}
    held_out = {t["id"] for t in bash_tasks.eval_tasks(100)}
    assert len(held_out) == 100 and not train & held_out
    assert all(t.startswith("bash-eval-") for t in held_out)


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="kinds must be"):
        make("bash_fix", kinds=["nope"], sandbox_backend="local")
    with pytest.raises(ConfigError, match="split must be"):
        make("bash_fix", split="test", sandbox_backend="local")


@pytest.mark.parametrize("kind", list(bash_tasks.KINDS))
def test_the_reference_solution_scores_one_through_the_bash_tool(env, kind):
    async def go():
        _, info = env.reset(options={"task": _task_of_kind(kind)})
        assert [t["function"]["name"] for t in info["tools"]] == ["bash"]
        assert info["workspace"]["files"] == info["task"]["files"]  # what an outside agent starts with
        _, _, done, _, step = await env.astep(bash_call("ls && " + info["task"]["solution"]))
        assert not done and "[exit code" not in step["messages"][0]["content"], step["messages"]
        for name in info["task"]["files"]:  # the session started with the task's files
            assert name in step["messages"][0]["content"]
        _, reward, done, _, final = await env.astep("Done.")
        return reward, done, final

    reward, done, final = asyncio.run(go())
    assert done and reward == 1.0, final
    assert final["check"]


def test_doing_nothing_or_the_wrong_thing_scores_zero_with_the_reason(env):
    async def go(task, action):
        env.reset(options={"task": task})
        if action:
            await env.astep(bash_call(action))
        _, reward, done, _, final = await env.astep("Done.")
        assert done
        return reward, final["check"]

    config = _task_of_kind("set_config")
    reward, why = asyncio.run(go(config, None))
    assert reward == 0.0 and "expected" in why
    # the key set, but another one clobbered: the rest must stay as it was
    name, key, value = config["expect"]["file"], config["expect"]["key"], config["expect"]["value"]
    reward, why = asyncio.run(go(config, f"sed -i 's/^{key} = .*/{key} = {value}/' {name} && sed -i '2d' {name}"))
    assert reward == 0.0 and "expected" in why, why
    script = _task_of_kind("fix_script")
    reward, why = asyncio.run(go(script, "rm -f " + script["expect"]["script"]))
    assert reward == 0.0 and "is gone" in why


def test_check_workspace_scores_the_files_it_is_given(env):
    """What the proxy calls with the files an outside agent left: the check sees only those."""
    task = _task_of_kind("count_lines")
    env.reset(options={"task": task})
    out = task["expect"]["file"]
    assert asyncio.run(env.check_workspace({out: task["expect"]["value"].encode() + b"\n"}))[0] == 1.0
    reward, why = asyncio.run(env.check_workspace({out: b"41\n"}))
    assert reward == 0.0 and "41" in why
    reward, why = asyncio.run(env.check_workspace({}))
    assert reward == 0.0 and "does not exist" in why
