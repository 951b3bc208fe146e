"""Rollout metrics: outcomes by type, solve and infrastructure-failure rates, turns, tokens, latency,
tool-call errors.

Owns the one definition of the solve rate (:func:`episode_rates`: every episode counts, an
infrastructure failure is an unsolved task) that ``agentrl run`` (per step and held-out eval),
``agentrl rollout`` and ``agentrl eval`` all use; the per-step statistics of a training step
(:func:`rollout_stats`) and of an eval (:func:`eval_stats`); and the running aggregate that the
episode manager feeds with each finished trajectory, with its summary dict / rich table. Does not
write files (the caller does).
"""
from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from agentrl.trajectory import Outcome, Trajectory


def is_solved(outcome: Outcome | str, reward: float) -> bool:
    """Solved = a trainable outcome with reward > 0 (an infrastructure failure never is)."""
    return Outcome(outcome).trainable and reward > 0


def rates(episodes: int, solved: int, infra_failures: int) -> dict[str, float]:
    """``solve_rate`` and ``infra_failure_rate`` over every episode (0.0 when there are none), with
    their counts: ``episodes`` (the denominator), ``infra_failures``."""
    return {"episodes": episodes, "solve_rate": solved / episodes if episodes else 0.0,
            "infra_failures": infra_failures, "infra_failure_rate": infra_failures / episodes if episodes else 0.0}


def episode_rates(ended: Iterable[tuple[Outcome | str, float]]) -> dict[str, float]:
    """:func:`rates` of ``(outcome, reward)`` pairs, one per episode."""
    n = solved = infra = 0
    for outcome, reward in ended:
        n += 1
        solved += is_solved(outcome, reward)
        infra += not Outcome(outcome).trainable
    return rates(n, solved, infra)


def rates_of(trajs: Iterable[Trajectory]) -> dict[str, float]:
    """:func:`episode_rates` of trajectories."""
    return episode_rates((t.outcome, t.reward) for t in trajs)


def rollout_stats(groups: list[list[Trajectory]]) -> dict[str, float]:
    """One training step's rollout row (``rollout/...`` in metrics.jsonl): :func:`rates` over every
    episode; ``reward_mean`` (the return the advantages are made of) and ``tool_use_rate`` over the
    trainable episodes only, and left out when there are none (a gap in the curves, not a 0)."""
    from agentrl.batches.samples import episode_return  # here: it imports torch, this module must not

    trajs = [t for g in groups for t in g]
    ok = [t for t in trajs if t.trainable]
    out: dict[str, float] = {**rates_of(trajs),
                             "turns_mean": sum(t.num_turns for t in trajs) / len(trajs) if trajs else 0.0,
                             "sampled_tokens": float(sum(t.num_sampled for t in trajs))}
    if ok:
        out["reward_mean"] = sum(episode_return(t) for t in ok) / len(ok)
        out["tool_use_rate"] = sum(t.info.get("tool_stats", {}).get("calls", 0) > 0 for t in ok) / len(ok)
    return out


EVAL_KEYS = ("solve_rate", "infra_failure_rate", "infra_failures", "episodes", "tool_use_rate", "turns_mean")


def eval_stats(trajs: list[Trajectory]) -> dict[str, float]:
    """A held-out eval's row (``eval/...``): the :data:`EVAL_KEYS` of :func:`rollout_stats` (every
    task in the denominator of its solve rate) and ``outcome/<name>`` counts."""
    s = rollout_stats([trajs])
    outcomes = Counter(Outcome(t.outcome).value for t in trajs)
    return {**{k: s[k] for k in EVAL_KEYS if k in s}, **{f"outcome/{k}": float(v) for k, v in sorted(outcomes.items())}}


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


@dataclass
class RolloutMetrics:
    started: float = field(default_factory=time.perf_counter)
    outcomes: Counter = field(default_factory=Counter)
    tool: Counter = field(default_factory=Counter)
    episodes: int = 0
    turns: int = 0
    sampled_tokens: int = 0
    obs_tokens: int = 0
    prompt_tokens: int = 0
    rewards: list[float] = field(default_factory=list)  # of trainable episodes
    solved: int = 0
    turns_per_episode: list[int] = field(default_factory=list)
    gen_s: list[float] = field(default_factory=list)  # per turn
    env_s: list[float] = field(default_factory=list)  # per turn
    episode_s: list[float] = field(default_factory=list)
    keep_samples: int = 100_000  # latency lists are capped so 16k-episode runs stay bounded

    def add(self, t: Trajectory) -> None:
        self.episodes += 1
        self.outcomes[Outcome(t.outcome).value] += 1
        self.turns += t.num_turns
        self.turns_per_episode.append(t.num_turns)
        self.prompt_tokens += t.prompt_len
        self.sampled_tokens += t.num_sampled
        self.obs_tokens += len(t.token_ids) - t.prompt_len - t.num_sampled
        if t.trainable:
            self.rewards.append(t.reward)
        self.solved += is_solved(t.outcome, t.reward)
        for k, v in t.info.get("tool_stats", {}).items():
            self.tool[k] += v
        if Outcome(t.outcome) is Outcome.TOOL_TIMEOUT:
            # the episode ended inside the call that timed out, so the env never returned that turn's
            # tool_stats: count the call here, or tool.timeouts would read 0 beside outcomes.tool_timeout
            self.tool["timeouts"] += 1
        if len(self.gen_s) < self.keep_samples:
            self.gen_s.extend(r.gen_s for r in t.turns)
            self.env_s.extend(r.env_s for r in t.turns)
        self.episode_s.append(t.wall_s)

    def summary(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.started
        n = max(self.episodes, 1)
        trainable = sum(v for k, v in self.outcomes.items() if Outcome(k).trainable)
        return {
            **rates(self.episodes, self.solved, self.episodes - trainable),
            "outcomes": dict(self.outcomes),
            "trainable": trainable,
            "reward_mean": statistics.fmean(self.rewards) if self.rewards else 0.0,  # trainable episodes only
            "turns_mean": self.turns / n,
            "turns_max": max(self.turns_per_episode, default=0),
            "sampled_tokens": self.sampled_tokens,
            "obs_tokens": self.obs_tokens,
            "prompt_tokens": self.prompt_tokens,
            "tool": dict(self.tool),
            "gen_s_p50": _pct(self.gen_s, 0.5),
            "gen_s_p99": _pct(self.gen_s, 0.99),
            "env_s_p50": _pct(self.env_s, 0.5),
            "env_s_p99": _pct(self.env_s, 0.99),
            "episode_s_p50": _pct(self.episode_s, 0.5),
            "wall_s": wall,
            "turns_per_s": self.turns / wall if wall > 0 else 0.0,
            "sampled_tokens_per_s": self.sampled_tokens / wall if wall > 0 else 0.0,
        }

    def table(self, title: str = "rollout summary"):
        from rich.table import Table

        s = self.summary()
        tab = Table(title=title, show_header=True)
        tab.add_column("metric")
        tab.add_column("value", justify="right")
        for k, v in s.items():
            if isinstance(v, dict):
                v = ", ".join(f"{a}={b}" for a, b in sorted(v.items())) or "-"
            elif isinstance(v, float):
                v = f"{v:.4g}"
            tab.add_row(k, str(v))
        return tab
