"""Held-out evaluation of one ``agentrl run``: :class:`HeldOutEval`.

Owns: ``evaluate`` (``eval.num_tasks`` held-out tasks, one episode each at ``eval.temperature``, on
the eval env; the row every eval reports: every task in the solve rate's denominator,
infrastructure failures counted beside it) and ``due`` (``eval.every`` steps, except the last
step, whose eval is the final one). The run's loop calls it at the start (``first``: an eval where
every episode failed alike stops the run), every ``eval.every`` steps and at the end.

Who plays the eval episodes is who plays the training episodes: the built-in turn loop, or in
proxy mode (``agent.kind: proxy``) the run's agent program through the same recording endpoint
(the trained agent is the policy *and* its program: evaluating the policy in the built-in loop
would measure another agent, and an env scored by the program's own result, such as verifiers',
could not be scored at all). An agent that rewrote its history yields several trajectories per
episode; the eval counts each task once, by its episode's last trajectory (which carries the
episode's outcome and reward; a task with none is an infrastructure failure: :func:`per_task`), and
adds its agents' counters (``agent/...``) to the row. Does not decide what a failure is
(``agentrl.episodes.summary``), build the engine or the eval env (``agentrl.jobs.run.parts``) or
decide when an eval runs (``agentrl.jobs.run.loop``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentrl.episodes.manager import EpisodeManager
from agentrl.episodes.spec import EpisodeSpec
from agentrl.episodes.summary import eval_stats, is_solved
from agentrl.jobs.infra_stop import stop_if_all_failed
from agentrl.trajectory import Outcome, Trajectory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from agentrl.agents.strategy import ProxyStrategy
    from agentrl.config.schema import RunConfig
    from agentrl.engine.base import Engine

#: Task seeds of the held-out eval: far from the training stream's, the same in every eval of a run.
EVAL_SEED_BASE = 10_000_019


def eval_specs(n: int) -> list[EpisodeSpec]:
    """The ``n`` eval episodes: one per task, sampling seeded by the task's index."""
    return [EpisodeSpec(f"eval-{i}", 0, EVAL_SEED_BASE + i, sampling_seed=i) for i in range(n)]


def per_task(specs: list[EpisodeSpec], trajs: list[Trajectory], env_id: str) -> list[Trajectory]:
    """One trajectory per eval task, in the specs' order: its episode's last. The earlier segments of
    a split episode (``EpisodeManager.run_segments``, marked ``info["segment"]``) are left out; a task
    that got no trajectory back counts as an infrastructure failure (``env_error``, saying so), so the
    denominator is every task whatever happened."""
    last = {(t.group_id, t.sample_index): t for t in trajs if "segment" not in t.info}
    return [last.get((s.group_id, s.sample_index)) or _lost(s, env_id) for s in specs]


def _lost(spec: EpisodeSpec, env_id: str) -> Trajectory:
    return Trajectory(
        episode_id=f"{spec.group_id}-{spec.sample_index}",
        group_id=spec.group_id,
        env_id=env_id,
        prompt_len=0,
        sample_index=spec.sample_index,
        outcome=Outcome.ENV_ERROR,
        outcome_detail="the episode manager returned no trajectory for this task",
    )


class EvalProgress:
    """A line at a tenth of an eval's episodes (``eval: 150/500 episodes, 93 solved, 0 infra, 4.2 min``)
    once ``quiet_s`` have passed since the last line (or the start): on a real model an eval is tens of
    minutes, silent without it; a quick one says nothing. ``say``: where lines go."""

    def __init__(self, total: int, say: Callable[[str], None], quiet_s: float = 30.0) -> None:
        self.total, self.say, self.quiet_s = total, say, quiet_s
        self.every = max(1, total // 10)
        self.done = self.solved = self.infra = 0
        self.t0 = self.last = time.perf_counter()

    def __call__(self, traj: Trajectory) -> None:
        if "segment" in traj.info:  # an earlier segment of a split episode: its task is not done yet
            return
        self.done += 1
        self.solved += is_solved(traj.outcome, traj.reward)
        self.infra += not Outcome(traj.outcome).trainable
        now = time.perf_counter()
        if self.done % self.every == 0 and self.done < self.total and now - self.last >= self.quiet_s:
            self.last, minutes = now, (now - self.t0) / 60
            self.say(
                f"eval: {self.done}/{self.total} episodes, {self.solved} solved, {self.infra} infra, {minutes:.1f} min"
            )


class HeldOutEval:
    """Held-out eval of one attempt of a run, on the run's ``engine`` with the eval env
    (``make_env``) and ``tokenizer``; ``proxy``: the training episodes' agent runner in proxy mode
    (the eval runs a sibling of it: same program and endpoint, own counters), or None. ``progress``:
    where a line every tenth of the episodes goes (:class:`EvalProgress`), or None."""

    def __init__(
        self,
        cfg: RunConfig,
        *,
        engine: Engine,
        make_env: Callable[..., Any],
        tokenizer: PreTrainedTokenizerBase,
        proxy: ProxyStrategy | None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg, self.engine, self.make_env, self.tokenizer, self.proxy = cfg, engine, make_env, tokenizer, proxy
        self.progress = progress

    async def evaluate(self, first: bool = False) -> dict[str, float]:
        ev = self.cfg.eval
        if ev.num_tasks <= 0:
            return {}
        rcfg = dataclasses.replace(self.cfg.rollout, temperature=ev.temperature, group_size=1)
        agent = self.proxy.sibling() if self.proxy is not None else None  # same program and endpoint, own counters
        mgr = EpisodeManager(self.engine, self.make_env, self.tokenizer, rcfg, env_id=self.cfg.env.id, strategy=agent)
        specs = eval_specs(ev.num_tasks)
        tick = EvalProgress(len(specs), self.progress) if self.progress is not None else None
        trajs = per_task(specs, await mgr.collect(specs, on_result=tick), self.cfg.env.id)
        if first:  # an eval where everything failed alike means nothing here can work: stop now
            stop_if_all_failed(trajs, "the first evaluation")
        stats = eval_stats(trajs)
        if agent is not None:
            stats.update({f"agent/{k}": v for k, v in agent.totals().items()})
        return stats

    def due(self, step: int) -> bool:
        """An eval after step ``step``: every ``eval.every`` steps, but not after the last (the final eval)."""
        every = self.cfg.eval.every
        return bool(every) and step % every == 0 and step < self.cfg.train.steps
