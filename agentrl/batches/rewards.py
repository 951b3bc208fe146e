"""The rewards credit assignment sees: the env's per-turn rewards plus the run's shaping terms.

Owns ``RewardShaping`` (what a run adds: DAPO's soft overlong punishment, the KL penalty in the
reward of REINFORCE++ and PPO-style RLHF) and ``shaped_turn_rewards``, which applies it to a list
of trajectories before any advantage estimator or credit mode runs (``agentrl.batches.samples``).
Per turn k of an episode::

    r'_k = r_k + overlong_penalty(sampled tokens of turn k)  -  kl_coef * sum_{t in turn k} KL_t

where ``KL_t`` is ``algos.KL_ESTIMATORS[kl_estimator](behaviour logprob_t, reference logprob_t)``
over the turn's sampled tokens (the behaviour logprobs are the sampling policy's, recorded by the
engine; the reference logprobs come from the trainer's frozen reference model). Outcome credit
sums the shaped turns into the episode return. ``RewardShaping`` also says how outcome credit
combines an episode's named reward components (``reward_normalization``: ``sum`` of the return, or
``gdpo``, each component normalised in its group, weighted by ``reward_weights``;
``agentrl.batches.samples.reward_components``). The maths is in ``agentrl.algos``; which values a
run uses is chosen by ``agentrl.config.plan``. Does not run models: the caller passes the
reference logprobs (or a function computing them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from agentrl import algos
from agentrl.trajectory import Trajectory

__all__ = ["KLController", "RewardShaping", "shaped_turn_rewards"]


@dataclass(frozen=True)
class RewardShaping:
    """``overlong_cache_len`` null: no overlong term (else the soft zone's tokens before
    ``max_new_tokens``, penalty ``-overlong_factor`` at the limit); ``kl_coef`` 0: no KL term.
    ``reward_normalization`` ``sum``: outcome credit's estimator sees the episode return;
    ``gdpo``: each named component is normalised in its group and weighted by ``reward_weights``
    (a name not listed: 1)."""

    max_new_tokens: int = 0
    overlong_cache_len: int | None = None
    overlong_factor: float = 1.0
    kl_coef: float = 0.0
    kl_estimator: str = "k1"
    reward_normalization: str = "sum"
    reward_weights: Mapping[str, float] = field(default_factory=dict)

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0


@dataclass
class KLController:
    """The KL-in-reward coefficient of a run: ``value`` fixed, or with ``target`` set moved after
    each step by ``algos.adaptive_kl_coef`` (the run checkpoints ``value``)."""

    value: float
    target: float | None = None
    horizon: int = 10000

    def update(self, kl: float | None, n: int) -> float:
        """After a step whose mean per-episode KL was ``kl`` over ``n`` samples; the new value."""
        if self.target is not None and kl is not None and n > 0:
            self.value = algos.adaptive_kl_coef(self.value, kl, self.target, horizon=self.horizon, n=n)
        return self.value


def _turn_lengths(t: Trajectory) -> list[int]:
    n = [0] * len(t.turns)
    for k, m in zip(t.turn_ids, t.loss_mask):
        if m and 0 <= k < len(n):
            n[k] += 1
    return n


def shaped_turn_rewards(
    trajs: Sequence[Trajectory],
    shaping: RewardShaping | None = None,
    ref_logprobs: Sequence[Sequence[float]] | Callable[[list[Trajectory]], list[list[float]]] | None = None,
) -> tuple[list[list[float]], dict[str, float]]:
    """Per-turn rewards of each trajectory with ``shaping`` applied, and stats: ``overlong/*``
    (mean penalty per episode, fraction of turns penalised) and ``kl_in_reward/*`` (the mean over
    episodes of the summed per-token KL, and the coefficient). A trajectory without turns keeps
    its episode reward as one turn. ``ref_logprobs``: per-token reference logprobs aligned with
    each trajectory's ``token_ids`` (or a function of the trajectories giving them); required
    when ``shaping.kl_coef > 0``."""
    trajs = list(trajs)
    rewards = [list(map(float, t.turn_rewards)) if t.turns else [float(t.reward)] for t in trajs]
    s = shaping or RewardShaping()
    stats: dict[str, float] = {}
    if s.overlong_cache_len is not None and trajs:
        pens, hit, turns = [], 0, 0
        for t, r in zip(trajs, rewards):
            if not t.turns:
                pens.append(0.0)
                continue
            p = algos.overlong_penalty(
                _turn_lengths(t), s.max_new_tokens, s.overlong_cache_len, factor=s.overlong_factor
            ).tolist()
            for k, pk in enumerate(p):
                r[k] += pk
            pens.append(float(sum(p)))
            hit += sum(1 for pk in p if pk < 0)
            turns += len(p)
        stats.update(
            {
                "overlong/penalty_mean": sum(pens) / len(pens),
                "overlong/penalised_turn_frac": hit / turns if turns else 0.0,
            }
        )
    if s.kl_coef > 0 and trajs:
        if ref_logprobs is None:
            raise ValueError("shaped_turn_rewards: kl_coef > 0 needs the reference logprobs")
        ref = ref_logprobs(trajs) if callable(ref_logprobs) else ref_logprobs
        if len(ref) != len(trajs):
            raise ValueError(f"shaped_turn_rewards: {len(ref)} reference rows for {len(trajs)} trajectories")
        est = algos.lookup("kl", s.kl_estimator)
        kls = [
            est(torch.tensor(t.logprobs, dtype=torch.float64), torch.tensor(list(rr), dtype=torch.float64)).tolist()
            for t, rr in zip(trajs, ref)
        ]
        with_turns = [i for i, t in enumerate(trajs) if t.turns]
        shaped = algos.apply_kl_in_reward(
            [rewards[i] for i in with_turns],
            [kls[i] for i in with_turns],
            [trajs[i].turn_ids for i in with_turns],
            [trajs[i].loss_mask for i in with_turns],
            beta=s.kl_coef,
        )
        for i, row in zip(with_turns, shaped):
            rewards[i] = row
        seq_kl = [sum(x for x, m in zip(kls[i], trajs[i].loss_mask) if m) for i in with_turns]
        stats.update(
            {"kl_in_reward/kl_mean": sum(seq_kl) / len(seq_kl) if seq_kl else 0.0, "kl_in_reward/coef": s.kl_coef}
        )
    return rewards, stats
