"""From finished trajectory groups to trainer samples: rewards -> credit -> per-token advantages.

Owns the algorithm presets (which estimator, credit mode, aggregation and critic each ``--algo``
means), filtering out trajectories that must not be trained on (infrastructure failures), and
building ``TrainSample``s with per-token advantages (and critic targets for turn-level GAE).
The maths lives in ``agentrl.algos``; the trainer never sees an algorithm name, and what a null
trainer field means for a run is chosen by ``agentrl.config.plan``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from agentrl import algos
from agentrl.episodes.summary import episode_return
from agentrl.errors import ConfigError
from agentrl.trajectory import Trajectory


@dataclass(frozen=True)
class AlgoPreset:
    advantage: str  # key of algos.ADVANTAGES, or "gae" (critic)
    credit: str  # key of algos.CREDIT
    aggregation: str  # key of algos.AGGREGATIONS
    critic: bool


ALGOS: dict[str, AlgoPreset] = {
    "grpo": AlgoPreset("grpo", "outcome", "seq-mean-token-mean", False),  # as in the GRPO paper
    "dr_grpo": AlgoPreset("dr_grpo", "outcome", "seq-mean-token-sum-norm", False),
    "rloo": AlgoPreset("rloo", "outcome", "token-mean", False),
    "reinforce_pp": AlgoPreset("reinforce_pp", "outcome", "token-mean", False),
    "ppo": AlgoPreset("gae", "turn_gae", "token-mean", True),
}


def trainable(groups: Sequence[Sequence[Trajectory]]) -> tuple[list[Trajectory], int]:
    """Trajectories that may be trained on, and how many were excluded (infra failures, nothing sampled)."""
    keep, excluded = [], 0
    for g in groups:
        for t in g:
            if t.trainable and t.num_sampled > 0:
                keep.append(t)
            else:
                excluded += 1
    return keep, excluded


def token_advantages(trajs: list[Trajectory], advantage: str, credit: str, *, gamma: float = 1.0,
                     lam: float = 0.95, values_fn: Callable[[list[Trajectory]], list[list[float]]] | None = None,
                     omega: float = 1.0, credit_stats: dict | None = None
                     ) -> tuple[list[list[float]], list[list[float]] | None, list[list[int]] | None]:
    """Per-token advantages for ``trajs``; for ``turn_gae`` also per-token critic targets and the mask
    of boundary tokens where the critic is trained. ``gigpo``'s episode level follows ``advantage``
    (``grpo``: std-normalised, ``dr_grpo``: not); ``credit_stats`` receives its anchor-group counts."""
    masks = [t.loss_mask for t in trajs]
    groups = [t.group_id for t in trajs]
    if credit == "outcome":
        rewards = torch.tensor([episode_return(t) for t in trajs], dtype=torch.float64)
        seq_adv = algos.ADVANTAGES[advantage](rewards, algos.group_index(groups))
        return algos.CREDIT["outcome"](seq_adv, masks), None, None
    turn_rewards = [t.turn_rewards for t in trajs]
    turn_ids = [t.turn_ids for t in trajs]
    if credit == "turn_return":
        return algos.CREDIT["turn_return"](turn_rewards, turn_ids, masks, groups, gamma=gamma), None, None
    if credit == "gigpo":
        if advantage not in ("grpo", "dr_grpo"):
            raise ConfigError(f"algo.credit=gigpo needs an algo whose advantage is grpo or dr_grpo, got {advantage!r}")
        keys = [[r.state_key for r in t.turns] for t in trajs]
        return algos.CREDIT["gigpo"](turn_rewards, turn_ids, masks, groups, keys, omega=omega, gamma=gamma,
                                     normalize_std=advantage == "grpo", stats=credit_stats), None, None
    if credit == "turn_gae":
        if values_fn is None:
            raise ValueError("credit 'turn_gae' needs a critic (values_fn)")
        values = values_fn(trajs)
        # values[t] is V(state before token t) (Trainer.values); turn_boundaries gives the token just
        # before turn k's first sampled token, so V(state before turn k) sits one position later.
        bounds = [[b + 1 for b in algos.turn_boundaries(t.turn_ids, t.loss_mask)] for t in trajs]
        bvals = [[v[i] for i in b] for v, b in zip(values, bounds)]
        adv, turn_targets = algos.CREDIT["turn_gae"](turn_rewards, turn_ids, masks, bvals, gamma=gamma, lam=lam)
        returns, vmask = [], []
        for t, b, tt in zip(trajs, bounds, turn_targets):
            r, m = [0.0] * len(t.token_ids), [0] * len(t.token_ids)
            for k, i in enumerate(b):
                r[i], m[i] = float(tt[k]), 1
            returns.append(r)
            vmask.append(m)
        return adv, returns, vmask
    raise ValueError(f"unknown credit mode {credit!r}; choose from {sorted(algos.CREDIT)}")


def build_samples(groups: Sequence[Sequence[Trajectory]], preset: AlgoPreset, *, credit: str | None = None,
                  gamma: float = 1.0, lam: float = 0.95, values_fn=None, omega: float = 1.0):
    """TrainSamples for one optimizer step, plus stats (excluded count, advantage spread)."""
    from agentrl.trainer import TrainSample

    trajs, excluded = trainable(groups)
    if not trajs:
        return [], {"excluded": excluded, "samples": 0}
    cstats: dict = {}
    adv, returns, vmask = token_advantages(trajs, preset.advantage, credit or preset.credit, gamma=gamma, lam=lam,
                                           values_fn=values_fn, omega=omega, credit_stats=cstats)
    samples = []
    for i, t in enumerate(trajs):
        samples.append(TrainSample(token_ids=t.token_ids, loss_mask=t.loss_mask, behaviour_logprobs=t.logprobs,
                                   advantages=[float(a) for a in adv[i]],
                                   returns=returns[i] if returns else None,
                                   value_mask=vmask[i] if vmask else None))
    flat = [a for row, t in zip(adv, trajs) for a, m in zip(row, t.loss_mask) if m]
    nonzero = sum(1 for a in flat if abs(a) > 1e-9)
    return samples, {"excluded": excluded, "samples": len(samples),
                     "adv_nonzero_frac": nonzero / len(flat) if flat else 0.0, **cstats}
