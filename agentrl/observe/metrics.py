"""Rollout metrics as the logging side sees them: the names of ``agentrl.episodes.summary``.

The definitions (solved, rates, reward and tool use, the per-step and eval rows, the running
``RolloutMetrics``) live in ``agentrl.episodes.summary``, where the episode manager, the run loop,
``agentrl rollout`` and ``agentrl eval`` all take them from; this module re-exports them for the
sinks, reports and callers that import them from here. Owns nothing else.
"""

from agentrl.episodes.summary import (
    EVAL_KEYS,
    End,
    RolloutMetrics,
    end_of,
    episode_rates,
    episode_return,
    eval_stats,
    is_solved,
    rates,
    rates_of,
    rollout_stats,
    summarize,
)

__all__ = [
    "EVAL_KEYS",
    "End",
    "RolloutMetrics",
    "end_of",
    "episode_rates",
    "episode_return",
    "eval_stats",
    "is_solved",
    "rates",
    "rates_of",
    "rollout_stats",
    "summarize",
]
