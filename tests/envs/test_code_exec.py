"""CodeExecEnv end to end with the real python tool, plus the procedural task generator."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re

import numpy as np
import pytest

from agentrl.envs import tasks
from agentrl.envs.code_exec import CodeExecEnv
from agentrl.envs.registry import make
from agentrl.errors import ConfigError, SandboxError
from agentrl.sandbox import Sandbox


def py_call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


@pytest.fixture
def env_factory():
    envs = []

    def build(**kw):
        kw.setdefault("sandbox_backend", "local")  # the same backend on every machine (auto may pick docker)
        env = make("code_exec", **kw)
        envs.append(env)
        return env

    yield build
    for e in envs:
        e.close()


# ------------------------------------------------------------------ task generator
def test_tasks_are_deterministic_and_json_able():
    for d in tasks.DIFFICULTIES:
        for split in tasks.SPLITS:
            a, b = tasks.generate_task(11, d, split), tasks.generate_task(11, d, split)
            assert a == b and a["difficulty"] == d and json.loads(json.dumps(a)) == a
            assert set(a) >= {"id", "prompt", "answer", "difficulty", "kind"}
    assert tasks.generate_task(1, 3) != tasks.generate_task(2, 3)
    rng1, rng2 = np.random.default_rng(5), np.random.default_rng(5)
    assert tasks.sample_task(rng1, [1, 4]) == tasks.sample_task(rng2, [1, 4])


def test_splits_are_disjoint_by_content():
    train = {tasks.generate_task(i, 1, "train")["prompt"] for i in range(3000)}
    held_out = {t["prompt"] for t in tasks.eval_tasks(200, 1)}
    assert len(held_out) == 200 and not train & held_out


def _primes_below(n):
    return [p for p in range(2, n) if all(p % q for q in range(2, math.isqrt(p) + 1))]


def test_generated_answers_are_right():
    """Recompute each kind's answer from its prompt with independent brute force."""
    seen = set()
    for seed in range(300):
        t = tasks.generate_task(seed, 1 + seed % 4)
        p, ans = t["prompt"], int(t["answer"])
        nums = [int(x) for x in re.findall(r"\d+", p)]
        seen.add(t["kind"])
        if t["kind"] in ("add", "arith"):
            expr = p.removeprefix("What is ").removeprefix("Compute ").rstrip("?.")
            assert eval(expr) == ans
        elif t["kind"] == "multiples":
            n, k, m = nums
            assert ans == sum(x for x in range(1, n) if x % k == 0 or x % m == 0)
        elif t["kind"] == "squares":
            a, b = nums[-2:]
            par = 1 if "odd" in p else 0
            assert ans == sum(x * x for x in range(a, b + 1) if x % 2 == par)
        elif t["kind"] == "prime_sum" and nums[0] < 5000:
            assert ans == sum(_primes_below(nums[0]))
        elif t["kind"] == "fib_mod":
            n, m = nums[-2:]
            a, b = 0, 1
            for _ in range(n):
                a, b = b, a + b
            assert ans == a % m
        elif t["kind"] == "digit_sum_pow":
            a, b = nums
            assert ans == sum(int(c) for c in str(a**b))
        elif t["kind"] == "divisors":
            m, count, d = nums[0], 1, 2  # via the prime factorization, unlike the generator
            while d * d <= m:
                e = 0
                while m % d == 0:
                    m, e = m // d, e + 1
                count, d = count * (e + 1), d + 1
            assert ans == (count * 2 if m > 1 else count)
        elif t["kind"] == "collatz":
            x, steps = nums[0], 0
            while x != 1:
                x, steps = (x // 2 if x % 2 == 0 else 3 * x + 1), steps + 1
            assert ans == steps
    assert seen >= {
        "add",
        "arith",
        "multiples",
        "squares",
        "prime_sum",
        "fib_mod",
        "digit_sum_pow",
        "divisors",
        "collatz",
    }


def test_function_tasks_have_consistent_tests():
    for seed in range(20):
        t = tasks.generate_task(seed, 5)
        assert t["kind"] == "function" and t["answer"] is None and len(t["tests"]) >= 5
        assert all(s.startswith(f"assert {t['entry_point']}(") for s in t["tests"])


def test_bad_generator_args():
    with pytest.raises(ValueError):
        tasks.generate_task(0, 9)
    with pytest.raises(ValueError):
        tasks.generate_task(0, 1, "test")


# ------------------------------------------------------------------ episodes with the real tool
def test_solve_with_python_tool_then_answer(env_factory):
    env = env_factory(difficulty=4)
    obs, info = env.reset(seed=123)
    task = info["task"]
    assert "python" in obs and info["tools"][0]["function"]["name"] == "python"
    obs, r, term, _, sinfo = env.step("I'll compute it.\n" + py_call(f"print({task['answer']})"))
    assert not term and r == 0.0 and obs == task["answer"]
    assert sinfo["messages"][0]["role"] == "tool" and sinfo["tool_stats"]["calls"] == 1
    _, r, term, _, _ = env.step(f"The result is \\boxed{{{task['answer']}}}.")
    assert term and r == 1.0


@pytest.mark.parametrize(
    "final, reward",
    [("#### {a}", 1.0), ("Answer: {a}", 1.0), ("so it is {a}", 1.0), ("\\boxed{{{a}1}}", 0.0), ("no idea", 0.0)],
)
def test_answer_formats(env_factory, final, reward):
    env = env_factory(difficulty=1)
    _, info = env.reset(seed=5)
    assert env.step(final.format(a=info["task"]["answer"]))[1] == reward


def test_code_errors_and_timeouts_are_shown_to_the_model(env_factory):
    env = env_factory(code_timeout_s=0.5)
    env.reset(seed=0)
    obs, _, term, _, info = env.step(py_call("import time\ntime.sleep(10)"))
    assert not term and obs.startswith("TimeoutError") and info["tool_stats"]["errors"] == 0
    obs, _, term, _, _ = env.step(py_call("print(undefined_name)"))
    assert not term and "NameError" in obs and "[exit code 1]" in obs


def test_python_block_parser_and_bash(env_factory):
    env = env_factory(parser="python_block", tools=["python", "bash"], difficulty=2)
    obs, info = env.reset(seed=9)
    assert "```python" in info["messages"][0]["content"]
    assert [t["function"]["name"] for t in info["tools"]] == ["python", "bash"]
    expr = info["task"]["prompt"].removeprefix("Compute ").rstrip(".")
    obs, _, term, _, _ = env.step(f"```python\nprint({expr})\n```")
    assert not term and obs == info["task"]["answer"]
    assert env.step(f"\\boxed{{{obs}}}")[1] == 1.0


GOOD = {
    "digit_power_sum": "def digit_power_sum(n):\n    k = {k}\n    return sum(int(d) ** k for d in str(n))",
    "count_divisible": "def count_divisible(a, b):\n    return sum(1 for x in range(a, b + 1) if x % {k} == 0)",
    "rotate_left": "def rotate_left(xs, k):\n    if not xs: return []\n    k %= len(xs)\n    return xs[k:] + xs[:k]",
}


def _good_solution(task):
    k = re.search(r"the (\d+)-th powers", task["prompt"]) or re.search(r"divisible by (\d+)", task["prompt"])
    return GOOD[task["entry_point"]].format(k=k.group(1) if k else "")


def test_unit_test_tasks(env_factory):
    env = env_factory(difficulty=5)
    for seed in range(3):
        _, info = env.reset(seed=seed)
        task = info["task"]
        good = _good_solution(task)
        assert env.step(f"Here it is:\n```python\n{good}\n```")[1] == 1.0
        env.reset(seed=seed)
        assert env.step(f"```python\ndef {task['entry_point']}(*a):\n    return 0\n```")[1] == 0.0


@pytest.mark.parametrize(
    "cheat",
    [
        "import sys\nsys.exit(0)",
        "import os\nos._exit(0)",
        "print('[true, true, true, true, true, true]')",
        "while True: pass",
    ],
)
def test_unit_test_cheats_score_zero(env_factory, cheat):
    env = env_factory(difficulty=5, code_timeout_s=1.0)
    env.reset(seed=0)
    assert env.step(f"```python\n{cheat}\n```")[1] == 0.0


def test_fraction_reward_and_solution_from_last_call(env_factory):
    env = env_factory(difficulty=5, test_reward="fraction", parser="python_block")
    _, info = env.reset(seed=1)
    task = info["task"]
    # Passes only the tests whose expected value happens to be 0.
    partial = f"def {task['entry_point']}(*a):\n    return 0 if not isinstance(a[0], list) else []"
    env.step(f"```python\n{partial}\n```")  # with python_block, running the code is the submission
    _, r, term, _, _ = env.step("Done.")
    expected = sum(t.endswith("== 0") or t.endswith("== []") for t in task["tests"]) / len(task["tests"])
    assert 0 < expected < 1 and term and r == pytest.approx(expected)
    env.reset(seed=1)
    env.step(f"```python\n{_good_solution(task)}\n```")
    assert env.step("Done.")[1] == 1.0
    env.reset(seed=1)
    assert env.step("I give up.")[1] == 0.0  # no code at all


class BrokenSandbox(Sandbox):
    async def run(self, argv, *, stdin=None, timeout_s, files=None):
        raise SandboxError("sandbox is down")


def test_sandbox_failure_ends_episode_as_sandbox_error():
    env = CodeExecEnv(sandbox=BrokenSandbox())
    env.reset(seed=0)
    with pytest.raises(SandboxError):
        env.step(py_call("print(1)"))
    env = CodeExecEnv(sandbox=BrokenSandbox(), difficulty=5)
    env.reset(seed=0)
    with pytest.raises(SandboxError):  # grading failures too: not scored as 0
        env.step("```python\ndef f(): pass\n```")


# ------------------------------------------------------------------ sandbox wiring
def test_one_shot_runs_share_nothing(env_factory):
    env = env_factory(tools=["python", "bash"])
    env.reset(seed=0)
    env.step("<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": "echo hi > note"}}) + "</tool_call>")
    obs, *_ = env.step(py_call("import os; print(os.path.exists('note'))"))
    assert obs == "False"
    assert "Nothing persists" in env.reset(seed=0)[1]["tools"][0]["function"]["description"]


def test_session_keeps_files_across_turns_and_not_across_episodes(env_factory):
    env = env_factory(session=True, tools=["python", "bash"])
    _, info = env.reset(seed=0)
    assert "files written in the working directory do" in info["tools"][0]["function"]["description"]
    env.step(py_call("open('state.txt', 'w').write('41')"))
    obs, *_ = env.step(py_call("print(int(open('state.txt').read()) + 1)"))
    assert obs == "42"
    obs, *_ = env.step(
        "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": "cat state.txt"}}) + "</tool_call>"
    )
    assert obs == "41"
    workdir = env.runner._session._wd.path
    env.reset(seed=1)  # a new episode: the old session is closed, its work dir gone
    assert env.runner._session is None and not os.path.exists(workdir)
    obs, *_ = env.step(py_call("import os; print(os.path.exists('state.txt'))"))
    assert obs == "False"
    workdir = env.runner._session._wd.path
    env.close()
    assert not os.path.exists(workdir)


async def test_session_closed_by_close_inside_a_running_loop(env_factory):
    env = env_factory(session=True)
    await env.areset(seed=0)
    await env.astep(py_call("open('f', 'w').write('x')"))
    workdir = env.runner._session._wd.path
    env.close()  # what the episode manager does, from inside its loop
    for _ in range(50):
        if not os.path.exists(workdir):
            break
        await asyncio.sleep(0.01)
    assert not os.path.exists(workdir)


def test_grading_runs_one_shot_even_with_sessions(env_factory):
    env = env_factory(session=True, difficulty=5)
    _, info = env.reset(seed=0)
    n = len(info["task"]["tests"])
    # A json.py planted in the session's work dir would replace the grader's tests with "pass".
    plant = (
        f"def load(f):\n    return ['pass'] * {n}\ndef dumps(x):\n    return '[' + ', '.join(['true'] * {n}) + ']'\n"
    )
    env.step(py_call(f"open('json.py', 'w').write({plant!r})"))
    obs, *_ = env.step(py_call("import json; print(json.load(None)[0])"))
    assert obs == "pass"  # the plant works inside the session...
    wrong = f"```python\ndef {info['task']['entry_point']}(*a):\n    return 0\n```"
    assert env.step(wrong)[1] == 0.0  # ...not on the grader


class NoSessions(Sandbox):
    name = "nosessions"

    async def run(self, argv, *, stdin=None, timeout_s, files=None):
        raise SandboxError("unused")


def test_session_needs_a_backend_with_sessions():
    with pytest.raises(ConfigError, match="no sessions"):
        CodeExecEnv(sandbox=NoSessions(), session=True)


@pytest.mark.parametrize(
    "kw",
    [
        {"difficulty": 0},
        {"difficulty": []},
        {"split": "test"},
        {"tools": ["bash"]},
        {"tools": ["python", "curl"]},
        {"test_reward": "most"},
        {"code_timeout_s": 0},
        {"sandbox_backend": "podman"},
        {"session": "yes"},
    ],
)
def test_config_errors(kw):
    with pytest.raises(ConfigError):
        CodeExecEnv(**kw)


def test_eval_split_and_options(env_factory):
    env = env_factory(split="eval", difficulty=[1, 2])
    ids = {env.reset(seed=s)[1]["task"]["id"] for s in range(10)}
    assert all("-eval-" in i for i in ids)
    _, info = env.reset(seed=0, options={"difficulty": 3, "split": "train"})
    assert info["task"]["difficulty"] == 3 and "-train-" in info["task"]["id"]


def test_failed_call_penalty_is_a_per_turn_reward(env_factory):
    env = env_factory(failed_call_penalty=0.5)
    env.reset(seed=0)
    _, r, term, _, _ = env.step(py_call("print(undefined_name)"))  # crashes: penalised
    assert not term and r == -0.5
    _, r, _, _, _ = env.step(py_call("print(1)") + py_call("1/0") + "<tool_call>{bad</tool_call>")
    assert r == -1.0  # one good call, one crash, one malformed
    _, r, _, _, _ = env.step(py_call("print(2)"))
    assert r == 0.0
    with pytest.raises(ConfigError, match="failed_call_penalty"):
        env_factory(failed_call_penalty=-1)
