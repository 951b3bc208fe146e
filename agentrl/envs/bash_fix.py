"""``BashFixEnv``: shell tasks on a work dir of files, scored by a check of the files the agent leaves.

Owns: the env around :mod:`agentrl.envs.bash_tasks` (the tasks, their check program): the prompts, the
``bash`` tool for the built-in loop, and the score. Each episode's work dir starts with the task's files;
when the agent is done, the task's ``collect`` paths are copied out of it and the check runs in a fresh
sandbox holding only those files (nothing the agent left running or planted elsewhere can reach it):
reward 1.0 when it passes, else 0.0, with the check's reason (``last_check``; ``info["check"]`` of the
final step).

Two ways to act on the work dir:

- the built-in loop: the ``bash`` tool runs every command of an episode in one sandbox session that
  starts with the task's files; the episode ends on a reply without a tool call, and the score collects
  the files from that session;
- an outside agent program (``agent.kind: proxy``): ``reset``'s ``info["workspace"]``
  (``{"files": {path: text}, "collect": [paths]}``) asks the proxy to start the program in a work dir
  holding the files (with ``agent.isolation: sandbox``, the program's own sandbox work dir, where the
  shell commands it runs execute; ``AGENTRL_WORKDIR`` names it) and to hand back the collected files,
  which :meth:`BashFixEnv.check_workspace` scores (the final text plays no part).

Does not: generate tasks (``bash_tasks``), isolate anything itself (the sandbox does).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence

import numpy as np

from agentrl.envs import bash_tasks
from agentrl.envs.base import ToolEnv
from agentrl.errors import ConfigError, RewardError
from agentrl.sandbox.base import Sandbox
from agentrl.sandbox.factory import BACKENDS, shared_sandbox
from agentrl.tools.bash import make_bash_tool
from agentrl.tools.episode_sandbox import EpisodeSandbox

SYSTEM_PROMPT = (
    "You work in a Linux shell. Call the `bash` tool to run shell commands in the task's directory (files "
    "persist between calls); it returns what they print. When the task is done, reply without any tool call "
    "and say what you did in one line."
)
_CHECK_FILE = "agentrl_check.py"


class BashFixEnv(ToolEnv):
    """Files to inspect or fix with shell commands; reward 1.0 when the task's check passes.

    Args:
        split: ``"train"`` or ``"eval"`` (held-out tasks).
        kinds: which task kinds to draw (``bash_tasks.KINDS``; default all).
        sandbox: a ``Sandbox`` to run commands and the check in (overrides ``sandbox_backend``); it must
            have sessions (the built-in loop keeps an episode's files in one).
        sandbox_backend: ``"auto"``, ``"local"``, ``"docker"`` or ``"subprocess"`` (no isolation).
        sandbox_options: constructor options of that backend.
        command_timeout_s: deadline of one ``bash`` call of the built-in loop.
        check_timeout_s: deadline of the check.
        system_prompt: overrides :data:`SYSTEM_PROMPT`; ``""`` sends none.
        **kwargs: ``ToolEnv`` options (parser, on_bad_call, tool_timeout_s, ...).
    """

    has_eval_split = True

    def __init__(
        self,
        *,
        split: str = "train",
        kinds: Sequence[str] | None = None,
        sandbox: Sandbox | None = None,
        sandbox_backend: str = "auto",
        sandbox_options: dict | None = None,
        command_timeout_s: float = 5.0,
        check_timeout_s: float = 10.0,
        system_prompt: str | None = None,
        **kwargs,
    ) -> None:
        if split not in bash_tasks.SPLITS:
            raise ConfigError(f"split must be one of {bash_tasks.SPLITS}, got {split!r}")
        try:
            self.kinds = bash_tasks.check_kinds(kinds)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        for name, value in (("command_timeout_s", command_timeout_s), ("check_timeout_s", check_timeout_s)):
            if not value > 0:
                raise ConfigError(f"{name} must be > 0, got {value!r}")
        if sandbox_backend not in BACKENDS:
            raise ConfigError(f"sandbox_backend must be one of {list(BACKENDS)}, got {sandbox_backend!r}")
        self.sandbox = sandbox if sandbox is not None else shared_sandbox(sandbox_backend, **(sandbox_options or {}))
        self.runner = EpisodeSandbox(self.sandbox, session=True)
        self.split, self.check_timeout_s = split, check_timeout_s
        self.tools = [make_bash_tool(self.runner, timeout_s=command_timeout_s)]
        super().__init__(**kwargs)
        self.system_prompt = SYSTEM_PROMPT if system_prompt is None else system_prompt
        self.last_check = ""

    # ---------------------------------------------------------------- episode lifecycle
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        self.runner.end_episode(self._loop)  # a new episode never sees the last one's files
        obs, info = super().reset(seed=seed, options=options)
        task = info["task"]
        self.runner.start_with({k: v.encode() for k, v in task["files"].items()})
        self.last_check = ""
        info["workspace"] = {"files": dict(task["files"]), "collect": list(task["collect"])}
        return obs, info

    def close(self) -> None:
        self.runner.end_episode(self._loop)
        super().close()

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = await super().astep(action)
        if info.get("final"):
            info["check"] = self.last_check
        return obs, reward, terminated, truncated, info

    # ---------------------------------------------------------------- ToolEnv hooks
    def sample_task(self, rng: np.random.Generator, options: dict) -> dict:
        return bash_tasks.sample_task(rng, options.get("split", self.split), options.get("kinds", self.kinds))

    def initial_messages(self, task: dict) -> list[dict]:
        messages = [{"role": "user", "content": task["prompt"]}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    async def score(self, task: dict, final_text: str, transcript: list[dict]) -> float:
        files = await self.runner.collect(task["collect"])
        if files is None:  # no command ran: the work dir is as the task made it
            files = {k: v.encode() for k, v in task["files"].items() if k in task["collect"]}
        reward, _ = await self.check_workspace(files)
        return reward

    # ---------------------------------------------------------------- the check
    async def check_workspace(self, files: Mapping[str, bytes]) -> tuple[float, str]:
        """Score the current task on ``files`` (its ``collect`` paths as the agent left them; a missing one
        is absent): the check program in a fresh sandbox. Returns (1.0 or 0.0, the check's reason); a check
        that does not report (it crashed or timed out: the checked script cannot make it, its output is
        captured) raises RewardError."""
        task = self._task
        if task is None:
            raise RewardError("BashFixEnv.check_workspace before reset(): no task to check")
        nonce = "AGENTRL-CHECK-" + secrets.token_hex(16)
        wanted = {k: bytes(v) for k, v in files.items() if k in task["collect"]}
        spec = {"nonce": nonce, "kind": task["kind"], "expect": task["expect"]}
        res = await self.sandbox.run(
            ["python3", _CHECK_FILE],
            stdin=(json.dumps(spec) + "\n").encode(),
            files={**wanted, _CHECK_FILE: bash_tasks.CHECK_PROGRAM.encode()},
            timeout_s=self.check_timeout_s,
        )
        line = next((ln for ln in res.stdout.splitlines() if ln.startswith(nonce)), None)
        if line is None:
            raise RewardError(f"the bash_fix check did not report (status {res.status}): {res.stderr[-300:]!r}")
        verdict = json.loads(line[len(nonce) :])
        self.last_check = str(verdict.get("reason", ""))
        return (1.0 if verdict.get("ok") is True else 0.0), self.last_check
