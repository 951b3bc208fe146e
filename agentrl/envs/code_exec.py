"""``CodeExecEnv``: solve tasks by writing and running Python through the ``python`` tool.

Owns: the task source (procedural ``agentrl.envs.tasks`` by default, or a dataset file with
``dataset=path``), the prompts, and the reward:

* tasks with an ``answer``: ``rewards.rule_reward`` on the final assistant text, which accepts
  ``\\boxed{x}``, ``#### x``, ``answer: x`` or, failing those, the last number; 1.0 or 0.0.
* tasks with ``tests`` + ``entry_point``: the solution is the last ```python block of the final
  text or, if it has none, the code of the last ``python`` call (with the ``python_block`` parser
  every python block *is* a call, so "the last code you ran" is the solution). It runs with the
  tests in the sandbox, each test isolated by try/except; ``test_reward="all"`` (default) gives
  1.0 only if every test passes (binary rewards resist partial-credit hacking),
  ``"fraction"`` gives the fraction passed. A pass needs an explicit result line tagged with a
  per-run nonce, so ``sys.exit(0)`` / ``os._exit(0)`` in the solution score 0, not a pass; a
  solution that hangs past ``code_timeout_s`` scores 0. This is not adversarially robust: the
  solution runs in the grader's process and could forge the line (the sandbox is the boundary).

Sandbox wiring: ``sandbox_backend`` picks the process-wide shared sandbox (``"auto"``: docker when a
daemon and the image are there, else the hardened local backend); ``session=True`` runs all tool
calls of an episode in one ``SandboxSession`` (files persist across turns), opened at the first
call and closed at the next reset or ``env.close()``. Grading always runs one-shot in a fresh
sandbox, so nothing the model left in its session can touch the grader.

Does not: isolate code (the sandbox does, or does not: see ``agentrl.sandbox``), count turns.
"""

from __future__ import annotations

import json
import re
import secrets

import numpy as np

from agentrl.envs import rewards
from agentrl.envs import tasks as procedural
from agentrl.envs.base import ToolEnv
from agentrl.envs.datasets import load_tasks
from agentrl.errors import ConfigError
from agentrl.sandbox.base import Sandbox
from agentrl.sandbox.factory import BACKENDS, shared_sandbox
from agentrl.tools.bash import make_bash_tool
from agentrl.tools.episode_sandbox import EpisodeSandbox
from agentrl.tools.python import make_python_tool

SYSTEM_PROMPTS = {
    "hermes": (
        "You solve problems by writing and running Python. Call the `python` tool to run a program; it "
        "returns what the program prints, so print() the values you need. When you know the answer, reply "
        "without any tool call and write the final answer as \\boxed{answer}."
    ),
    "python_block": (
        "You solve problems by writing and running Python. To run a program, write it in a ```python code "
        "block; what it prints will be shown to you, so print() the values you need. When you know the "
        "answer, reply without a code block and write the final answer as \\boxed{answer}. If the task asks "
        "for a function, the last code block you ran is taken as your solution."
    ),
}

_CODE_BLOCK = re.compile(r"```(?:python|py)[ \t]*\r?\n(.*?)```", re.DOTALL)

# Runs the solution, then each test in its own try/except, and reports on a nonce-tagged line.
_GRADER = r"""
import contextlib, io, json, sys
nonce = sys.stdin.readline().strip()
tests = json.load(open("tests.json", encoding="utf-8"))
ns = {"__name__": "solution"}
try:
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(open("solution.py", encoding="utf-8").read(), "solution.py", "exec"), ns)
    loaded = True
except BaseException:
    loaded = False
passed = []
for test in tests:
    ok = False
    if loaded:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(test, dict(ns))
            ok = True
        except BaseException:
            pass
    passed.append(ok)
sys.__stdout__.write(nonce + json.dumps(passed) + "\n")
sys.__stdout__.flush()
"""


_FAILURE_MARKS = ("Traceback (most recent call last)", "[exit code ", "TimeoutError: ", "[the program was killed")


def _failed(result) -> bool:
    """A call the model got wrong: rejected by the env, or its program failed (format_exec_result's marks)."""
    return result.error is not None or any(m in result.content for m in _FAILURE_MARKS)


class CodeExecEnv(ToolEnv):
    """Tasks solved with a Python tool; reward from the final answer or from unit tests.

    Args:
        difficulty: procedural difficulty 1-5, or a list to mix (see ``agentrl.envs.tasks``); default 3
            (sums over ranges with a filter: a loop, so the tool is needed).
        split: ``"train"`` or ``"eval"`` (held-out procedural tasks).
        dataset: path to a JSONL/JSON/parquet task file (see ``agentrl.envs.datasets``) instead.
        on_bad_row: dataset policy for unusable rows, ``"error"`` or ``"skip"``.
        tools: which tools to offer: ``("python",)`` or ``("python", "bash")``.
        sandbox: a ``Sandbox`` instance to run code in (overrides ``sandbox_backend``).
        sandbox_backend: ``"auto"``, ``"local"``, ``"docker"`` or ``"subprocess"`` (no isolation):
            the process-wide shared sandbox of that backend.
        sandbox_options: constructor options of that backend (a shared instance per distinct options).
        session: run the tool calls of one episode in one sandbox session (files persist).
        code_timeout_s: deadline of one program run (tool call or grading).
        test_reward: ``"all"`` or ``"fraction"`` for tasks with unit tests.
        system_prompt: overrides the default prompt for the parser; ``""`` sends none.
        failed_call_penalty: per-turn reward of ``-penalty`` for each call in the turn that failed
            (malformed/unknown/bad arguments, or a program that crashed, timed out or exited non-zero):
            a turn-level signal for credit assignment experiments (default 0: outcome reward only).
        **kwargs: ``ToolEnv`` options (parser, on_bad_call, tool_timeout_s, ...).
    """

    def __init__(
        self,
        *,
        difficulty: int | list[int] = 3,
        split: str = "train",
        dataset: str | None = None,
        on_bad_row: str = "error",
        tools: tuple[str, ...] | list[str] = ("python",),
        sandbox: Sandbox | None = None,
        sandbox_backend: str = "auto",
        sandbox_options: dict | None = None,
        session: bool = False,
        code_timeout_s: float = 5.0,
        test_reward: str = "all",
        system_prompt: str | None = None,
        failed_call_penalty: float = 0.0,
        **kwargs,
    ) -> None:
        levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
        if not levels or any(d not in procedural.DIFFICULTIES for d in levels):
            raise ConfigError(
                f"difficulty must be in {procedural.DIFFICULTIES} (or a list of them), got {difficulty!r}"
            )
        if split not in procedural.SPLITS:
            raise ConfigError(f"split must be one of {procedural.SPLITS}, got {split!r}")
        if test_reward not in ("all", "fraction"):
            raise ConfigError(f"test_reward must be 'all' or 'fraction', got {test_reward!r}")
        if not code_timeout_s > 0:
            raise ConfigError(f"code_timeout_s must be > 0, got {code_timeout_s!r}")
        factories = {"python": make_python_tool, "bash": make_bash_tool}
        unknown = [t for t in tools if t not in factories]
        if unknown or "python" not in tools:
            raise ConfigError(f"tools must include 'python' and only name {sorted(factories)}, got {list(tools)!r}")
        if sandbox_backend not in BACKENDS:
            raise ConfigError(f"sandbox_backend must be one of {list(BACKENDS)}, got {sandbox_backend!r}")
        if not isinstance(session, bool):
            raise ConfigError(f"session must be true or false, got {session!r}")
        self.sandbox = sandbox if sandbox is not None else shared_sandbox(sandbox_backend, **(sandbox_options or {}))
        self.runner = EpisodeSandbox(self.sandbox, session=session)
        if not failed_call_penalty >= 0:
            raise ConfigError(f"failed_call_penalty must be >= 0, got {failed_call_penalty!r}")
        self.code_timeout_s, self.test_reward = code_timeout_s, test_reward
        self.failed_call_penalty = float(failed_call_penalty)
        self.difficulty, self.split = levels, split
        self.tools = [factories[t](self.runner, timeout_s=code_timeout_s) for t in tools]
        super().__init__(**kwargs)
        self.system_prompt = (
            SYSTEM_PROMPTS.get(self.parser, SYSTEM_PROMPTS["hermes"]) if system_prompt is None else system_prompt
        )
        self.dataset = None
        if dataset is not None:
            self.dataset = load_tasks(dataset, on_bad_row=on_bad_row)

    # ---------------------------------------------------------------- episode lifecycle
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        self.runner.end_episode(self._loop)  # a new episode never sees the last one's files
        return super().reset(seed=seed, options=options)

    def close(self) -> None:
        self.runner.end_episode(self._loop)
        super().close()

    # ---------------------------------------------------------------- ToolEnv hooks
    def sample_task(self, rng: np.random.Generator, options: dict) -> dict:
        if self.dataset is not None:
            index = options.get("index")
            if index is None:
                index = int(rng.integers(len(self.dataset)))
            return dict(self.dataset[int(index) % len(self.dataset)])
        difficulty = options.get("difficulty", self.difficulty)
        return procedural.sample_task(rng, difficulty, options.get("split", self.split))

    def initial_messages(self, task: dict) -> list[dict]:
        prompt = task["prompt"]
        messages = [dict(m) for m in prompt] if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def turn_reward(self, task: dict, parsed, results) -> float:
        if not self.failed_call_penalty:
            return 0.0
        return -self.failed_call_penalty * sum(1 for r in results if _failed(r))

    async def score(self, task: dict, final_text: str, transcript: list[dict]) -> float:
        if task.get("tests"):
            return await self._score_tests(task, final_text, transcript)
        return rewards.rule_reward(final_text, task.get("answer"))

    # ---------------------------------------------------------------- unit tests
    @staticmethod
    def solution_code(final_text: str, transcript: list[dict]) -> str | None:
        """The last ```python block of the final text, else the code of the last python call."""
        blocks = _CODE_BLOCK.findall(final_text)
        if blocks:
            return blocks[-1]
        for msg in reversed(transcript):
            for call in reversed(msg.get("tool_calls") or []):
                if call.get("name") == "python" and isinstance(call.get("arguments", {}).get("code"), str):
                    return call["arguments"]["code"]
        return None

    async def _score_tests(self, task: dict, final_text: str, transcript: list[dict]) -> float:
        code = self.solution_code(final_text, transcript)
        if code is None:
            return 0.0
        nonce = "AGENTRL-RESULT-" + secrets.token_hex(16)
        files = {
            "solution.py": code.encode("utf-8", "surrogatepass"),
            "tests.json": json.dumps(list(task["tests"])).encode(),
            "grader.py": _GRADER.encode(),
        }
        res = await self.sandbox.run(
            ["python3", "grader.py"], stdin=(nonce + "\n").encode(), files=files, timeout_s=self.code_timeout_s
        )
        line = next((ln for ln in res.stdout.splitlines() if ln.startswith(nonce)), None)
        if res.status != "ok" or line is None:
            return 0.0  # timed out, crashed the grader, or exited early: the solution's fault
        try:
            passed = json.loads(line[len(nonce) :])
        except json.JSONDecodeError:
            return 0.0
        if not isinstance(passed, list) or len(passed) != len(task["tests"]):
            return 0.0
        n_ok = sum(1 for p in passed if p is True)
        if self.test_reward == "fraction":
            return n_ok / len(passed)
        return 1.0 if n_ok == len(passed) else 0.0
