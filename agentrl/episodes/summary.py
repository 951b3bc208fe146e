"""The one episode summary: what "solved", "reward", "tool use" and each outcome mean, over many episodes.

Owns the definitions every job shares - ``agentrl run`` (per step and held-out eval),
``agentrl rollout``, the episode manager's running metrics and ``agentrl eval`` (API models):

* an episode ``End`` (outcome, terminal reward, return, turns, tool calls; ``end_of`` reads one
  from a Trajectory, ``agentrl.jobs.eval`` builds one from an API episode);
* solved = a trainable outcome with reward > 0 (``is_solved``); solve and infrastructure-failure
  rates count every episode, an infrastructure failure being an unsolved task (``rates``);
* ``reward_mean`` = the mean return (``episode_return``: the sum of the turn rewards, the number
  the advantages are made of) and ``tool_use_rate`` = the fraction with at least one tool call,
  both over the trainable episodes only (``summarize``);
* the per-step row of a training step (``rollout_stats``) and of an eval (``eval_stats``), and the
  running aggregate the episode manager feeds with each finished trajectory (``RolloutMetrics``).

Does not write files or draw tables' surroundings (callers do); ``agentrl.observe.metrics``
re-exports these names for the logging side.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agentrl.trajectory import Outcome, Trajectory


class End(NamedTuple):
    """How one episode ended, as the summary sees it."""

    outcome: Outcome | str
    reward: float  # the terminal reward: decides solved
    ret: float  # the return (sum of turn rewards): averaged as reward_mean
    turns: int = 0
    tool_calls: int = 0


def episode_return(t: Trajectory) -> float:
    """Sum of the turn rewards (the terminal reward is the last turn's)."""
    return float(sum(t.turn_rewards)) if t.turns else float(t.reward)


def end_of(t: Trajectory) -> End:
    return End(t.outcome, t.reward, episode_return(t), t.num_turns, t.info.get("tool_stats", {}).get("calls", 0))


def is_solved(outcome: Outcome | str, reward: float) -> bool:
    """Solved = a trainable outcome with reward > 0 (an infrastructure failure never is)."""
    return Outcome(outcome).trainable and reward > 0


def rates(episodes: int, solved: int, infra_failures: int) -> dict[str, float]:
    """``solve_rate`` and ``infra_failure_rate`` over every episode (0.0 when there are none), with
    their counts: ``episodes`` (the denominator), ``infra_failures``."""
    return {
        "episodes": episodes,
        "solve_rate": solved / episodes if episodes else 0.0,
        "infra_failures": infra_failures,
        "infra_failure_rate": infra_failures / episodes if episodes else 0.0,
    }


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


def summarize(ends: Iterable[End]) -> dict[str, Any]:
    """:func:`rates` over every episode, ``outcomes`` (count per outcome name), ``turns_mean`` over
    every episode, and ``reward_mean`` / ``tool_use_rate`` over the trainable ones - left out when
    there are none (a gap in a curve, not a 0; a table may show 0)."""
    ends = list(ends)
    ok = [e for e in ends if Outcome(e.outcome).trainable]
    out: dict[str, Any] = {
        **episode_rates((e.outcome, e.reward) for e in ends),
        "outcomes": dict(Counter(Outcome(e.outcome).value for e in ends)),
        "turns_mean": sum(e.turns for e in ends) / len(ends) if ends else 0.0,
    }
    if ok:
        out["reward_mean"] = sum(e.ret for e in ok) / len(ok)
        out["tool_use_rate"] = sum(e.tool_calls > 0 for e in ok) / len(ok)
    return out


def rollout_stats(groups: list[list[Trajectory]]) -> dict[str, float]:
    """One training step's rollout row (``rollout/...`` in metrics.jsonl): :func:`summarize` without
    the outcome counts, plus ``sampled_tokens``."""
    trajs = [t for g in groups for t in g]
    s = summarize(end_of(t) for t in trajs)
    s.pop("outcomes")
    front = {k: s.pop(k) for k in ("episodes", "solve_rate", "infra_failures", "infra_failure_rate", "turns_mean")}
    return {**front, "sampled_tokens": float(sum(t.num_sampled for t in trajs)), **s}


EVAL_KEYS = ("solve_rate", "infra_failure_rate", "infra_failures", "episodes", "tool_use_rate", "turns_mean")


def eval_stats(trajs: list[Trajectory]) -> dict[str, float]:
    """A held-out eval's row (``eval/...``): the :data:`EVAL_KEYS` of :func:`summarize` (every task
    in the denominator of its solve rate) and ``outcome/<name>`` counts."""
    s = summarize(end_of(t) for t in trajs)
    return {
        **{k: s[k] for k in EVAL_KEYS if k in s},
        **{f"outcome/{k}": float(v) for k, v in sorted(s["outcomes"].items())},
    }


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


@dataclass
class RolloutMetrics:
    """The running aggregate of finished trajectories (``add``), with the same definitions as
    :func:`summarize`, latencies and throughput (``summary``) and a rich table (``table``)."""

    started: float = field(default_factory=time.perf_counter)
    outcomes: Counter = field(default_factory=Counter)
    tool: Counter = field(default_factory=Counter)
    episodes: int = 0
    turns: int = 0
    sampled_tokens: int = 0
    obs_tokens: int = 0
    prompt_tokens: int = 0
    rewards: list[float] = field(default_factory=list)  # returns of trainable episodes
    solved: int = 0
    tool_users: int = 0  # trainable episodes with at least one tool call
    turns_per_episode: list[int] = field(default_factory=list)
    gen_s: list[float] = field(default_factory=list)  # per turn
    env_s: list[float] = field(default_factory=list)  # per turn
    episode_s: list[float] = field(default_factory=list)
    keep_samples: int = 100_000  # latency lists are capped so 16k-episode runs stay bounded

    def add(self, t: Trajectory) -> None:
        e = end_of(t)
        self.episodes += 1
        self.outcomes[Outcome(e.outcome).value] += 1
        self.turns += e.turns
        self.turns_per_episode.append(e.turns)
        self.prompt_tokens += t.prompt_len
        self.sampled_tokens += t.num_sampled
        self.obs_tokens += len(t.token_ids) - t.prompt_len - t.num_sampled
        if Outcome(e.outcome).trainable:
            self.rewards.append(e.ret)
            self.tool_users += e.tool_calls > 0
        self.solved += is_solved(e.outcome, e.reward)
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
            "tool_use_rate": self.tool_users / trainable if trainable else 0.0,  # as summarize's
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
