"""The ``rollout:`` section of the run config: how the episode manager runs episodes.

Owns the RolloutConfig dataclass (every field documented with ``doc()``), kept beside its user
(``agentrl.episodes.manager``) so that the manager needs nothing from the config tree; the tree
(``agentrl.config.schema``) re-exports it. Does not run episodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.common.fields import doc
from agentrl.errors import ConfigError


@dataclass
class RolloutConfig:
    num_prompts: int = doc(8, "Prompts (tasks) per rollout call; each is sampled group_size times.", min=1)
    group_size: int = doc(8, "Samples per prompt (G); a group shares one task.", min=1)
    max_turns: int = doc(8, "Assistant turns per episode before it ends as truncated_turns.", min=1)
    max_new_tokens: int = doc(256, "Most tokens sampled in one assistant turn.", min=1)
    max_context: int = doc(4096, "Token budget of a whole episode (prompt + all turns).", min=8)
    min_turn_tokens: int = doc(8, "A turn starts only if this many tokens still fit; else context_overflow.", min=1)
    score_truncated: bool = doc(
        False,
        "Still hand a turn cut at its token limit to env.step and keep its reward (outcome stays truncated_length); "
        "proxy agents: with agent.reward=env, their last reply.",
    )
    max_obs_chars: int = doc(4000, "Cap on each observation message's characters before rendering.", min=1)
    temperature: float = doc(1.0, "Sampling temperature (0 = greedy).", min=0.0)
    top_p: float = doc(1.0, "Nucleus sampling threshold in (0, 1].", min=0.0, max=1.0)
    top_k: int = doc(0, "Top-k filter (0 = off).", min=0)
    stop: list = doc(
        [],
        "Stop strings: a turn ends (kept whole, as sampled) once its text contains one; added to the "
        "env's own `stop_strings` (e.g. ['</answer>']).",
    )
    turn_timeout_s: float = doc(300.0, "Deadline for one turn's generation, and separately its env step.", min=0.001)
    episode_timeout_s: float = doc(3600.0, "Deadline for a whole episode (outcome 'deadline').", min=0.001)
    max_concurrency: int = doc(256, "Episodes in flight at once.", min=1)
    seed: int = doc(0, "Seeds task selection and per-episode sampling.")
    partial_rollouts: bool = doc(
        True,
        "Weight updates interrupt in-flight generations, swap weights and let them resume (a turn may "
        "hold tokens of two versions; the staleness bound uses the oldest). false: an update first drains "
        "(new generations wait, running ones finish) so every turn comes from one version, at the cost of "
        "waiting for the longest turn in flight.",
    )

    def __post_init__(self) -> None:
        bad = [s for s in self.stop if not isinstance(s, str) or not s]
        if bad:
            raise ConfigError(f"rollout.stop must hold non-empty strings, got {bad[0]!r} in {self.stop!r}")
