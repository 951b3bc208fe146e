"""``JudgedEnv``: any env, with its final answer scored by an LLM judge.

Owns: the wrapper (it forwards ``reset``/``step`` and their async variants, keeps the episode's
task and transcript, and on the terminating step asks ``agentrl.envs.judge.JudgeReward`` for a score,
combined with the env's own reward by ``combine``) and ``make_judged_env``, the factory registered
as env id ``judged`` / ``Judged-v0``::

    agentrl run --env judged --set 'env.kwargs={env: code_exec, judge: {model: openai/gpt-4o-mini}}'

``combine``: ``"replace"`` (reward = weight x judge score), ``"add"`` (env reward + weight x score)
or ``"multiply"`` (env reward x score). A judge failure raises ``RewardError`` out of ``step``: the
episode ends as ``reward_error``, never with reward 0. Episodes that end without a final answer
(ended by a bad call, or truncated) are not judged.

Does not: judge intermediate turns, or change what the wrapped env parses, runs or shows the model.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import gymnasium as gym

from agentrl.envs.judge import JudgeReward
from agentrl.envs.registry import make
from agentrl.errors import ConfigError

COMBINE = ("replace", "add", "multiply")


class JudgedEnv(gym.Wrapper):
    """Wraps ``env`` (an agentrl text env, a ``gymnasium.Env``); see the module docstring. Other
    attributes are the wrapped env's (``parser``, ``tools``...)."""

    def __init__(self, env: Any, judge: JudgeReward | dict, *, combine: str = "replace", weight: float = 1.0) -> None:
        if combine not in COMBINE:
            raise ConfigError(f"combine must be one of {COMBINE}, got {combine!r}")
        if not isinstance(weight, (int, float)):
            raise ConfigError(f"weight must be a number, got {weight!r}")
        super().__init__(env)
        self.judge = JudgeReward.from_config(judge)
        self.combine, self.weight = combine, float(weight)
        self._task: dict = {}
        self._transcript: list[dict] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def __getattr__(self, name: str) -> Any:  # only called for attributes the wrapper lacks
        if name == "env" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.env, name)

    async def _call(self, name: str, *args: Any, **kw: Any) -> Any:
        afn = getattr(self.env, "a" + name, None)
        if afn is not None:
            return await afn(*args, **kw)
        return await asyncio.to_thread(getattr(self.env, name), *args, **kw)

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        obs, info = await self._call("reset", seed=seed, options=options)
        self._task = copy.deepcopy(info.get("task", {}))
        self._transcript = copy.deepcopy(info.get("messages", []))
        return obs, info

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = await self._call("step", action)
        self._transcript.append({"role": "assistant", "content": action})
        self._transcript.extend(copy.deepcopy(info.get("messages", [])))
        if terminated and not truncated and not info.get("ended_by") and info.get("final", True):
            score = await self.judge(self._task, action, copy.deepcopy(self._transcript))
            info = {**info, "judge_score": score, "env_reward": float(reward)}
            if self.combine == "replace":
                reward = self.weight * score
            elif self.combine == "add":
                reward = float(reward) + self.weight * score
            else:
                reward = float(reward) * score
        return obs, reward, terminated, truncated, info

    def _run(self, coro: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError("JudgedEnv.reset()/step() called inside a running event loop; await areset()/astep()")
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        return self._run(self.areset(seed=seed, options=options))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        return self._run(self.astep(action))

    def close(self) -> None:
        try:
            self.env.close()
        finally:
            if self._loop is not None and not self._loop.is_closed() and not self._loop.is_running():
                self._loop.close()
            self._loop = None


def make_judged_env(
    env: str = "code_exec",
    judge: JudgeReward | dict | None = None,
    env_kwargs: dict | None = None,
    combine: str = "replace",
    weight: float = 1.0,
    **inner: Any,
) -> JudgedEnv:
    """The ``judged`` env id: ``agentrl.make(env, **env_kwargs, **inner)`` wrapped in a ``JudgedEnv``
    (other keywords go to the wrapped env, so ``eval.env_kwargs={split: eval}`` still reaches it)."""
    if judge is None:
        raise ConfigError("env 'judged' needs a judge: env.kwargs.judge = {model: provider/name, ...}")
    if env in ("judged", "Judged-v0"):
        raise ConfigError("env 'judged' cannot wrap itself; set env.kwargs.env to another env id")
    inner_kwargs = {**(env_kwargs or {}), **inner}
    judge_obj = JudgeReward.from_config(judge)  # a bad judge config fails before any env is built
    inner = make(env, **inner_kwargs)
    try:
        return JudgedEnv(inner, judge_obj, combine=combine, weight=weight)
    except Exception:
        inner.close()
        raise
