"""AgentEnv/ToolEnv contract, TextSpace, NoopEnv, and Gymnasium's check_env on every built-in env."""

from __future__ import annotations

import asyncio
import json
import time

import gymnasium
import pytest
from gymnasium.error import ResetNeeded
from gymnasium.utils.env_checker import check_env

import agentrl.envs  # noqa: F401  registers the built-ins with Gymnasium
from agentrl.envs.base import STAT_KEYS, TextSpace, ToolEnv
from agentrl.envs.checker import assert_agent_env, check_agent_env
from agentrl.errors import EnvError, RewardError, SandboxError, ToolTimeoutError
from agentrl.tools.base import tool


def call(name: str, **args) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


@tool
async def echo(text: str) -> str:
    """Echo the text back.

    Args:
        text: What to echo.
    """
    return text


SLOW_CALLS = {"running": 0, "peak": 0}  # how many `slow` calls were in flight at once


@tool
async def slow(seconds: float) -> str:
    """Sleep, then say done."""
    SLOW_CALLS["running"] += 1
    SLOW_CALLS["peak"] = max(SLOW_CALLS["peak"], SLOW_CALLS["running"])
    try:
        await asyncio.sleep(seconds)
    finally:
        SLOW_CALLS["running"] -= 1
    return "done"


@tool
def boom(kind: str = "value") -> str:
    """Raise an exception of the given kind."""
    if kind == "sandbox":
        raise SandboxError("container died")
    if kind == "timeout":
        raise TimeoutError("the tool's own timeout")
    raise ValueError("kaboom")


class FakeEnv(ToolEnv):
    """Answer is the task's number; every call of `echo` earns a 0.1 turn reward. No held-out tasks."""

    has_eval_split = False

    def __init__(self, score_mode: str = "ok", **kw):
        self.tools = [echo, slow, boom]
        self.score_mode = score_mode
        super().__init__(**kw)

    def sample_task(self, rng, options):
        n = int(rng.integers(1000))
        return {"id": f"fake-{n}", "prompt": f"Say {n}.", "answer": str(n)}

    def initial_messages(self, task):
        return [{"role": "system", "content": "sys"}, {"role": "user", "content": task["prompt"]}]

    async def score(self, task, final_text, transcript):
        self.last_transcript = transcript
        if self.score_mode == "raise":
            raise ValueError("grader bug")
        if self.score_mode == "reward_error":
            raise RewardError("judge down")
        if self.score_mode == "nan":
            return float("nan")
        return 1.0 if final_text.strip() == task["answer"] else 0.0

    def turn_reward(self, task, parsed, results):
        return 0.1 * sum(1 for r in results if r.call is not None and r.call.name == "echo" and r.error is None)


def started(**kw) -> tuple[FakeEnv, dict]:
    env = FakeEnv(**kw)
    _, info = env.reset(seed=7)
    return env, info


# ------------------------------------------------------------------ spaces and gymnasium
def test_text_space():
    s = TextSpace(10, seed=0)
    assert "hello" in s and "x" * 11 not in s and 5 not in s
    samples = [s.sample() for _ in range(20)]
    assert all(isinstance(x, str) and x in s for x in samples)
    s2 = TextSpace(10, seed=0)
    assert samples == [s2.sample() for _ in range(20)]
    assert s == TextSpace(10) and s != TextSpace(11)


@pytest.mark.parametrize(
    "gym_id, kwargs",
    [
        ("agentrl/CodeExec-v0", {}),
        ("agentrl/CodeExec-v0", {"difficulty": 5, "parser": "python_block"}),
        ("agentrl/Noop-v0", {}),
        ("agentrl/Noop-v0", {"n_turns": 1}),
    ],
)
def test_gymnasium_check_env_passes_on_builtins(gym_id, kwargs):
    env = gymnasium.make(gym_id, **kwargs)
    check_env(env.unwrapped)
    env.close()


@pytest.mark.parametrize("env_id", ["code_exec", "noop"])
def test_agent_env_checker_passes_on_builtins(env_id):
    assert check_agent_env(env_id) == []


def test_agent_env_checker_passes_on_fake_and_finds_problems():
    assert_agent_env(FakeEnv())

    class Broken(FakeEnv):
        def sample_task(self, rng, options):
            return {"id": str(time.perf_counter_ns()), "prompt": "x"}  # not a function of the seed

        def initial_messages(self, task):
            return [{"role": "narrator", "content": task["prompt"]}]

    problems = check_agent_env(Broken())
    text = "\n".join(problems)
    assert "different tasks" in text and "role" in text and "no user message" in text
    with pytest.raises(AssertionError, match="does not conform"):
        assert_agent_env(Broken())


def test_agent_env_checker_checks_reward_components():
    class Parts(FakeEnv):
        comps = None

        async def astep(self, action):
            obs, r, term, trunc, info = await super().astep(action)
            return obs, r, term, trunc, {**info, "reward_components": self.comps or {"correct": r}}

    assert_agent_env(Parts())
    for bad in ({"correct": "yes"}, {"correct": float("inf")}, {"": 1.0}):
        env = Parts()
        env.comps = bad
        assert "info['reward_components'] must map names to finite numbers" in "\n".join(check_agent_env(env))


# ------------------------------------------------------------------ reset
def test_reset_info_and_determinism():
    env = FakeEnv()
    obs, info = env.reset(seed=3)
    assert set(info) >= {"messages", "tools", "task"}
    assert obs == "sys\n\n" + info["task"]["prompt"]
    assert [t["function"]["name"] for t in info["tools"]] == ["echo", "slow", "boom"]
    assert env.reset(seed=3)[1] == info
    assert len({env.reset(seed=s)[1]["task"]["id"] for s in range(10)}) > 1
    info["messages"].append("mutated")
    assert env.reset(seed=3)[1]["messages"] != info["messages"]  # fresh objects every call
    fixed = {"id": "mine", "prompt": "Say 5.", "answer": "5"}
    assert env.reset(options={"task": fixed})[1]["task"] == fixed


def test_async_and_sync_agree():
    env = FakeEnv()
    env.reset(seed=1)
    sync = env.step(call("echo", text="hi"))

    async def run():
        await env.areset(seed=1)
        return await env.astep(call("echo", text="hi"))

    assert asyncio.run(run()) == sync


# ------------------------------------------------------------------ steps
def test_final_answer_scores_and_terminates():
    env, info = started()
    obs, r, term, trunc, sinfo = env.step(info["task"]["answer"])
    assert (obs, r, term, trunc) == ("", 1.0, True, False)
    assert sinfo["messages"] == [] and sinfo["tool_stats"] == dict.fromkeys(STAT_KEYS, 0)
    assert env.last_transcript[-1]["role"] == "assistant"
    with pytest.raises(ResetNeeded):
        env.step("again")
    env.reset(seed=7)
    assert env.step("wrong")[1] == 0.0


def test_tool_call_answers_and_turn_reward():
    env, _ = started()
    obs, r, term, _, info = env.step("let me check " + call("echo", text="hello") + call("echo", text="world"))
    assert not term and obs == "hello\n\nworld" and r == pytest.approx(0.2)
    assert info["messages"] == [
        {"role": "tool", "content": "hello", "name": "echo", "tool_call_id": "call_0"},
        {"role": "tool", "content": "world", "name": "echo", "tool_call_id": "call_1"},
    ]
    assert info["tool_stats"]["calls"] == 2 and info["tool_stats"]["errors"] == 0


def test_model_mistakes_are_observed_in_text_order():
    env, _ = started()
    action = call("nope") + "<tool_call>{broken</tool_call>" + call("echo", txt="x") + call("echo", text="ok")
    obs, r, term, _, info = env.step(action)
    assert not term
    contents = [m["content"] for m in info["messages"]]
    assert "unknown tool 'nope'" in contents[0] and "Invalid JSON" in contents[1]
    assert "unexpected argument 'txt'" in contents[2] and contents[3] == "ok"
    assert [m.get("tool_call_id") for m in info["messages"]] == ["call_0", "call_1", "call_2", "call_3"]
    st = info["tool_stats"]
    assert (st["calls"], st["errors"], st["malformed"], st["unknown_tool"], st["bad_arguments"]) == (4, 3, 1, 1, 1)


def test_on_bad_call_end_terminates_with_zero():
    env, _ = started(on_bad_call="end")
    obs, r, term, _, info = env.step(call("echo", text="fine") + call("nope"))
    assert term and r == 0.0 and info["ended_by"] == "bad_call"


def test_max_calls_per_turn():
    env, _ = started(max_calls_per_turn=2)
    _, _, _, _, info = env.step("".join(call("echo", text=str(i)) for i in range(4)))
    assert [m["content"] for m in info["messages"]][:2] == ["0", "1"]
    assert all("too many tool calls" in m["content"] for m in info["messages"][2:])
    assert info["tool_stats"]["over_limit"] == 2 and info["tool_stats"]["errors"] == 2


def test_calls_run_concurrently():
    env, _ = started()
    SLOW_CALLS["peak"] = 0
    _, _, _, _, info = env.step(call("slow", seconds=0.3) + call("slow", seconds=0.3) + call("slow", seconds=0.3))
    assert [m["content"] for m in info["messages"]] == ["done"] * 3
    assert SLOW_CALLS == {"running": 0, "peak": 3}  # all three in flight at once (one after another: peak 1)


def test_tool_timeout_policies():
    env, _ = started(tool_timeout_s=0.1)
    with pytest.raises(ToolTimeoutError, match="'slow'"):
        env.step(call("slow", seconds=5) + call("echo", text="x"))
    env, _ = started(tool_timeout_s=0.1, on_tool_timeout="observe")
    _, _, term, _, info = env.step(call("slow", seconds=5) + call("echo", text="x"))
    assert not term and "did not finish within 0.1 s" in info["messages"][0]["content"]
    assert info["messages"][1]["content"] == "x" and info["tool_stats"]["timeouts"] == 1


def test_tool_exception_policies():
    env, _ = started()
    with pytest.raises(EnvError, match="tool 'boom' raised ValueError: kaboom"):
        env.step(call("boom"))
    env, _ = started()  # a tool's own TimeoutError is a tool exception, not our deadline
    with pytest.raises(EnvError, match="TimeoutError"):
        env.step(call("boom", kind="timeout"))
    env, _ = started(on_tool_exception="observe")
    _, _, term, _, info = env.step(call("boom"))
    assert not term and "ValueError: kaboom" in info["messages"][0]["content"]
    assert info["tool_stats"]["exceptions"] == 1


def test_sandbox_error_propagates_even_when_observing():
    env, _ = started(on_tool_exception="observe")
    with pytest.raises(SandboxError):
        env.step(call("boom", kind="sandbox"))


def test_tool_output_is_capped_head_and_tail():
    env, _ = started(max_tool_output_chars=100)
    text = "H" * 500 + "TAIL"
    content = env.step(call("echo", text=text))[4]["messages"][0]["content"]
    assert content.startswith("H" * 75) and content.endswith("TAIL") and "[truncated 404 chars]" in content


@pytest.mark.parametrize(
    "mode, match", [("raise", "ValueError: grader bug"), ("reward_error", "judge down"), ("nan", "nan")]
)
def test_score_failures_are_reward_errors(mode, match):
    env, _ = started(score_mode=mode)
    with pytest.raises(RewardError, match=match):
        env.step("42")


async def test_sync_step_inside_event_loop_points_to_astep():
    env, _ = started()
    with pytest.raises(RuntimeError, match="astep"):
        env.step("1")
    obs, r, term, _, _ = await env.astep(call("echo", text="in loop"))
    assert obs == "in loop" and not term


def test_config_validation():
    from agentrl.errors import ConfigError

    for kw in (
        {"on_bad_call": "ignore"},
        {"on_tool_timeout": "x"},
        {"tool_timeout_s": 0},
        {"max_calls_per_turn": 0},
        {"parser": "xml"},
    ):
        with pytest.raises(ConfigError):
            FakeEnv(**kw)


# ------------------------------------------------------------------ NoopEnv
def test_noop_env_runs_n_turns():
    from agentrl.envs.registry import make

    env = make("noop", n_turns=3)
    obs, info = env.reset(seed=0)
    assert info["tools"][0]["function"]["name"] == "noop" and info["task"]["n_turns"] == 3
    o1, r1, t1, _, i1 = env.step("<tool_call>{}</tool_call>")
    assert (o1, r1, t1) == ("ok", 0.0, False) and i1["messages"][0]["role"] == "tool"
    o2, _, t2, _, i2 = env.step("plain text")
    assert not t2 and i2["messages"] == [{"role": "user", "content": "ok"}]
    _, r3, t3, _, i3 = env.step("last")
    assert t3 and r3 == 1.0 and i3["messages"] == []
    with pytest.raises(ResetNeeded):
        env.step("more")
    env = make("noop", n_turns=2, echo=True)
    env.reset(seed=0)
    assert env.step("hello")[0] == "hello"
    assert asyncio.run(env.astep("x"))[2] is True


def test_noop_is_fast():
    """Counted, not timed: the Python and C calls each step makes (sys.setprofile). The same handful at
    turn 1 and turn 999 (no work grows with the episode), and a handful: the env costs ~nothing."""
    import sys

    from agentrl.envs.registry import make

    env = make("noop", n_turns=1000)
    env.reset(seed=0)
    calls = [0]

    def count(frame, event, arg):
        if event in ("call", "c_call"):
            calls[0] += 1

    per_step = []
    for _ in range(999):
        calls[0] = 0
        sys.setprofile(count)
        try:
            env.step("<tool_call>{}</tool_call>")
        finally:
            sys.setprofile(None)
        per_step.append(calls[0])
    assert len(set(per_step)) == 1, sorted(set(per_step))  # measured: 9 calls on every step
    assert per_step[0] <= 30, per_step[0]
