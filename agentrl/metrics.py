"""Rollout metrics: outcomes by type, turns, tokens, latency, tool-call errors.

Owns the running aggregate that the episode manager feeds with each finished trajectory and the
summary dict / rich table made from it. Does not write files (the caller does).
"""
from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agentrl.trajectory import Outcome, Trajectory


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
    rewards: list[float] = field(default_factory=list)
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
        for k, v in t.info.get("tool_stats", {}).items():
            self.tool[k] += v
        if len(self.gen_s) < self.keep_samples:
            self.gen_s.extend(r.gen_s for r in t.turns)
            self.env_s.extend(r.env_s for r in t.turns)
        self.episode_s.append(t.wall_s)

    def summary(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.started
        n = max(self.episodes, 1)
        return {
            "episodes": self.episodes,
            "outcomes": dict(self.outcomes),
            "trainable": sum(v for k, v in self.outcomes.items() if Outcome(k).trainable),
            "reward_mean": statistics.fmean(self.rewards) if self.rewards else 0.0,
            "solve_rate": (sum(r > 0 for r in self.rewards) / len(self.rewards)) if self.rewards else 0.0,
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
