"""Proxy-mode episodes: the strategy the episode manager runs instead of its built-in turn loop.

Owns: :class:`ProxyStrategy`, which per episode resets the env (the task), links a fresh API key to a
recorder on the run's :class:`~agentrl.agents.proxy.ProxyEndpoint`, runs the agent program, then
types the outcome and reward:

The program runs in the sandbox (``agent.isolation: sandbox``, :mod:`agentrl.agents.sandboxed`),
on the host (``host``, :mod:`agentrl.agents.program`), or, a callable, in this process.

- the program crashed (non-zero exit, a raised exception) -> ``env_error``; it ran past
  ``agent.timeout_s`` -> ``deadline``; it made no completion request -> ``env_error`` (all
  infrastructure outcomes: excluded from the loss, counted);
- a budget stopped it (``rollout.max_turns``, ``rollout.max_context``) -> ``truncated_turns`` /
  ``context_overflow``; its last reply hit its token limit -> ``truncated_length`` (reward 0, or
  with ``rollout.score_truncated`` and ``agent.reward: env`` the env's score of the cut text);
- else the reward comes from the program's result (``agent.reward: program``; none ->
  ``reward_error``) or from the env scoring the final assistant text (``agent.reward: env``; an
  env that does not end the episode on it -- the program stopped while the model was still
  calling tools -> ``truncated_turns``, reward 0, as the built-in loop at its turn limit).

An env whose reset asks for a workspace (``info["workspace"]``: files the program starts with,
paths to copy back; :class:`~agentrl.agents.program.Workspace`) gets its files into the program's
work dir (the sandbox's, or a fresh host directory: ``AGENTRL_WORKDIR``), and with ``agent.reward:
env`` scores what the program left there (``env.check_workspace(files) -> (reward, reason)``; the
final text plays no part, so a harness may end on a tool call; the reason is in the trajectory's
``info["agent"]["check"]``).

Its counters (:data:`COUNTERS`) are the run's ``agent/...`` metrics: per training step
(``take_step``), in total (``totals``) and, for a held-out eval, those of a ``sibling`` strategy.

The recorder's segments go to the manager through ``state``: ``state["ep"]`` the last (the
episode's trajectory), ``state["earlier"]`` the ones an agent's history rewrite closed.
Does not: sample or record completions (:mod:`agentrl.agents.proxy`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import Counter
from typing import Any

from agentrl.agents.config import AgentConfig
from agentrl.agents.program import Workspace, load_callable, reward_of, run_callable, run_command
from agentrl.agents.proxy import Budget, EpisodeLink, ProxyEndpoint
from agentrl.agents.sandboxed import SandboxedCommand
from agentrl.episodes.manager import add_reward_components
from agentrl.errors import EnvError
from agentrl.sandbox.base import Limits
from agentrl.trajectory import Outcome, Trajectory


async def _env_call(env: Any, name: str, *args: Any, **kw: Any) -> Any:
    afn = getattr(env, "a" + name, None)
    if afn is not None:
        return await afn(*args, **kw)
    return await asyncio.to_thread(getattr(env, name), *args, **kw)


#: The strategy's counters (see :meth:`ProxyStrategy.totals`), in the order metrics show them.
COUNTERS = (
    "episodes",
    "requests",
    "split_trajectories",
    "delta_prompts",
    "program_crashes",
    "program_timeouts",
    "budget_stops",
    "unfinished",
    "no_reward",
)


def proxy_strategy_of(manager: Any) -> ProxyStrategy | None:
    """The ProxyStrategy an episode manager runs its episodes with, or None (the built-in loop, or a
    manager of another kind, such as the Ray backend's)."""
    strategy = getattr(manager, "strategy", None)
    return strategy if isinstance(strategy, ProxyStrategy) else None


class ProxyStrategy:
    """Runs episodes through an outside agent program (``agent.kind: proxy``), whose completions go
    through ``endpoint`` (the run's recording endpoint, shared with its :meth:`sibling`)."""

    def __init__(self, cfg: AgentConfig, endpoint: ProxyEndpoint, *, jail: SandboxedCommand | None = None) -> None:
        self.cfg = cfg
        self.endpoint = endpoint
        self.counts: Counter = Counter()
        self._taken: Counter = Counter()
        self._fn = load_callable(cfg.callable) if cfg.callable else None
        # agent.command with agent.isolation=sandbox: its sandbox, built once for the run
        if jail is None and cfg.command and cfg.isolation == "sandbox":
            jail = SandboxedCommand(cfg.command, files=cfg.files)
        self.jail = jail

    def sibling(self) -> ProxyStrategy:
        """A strategy of the same agent program through the same endpoint, with its own counters (the
        held-out eval's: its episodes are not counted with the training ones)."""
        other = ProxyStrategy(self.cfg, self.endpoint, jail=self.jail)
        other._fn = self._fn
        return other

    def isolation_line(self) -> str | None:
        """The line the run prints at start about where ``agent.command`` runs (None for a callable)."""
        if self.jail is not None:
            return self.jail.isolation_line()
        if self.cfg.command:
            return (
                "agent: agent.command runs on the host with your user's rights (agent.isolation=host: "
                "for trusted programs only)"
            )
        return None

    def totals(self) -> dict[str, int]:
        """The counters since this strategy was built: ``episodes``, ``requests`` (completions served),
        ``split_trajectories`` (segments closed by a history rewrite), ``delta_prompts`` (prompts built
        from render deltas), ``program_crashes`` (non-zero exit, raised, or no request made),
        ``program_timeouts`` (past ``agent.timeout_s``), ``budget_stops`` (ended by ``max_turns`` or
        ``max_context``), ``unfinished`` (the env did not end the episode on the final text),
        ``no_reward`` (no reward in the program's result)."""
        return {k: self.counts[k] for k in COUNTERS}

    def take_step(self) -> dict[str, int]:
        """The counters' increase since the last ``take_step`` (a training step's row)."""
        now = Counter({k: self.counts[k] for k in COUNTERS})
        step = {k: now[k] - self._taken[k] for k in COUNTERS}
        self._taken = now
        return step

    async def close(self) -> None:
        """Stop the endpoint (idempotent; every strategy sharing it loses it)."""
        await self.endpoint.close()
        if self.jail is not None:
            await self.jail.aclose()

    async def run(self, manager: Any, spec: Any, traj: Trajectory, state: dict) -> None:
        rc = manager.cfg
        try:
            env = state["env"] = manager.env_factory()
            _, info = await _env_call(env, "reset", seed=spec.task_seed, options=spec.options)
        except Exception as e:
            raise EnvError(f"env reset failed: {type(e).__name__}: {e}") from e
        traj.task = info.get("task", {})
        try:
            workspace = Workspace.of(info)
        except ValueError as e:
            raise EnvError(f"env reset asked for a malformed workspace: {e}") from e
        if workspace is not None and self.cfg.reward == "env" and not hasattr(_unwrapped(env), "check_workspace"):
            raise EnvError(
                f"{type(_unwrapped(env)).__name__} asks for a workspace but has no check_workspace(files) to "
                "score it with (agent.reward=env)"
            )
        url = await self.endpoint.start(manager.engine, manager.tokenizer)
        own_stop = getattr(env, "stop_strings", None) or ()
        budget = Budget(
            rc.max_turns,
            rc.max_new_tokens,
            rc.max_context,
            rc.min_turn_tokens,
            rc.temperature,
            rc.top_p,
            rc.top_k,
            tuple(dict.fromkeys([*rc.stop, *own_stop])),
            rc.turn_timeout_s,
        )
        link = EpisodeLink(traj.episode_id, manager.tokenizer, budget, seed=spec.sampling_seed)
        key = "sk-agentrl-" + secrets.token_urlsafe(24)
        task = {
            "messages": info["messages"],
            "tools": info.get("tools") or None,
            "task": traj.task,
            "episode_id": traj.episode_id,
        }
        self.endpoint.links[key] = link
        self.counts["episodes"] += 1
        try:
            if self._fn is not None:
                res = await run_callable(self._fn, url, key, task, self.cfg.timeout_s, workspace)
            elif self.jail is not None:
                res = await self.jail.run(url, key, task, self.cfg.timeout_s, _tool_limits(env), workspace)
            else:
                res = await run_command(self.cfg.command, url, key, task, self.cfg.timeout_s, workspace)
        finally:
            self.endpoint.links.pop(key, None)
            rec = link.recorder
            state["ep"] = rec.current
            state["earlier"] = rec.segments[:-1]
            self.counts["requests"] += rec.requests
            self.counts["split_trajectories"] += link.splits
            self.counts["delta_prompts"] += link.delta_prompts
        traj.info["agent"] = {
            "requests": rec.requests,
            "segments": len(rec.segments),
            "splits": link.splits,
            "stderr_tail": res.stderr[-600:],
            "result": res.result,
        }
        await self._finish(traj, env, link, res, rc.score_truncated, workspace=workspace is not None)
        rec.set_reward(traj.reward)

    async def _finish(
        self, traj: Trajectory, env: Any, link: EpisodeLink, res: Any, score_truncated: bool, workspace: bool = False
    ) -> None:
        """Type the outcome and set the reward (see the module docstring)."""
        traj.reward = 0.0
        if res.timed_out:
            self.counts["program_timeouts"] += 1
            return _end(traj, Outcome.DEADLINE, res.error)
        if link.stopped:
            self.counts["budget_stops"] += 1
            return _end(traj, Outcome(link.stopped[0]), link.stopped[1])
        if res.error:
            self.counts["program_crashes"] += 1
            return _end(traj, Outcome.ENV_ERROR, res.error)
        if not link.recorder.requests:
            self.counts["program_crashes"] += 1
            return _end(traj, Outcome.ENV_ERROR, "the agent program made no completion request")
        last = link.recorder.current.turns[-1]
        if last.finish_reason != "stop":
            if score_truncated and self.cfg.reward == "env" and workspace:  # rollout.score_truncated
                reward, reason = await _unwrapped(env).check_workspace(res.files)
                traj.reward, traj.info.setdefault("agent", {})["check"] = float(reward), reason
            elif score_truncated and self.cfg.reward == "env":  # rollout.score_truncated, as in the built-in loop
                _, reward, terminated, _, info = await _env_call(env, "step", link.last_text)
                traj.reward = float(reward) if terminated else 0.0
                if terminated:
                    add_reward_components(traj, info)
            return _end(traj, Outcome.TRUNCATED_LENGTH, f"the last reply ended with {last.finish_reason!r}")
        if self.cfg.reward == "program":
            reward = reward_of(res.result)
            if reward is None:
                self.counts["no_reward"] += 1
                return _end(
                    traj,
                    Outcome.REWARD_ERROR,
                    "the agent program reported no reward (a JSON object with a "
                    f"numeric 'reward' in AGENTRL_RESULT or on stdout); got {json.dumps(res.result)[:200]}",
                )
        elif workspace:  # the env scores the files the program left
            reward, reason = await _unwrapped(env).check_workspace(res.files)
            traj.info.setdefault("agent", {})["check"] = reason
        else:
            _, reward, terminated, _, info = await _env_call(env, "step", link.last_text)
            if terminated:
                add_reward_components(traj, info)
            if not terminated:  # the program gave up first: a model that never answered, as at max_turns
                self.counts["unfinished"] += 1
                return _end(
                    traj,
                    Outcome.TRUNCATED_TURNS,
                    "the agent program ended before the env ended the episode on its final assistant text "
                    "(the last reply called a tool?): reward 0",
                )
        traj.reward = float(reward)
        _end(traj, Outcome.OK, "")


def _unwrapped(env: Any) -> Any:
    return getattr(env, "unwrapped", env)


def _tool_limits(env: Any) -> Limits:
    """The limits of the env's tool calls (its sandbox's), else the defaults."""
    limits = getattr(getattr(_unwrapped(env), "sandbox", None), "limits", None)
    return limits if isinstance(limits, Limits) else Limits()


def _end(traj: Trajectory, outcome: Outcome, detail: str | None) -> None:
    traj.outcome, traj.outcome_detail = outcome, detail or ""
