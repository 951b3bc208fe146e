"""From finished trajectory groups to trainer samples: rewards -> shaping -> credit -> per-token advantages.

Owns the algorithm presets (which estimator, credit mode, aggregation and critic each ``--algo``
means, the trainer settings it implies and the extras it turns on), filtering out trajectories
that must not be trained on (infrastructure failures), and building ``TrainSample``s with
per-token advantages (and critic targets for turn-level GAE) from the shaped per-turn rewards
(``agentrl.batches.rewards``: overlong punishment, KL in the reward), and, for GDPO, the named
reward components each episode is normalised on (``reward_components``). The maths lives in
``agentrl.algos``; the trainer never sees an algorithm name, and what a null field means for a run
(a preset's trainer settings and extras included) is chosen by ``agentrl.config.plan``.

Presets: advantage / credit / aggregation / critic, then what else each sets (trainer fields where
the user left them null, and the defaults of the null ``algo.*`` extras):

* ``grpo``:   grpo / outcome / seq-mean-token-mean / no
* ``dr_grpo``: dr_grpo / outcome / seq-mean-token-sum-norm / no
* ``rloo``:   rloo / outcome / token-mean / no
* ``reinforce_pp``: reinforce_pp / outcome / token-mean / no; KL in the reward (k1, 0.001)
* ``reinforce_pp_baseline``: reinforce_pp_baseline / outcome / token-mean / no
* ``ppo``:    gae / turn_gae / token-mean / critic; advantages whitened
* ``dapo``:   grpo / outcome / token-mean / no; ppo_clip with clip-higher (0.2 / 0.28), dynamic
  sampling, soft overlong punishment (cache max_new_tokens // 5)
* ``gspo``:   grpo / outcome / seq-mean-token-mean (required) / no; policy_loss gspo (3e-4 / 4e-4)
* ``cispo``:  grpo / outcome / token-mean / no; policy_loss cispo (no lower bound, 0.2 above)
* ``opd``:    none / outcome / token-mean / no; on-policy distillation from ``algo.teacher`` with
  ``algo.opd_coef`` 1: the advantage is 0, the teacher's per-token reverse KL is the whole signal
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl import algos
from agentrl.batches.rewards import RewardShaping, shaped_turn_rewards
from agentrl.errors import ConfigError
from agentrl.trainer import TrainSample
from agentrl.trajectory import Trajectory


@dataclass(frozen=True)
class AlgoPreset:
    """What an ``--algo`` name means. ``trainer``: trainer fields it sets where the user left them
    null; ``fixed_aggregation``: the aggregation is part of the algorithm (another is rejected);
    the rest are the defaults of the null ``algo.*`` fields of the same names."""

    advantage: str  # key of algos.ADVANTAGES, or "gae" (critic)
    credit: str  # key of algos.CREDIT
    aggregation: str  # key of algos.AGGREGATIONS
    critic: bool
    trainer: dict[str, Any] = field(default_factory=dict)
    fixed_aggregation: bool = False
    whiten_advantages: bool = False
    dynamic_sampling: bool = False
    overlong: bool = False  # overlong_cache_len null -> rollout.max_new_tokens // 5
    kl_in_reward: float = 0.0
    opd_coef: float = 0.0  # the on-policy distillation term's weight (algo.opd_coef null)


#: REINFORCE++'s KL-in-reward coefficient with the k1 estimator (the value veRL's REINFORCE++
#: examples use, ``kl_ctrl.kl_coef=0.001`` with ``kl_penalty=kl``).
REINFORCE_PP_KL = 0.001

ALGOS: dict[str, AlgoPreset] = {
    "grpo": AlgoPreset("grpo", "outcome", "seq-mean-token-mean", False),  # as in the GRPO paper
    "dr_grpo": AlgoPreset("dr_grpo", "outcome", "seq-mean-token-sum-norm", False),
    "rloo": AlgoPreset("rloo", "outcome", "token-mean", False),
    "reinforce_pp": AlgoPreset("reinforce_pp", "outcome", "token-mean", False, kl_in_reward=REINFORCE_PP_KL),
    "reinforce_pp_baseline": AlgoPreset("reinforce_pp_baseline", "outcome", "token-mean", False),
    "ppo": AlgoPreset("gae", "turn_gae", "token-mean", True, whiten_advantages=True),
    "dapo": AlgoPreset(
        "grpo",
        "outcome",
        "token-mean",
        False,
        trainer={"policy_loss": "ppo_clip", "clip_low": 0.2, "clip_high": 0.28},
        dynamic_sampling=True,
        overlong=True,
    ),
    "gspo": AlgoPreset(
        "grpo",
        "outcome",
        "seq-mean-token-mean",
        False,
        fixed_aggregation=True,
        trainer={"policy_loss": "gspo", "clip_low": 3e-4, "clip_high": 4e-4},
    ),
    "cispo": AlgoPreset(
        "grpo", "outcome", "token-mean", False, trainer={"policy_loss": "cispo", "clip_low": 1.0, "clip_high": 0.2}
    ),
    "opd": AlgoPreset("none", "outcome", "token-mean", False, opd_coef=1.0),
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


def has_signal(group: Sequence[Trajectory]) -> bool:
    """Dynamic sampling's test of a finished group (``StalenessQueue(keep=...)``): False when the
    episode returns of its trainable episodes are all equal, or only one is trainable
    (``algos.dynamic_sampling_keep``: no group baseline can tell them apart). The test is on the
    env's returns (DAPO filters on accuracy), not on shaping terms. A group with no trainable
    episode (infrastructure failures) passes, to be excluded and counted as usual."""
    trajs = [t for t in group if t.trainable and t.num_sampled > 0]
    if not trajs:
        return True
    rewards = torch.tensor([float(sum(r)) for r in shaped_turn_rewards(trajs)[0]], dtype=torch.float64)
    return bool(algos.dynamic_sampling_keep(rewards, [0] * len(trajs)).any())


#: The component name of an episode that reports none (its whole env return) and of the run's own
#: shaping terms (overlong punishment, KL in the reward) under ``reward_normalization=gdpo``.
REWARD, SHAPING = "reward", "shaping"


def reward_components(
    trajs: Sequence[Trajectory], turn_rewards: Sequence[Sequence[float]]
) -> tuple[list[str], torch.Tensor]:
    """The named reward components of each episode, as GDPO normalises them: ``(names, [B, K])``.

    An episode's components are the ones its env reported (``Trajectory.info["reward_components"]``,
    summed over its steps); one that reported none has one, ``reward`` = its env return (the sum of
    its turn rewards). When the shaped return (``turn_rewards``, the env's plus the run's shaping
    terms) differs from the env return, the difference is one more component, ``shaping``. A
    component an episode lacks is 0 for it. So an env that reports no components, run without
    shaping, gives one column equal to the returns outcome credit sums today."""
    rows = []
    for t, shaped in zip(trajs, turn_rewards):
        env_return = float(sum(map(float, t.turn_rewards))) if t.turns else float(t.reward)
        comps = {str(k): float(v) for k, v in (t.info.get("reward_components") or {}).items()}
        if SHAPING in comps:
            raise ValueError(
                f"trajectory {t.episode_id}: the env reports a reward component named {SHAPING!r}, which is "
                "reserved for the run's shaping terms (overlong punishment, KL in the reward): rename it"
            )
        if not comps:
            comps = {REWARD: env_return}
        shaped_return = float(sum(shaped))
        if shaped_return != env_return:
            comps[SHAPING] = shaped_return - env_return
        rows.append(comps)
    names = sorted(set().union(*rows)) if rows else []
    return names, torch.tensor([[r.get(n, 0.0) for n in names] for r in rows], dtype=torch.float64)


def token_advantages(
    trajs: list[Trajectory],
    advantage: str,
    credit: str,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
    values_fn: Callable[[list[Trajectory]], list[list[float]]] | None = None,
    omega: float = 1.0,
    credit_stats: dict | None = None,
    turn_rewards: list[list[float]] | None = None,
    whiten: bool = False,
    turn_return_std: bool = False,
    reward_normalization: str = "sum",
    reward_weights: Mapping[str, float] | None = None,
) -> tuple[list[list[float]], list[list[float]] | None, list[list[int]] | None]:
    """Per-token advantages for ``trajs``; for ``turn_gae`` also per-token critic targets and the mask
    of boundary tokens where the critic is trained. ``turn_rewards``: the shaped per-turn rewards
    (``shaped_turn_rewards``; default the env's); outcome credit sums them. ``gigpo``'s episode
    level follows ``advantage`` (``grpo``: std-normalised, ``dr_grpo``: not); ``credit_stats``
    receives its anchor-group counts. ``whiten``: turn_gae's advantages whitened over the batch;
    ``turn_return_std``: turn_return's advantages divided by their group std.
    ``reward_normalization="gdpo"`` (outcome credit with ``grpo`` only): each named component
    (``reward_components``) is normalised within the group on its own and the results are added
    with ``reward_weights`` (a name not listed: 1), ``algos.gdpo``; ``credit_stats`` receives the
    component count and each component's batch mean."""
    masks = [t.loss_mask for t in trajs]
    groups = [t.group_id for t in trajs]
    if turn_rewards is None:
        turn_rewards = shaped_turn_rewards(trajs)[0]
    if reward_normalization not in ("sum", "gdpo"):
        raise ValueError(f"unknown reward normalization {reward_normalization!r}; choose 'sum' or 'gdpo'")
    if reward_normalization == "gdpo" and (credit != "outcome" or advantage != "grpo"):
        raise ConfigError(
            "algo.reward_normalization: 'gdpo' normalises each reward component with GRPO's group mean and std "
            f"and needs outcome credit with the grpo advantage, got credit {credit!r}, advantage {advantage!r}"
        )
    if credit == "outcome":
        if reward_normalization == "gdpo":
            names, comps = reward_components(trajs, turn_rewards)
            w = [float((reward_weights or {}).get(n, 1.0)) for n in names]
            seq_adv = algos.gdpo(comps, algos.group_index(groups), weights=torch.tensor(w, dtype=torch.float64))
            if credit_stats is not None:
                credit_stats["gdpo/components"] = float(len(names))
                credit_stats.update({f"gdpo/{n}_mean": float(comps[:, k].mean()) for k, n in enumerate(names)})
        else:
            rewards = torch.tensor([float(sum(r)) for r in turn_rewards], dtype=torch.float64)
            seq_adv = algos.ADVANTAGES[advantage](rewards, algos.group_index(groups))
        return algos.CREDIT["outcome"](seq_adv, masks), None, None
    turn_ids = [t.turn_ids for t in trajs]
    if credit == "turn_return":
        return (
            algos.CREDIT["turn_return"](
                turn_rewards, turn_ids, masks, groups, gamma=gamma, normalize_std=turn_return_std
            ),
            None,
            None,
        )
    if credit == "gigpo":
        if advantage not in ("grpo", "dr_grpo"):
            raise ConfigError(f"algo.credit=gigpo needs an algo whose advantage is grpo or dr_grpo, got {advantage!r}")
        keys = [[r.state_key for r in t.turns] for t in trajs]
        return (
            algos.CREDIT["gigpo"](
                turn_rewards,
                turn_ids,
                masks,
                groups,
                keys,
                omega=omega,
                gamma=gamma,
                normalize_std=advantage == "grpo",
                stats=credit_stats,
            ),
            None,
            None,
        )
    if credit == "turn_gae":
        if values_fn is None:
            raise ValueError("credit 'turn_gae' needs a critic (values_fn)")
        values = values_fn(trajs)
        # values[t] is V(state before token t) (Trainer.values); turn_boundaries gives the token just
        # before turn k's first sampled token, so V(state before turn k) sits one position later.
        bounds = [[b + 1 for b in algos.turn_boundaries(t.turn_ids, t.loss_mask)] for t in trajs]
        bvals = [[v[i] for i in b] for v, b in zip(values, bounds)]
        adv, turn_targets = algos.CREDIT["turn_gae"](
            turn_rewards, turn_ids, masks, bvals, gamma=gamma, lam=lam, whiten=whiten
        )
        returns, vmask = [], []
        for t, b, tt in zip(trajs, bounds, turn_targets):
            r, m = [0.0] * len(t.token_ids), [0] * len(t.token_ids)
            for k, i in enumerate(b):
                r[i], m[i] = float(tt[k]), 1
            returns.append(r)
            vmask.append(m)
        return adv, returns, vmask
    raise ValueError(f"unknown credit mode {credit!r}; choose from {sorted(algos.CREDIT)}")


def build_samples(
    groups: Sequence[Sequence[Trajectory]],
    preset: AlgoPreset,
    *,
    credit: str | None = None,
    gamma: float = 1.0,
    lam: float = 0.95,
    values_fn=None,
    omega: float = 1.0,
    shaping: RewardShaping | None = None,
    ref_fn=None,
    whiten: bool = False,
    turn_return_std: bool = False,
):
    """TrainSamples for one optimizer step, plus stats (excluded count, advantage spread, the
    shaping terms' ``overlong/*`` and ``kl_in_reward/*``). ``ref_fn(trajs)``: the reference
    model's per-token logprobs, called only when ``shaping`` puts a KL term in the reward."""
    trajs, excluded = trainable(groups)
    if not trajs:
        return [], {"excluded": excluded, "samples": 0}
    cstats: dict = {}
    rewards, rstats = shaped_turn_rewards(trajs, shaping, ref_fn)
    adv, returns, vmask = token_advantages(
        trajs,
        preset.advantage,
        credit or preset.credit,
        gamma=gamma,
        lam=lam,
        values_fn=values_fn,
        omega=omega,
        credit_stats=cstats,
        turn_rewards=rewards,
        whiten=whiten,
        turn_return_std=turn_return_std,
        reward_normalization=shaping.reward_normalization if shaping is not None else "sum",
        reward_weights=shaping.reward_weights if shaping is not None else None,
    )
    samples = []
    for i, t in enumerate(trajs):
        samples.append(
            TrainSample(
                token_ids=t.token_ids,
                loss_mask=t.loss_mask,
                behaviour_logprobs=t.logprobs,
                advantages=[float(a) for a in adv[i]],
                returns=returns[i] if returns else None,
                value_mask=vmask[i] if vmask else None,
            )
        )
    flat = [a for row, t in zip(adv, trajs) for a, m in zip(row, t.loss_mask) if m]
    nonzero = sum(1 for a in flat if abs(a) > 1e-9)
    return samples, {
        "excluded": excluded,
        "samples": len(samples),
        "adv_nonzero_frac": nonzero / len(flat) if flat else 0.0,
        # the size of the update a credit mode asks for at a given lr (gigpo adds a step term to the episode's)
        "adv_abs_mean": math.fsum(abs(a) for a in flat) / len(flat) if flat else 0.0,
        **cstats,
        **rstats,
    }
