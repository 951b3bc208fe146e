"""agentrl's RL algorithms: the one module to import. Pure functions chosen by name from registries;
the trainer is algorithm-blind and only applies the per-token weights these produce.

Owns (re-exported from ``advantages``, ``losses``, ``credit``, ``shaping``, ``sampling``,
``rollout_correction``, ``distillation``): every advantage estimator, credit mode, policy loss, loss
aggregation, KL estimator, entropy, value loss, mismatch correction (TIS and the ratio masks),
on-policy distillation term, length-shaping term and group filter.
Does not: run models, hold optimizer or trainer state, reduce across ranks, read configs.

Shapes: ``B`` sequences; ``[B, T]`` padded per-token; ``[N]`` flat packed tokens (any number of
sequences back to back); ``V`` vocabulary. ``m`` is the loss mask (1 = sampled by the policy).

Registries (``lookup(kind, name)`` returns the function or raises ConfigError listing the choices)
-----------------------------------------------------------------------------------------------
``ADVANTAGES`` - sequence level, ``(rewards [B], group_ids [B], **kw) -> [B]``; ``g`` = i's group
(``group_index`` maps string group ids to int64). std is the unbiased (n-1) std, ``eps = 1e-6``;
a sequence alone in its group gets 0.

* ``grpo``:          ``A_i = (r_i - mean_g) / (std_g + eps)``
* ``dr_grpo``:       ``A_i = r_i - mean_g``; pair with aggregation ``seq-mean-token-sum-norm``
  (Dr.GRPO removes both the std and the per-sequence length normalisation)
* ``rloo``:          ``A_i = r_i - mean_{j in g, j != i} r_j = n/(n-1) (r_i - mean_g)``
* ``reinforce_pp``:  ``A_i = (r_i - mean_batch) / (std_batch + eps)`` (group_ids ignored; put the
  KL penalty in the reward first, ``apply_kl_in_reward``)
* ``reinforce_pp_baseline``: ``a = r - mean_g``, then ``(a - mean_batch a) / (std_batch a + eps)``
* ``none``:          ``A_i = 0`` (no reward signal: pure on-policy distillation, ``--algo opd``)

``gdpo(components [B, K], group_ids [B], weights [K]) -> [B]`` (GDPO, multi-component rewards; not
a registry entry, it replaces ``grpo`` when rewards come in named parts):
``A_i = sum_k w_k (c_{i,k} - mean_g c_k) / (std_g c_k + eps)``, each component normalised within
the group on its own, then weighted and summed (no batch whitening afterwards: one component with
weight 1 is exactly ``grpo``).

``gae(token_rewards [B,T], values [B,T], mask [B,T], gamma, lam, whiten) -> (adv [B,T], returns [B,T])``:
token-level GAE for PPO over mask-1 positions only; observation gaps are skipped (not steps), so
values bootstrap across them: ``delta_t = r_t + gamma V(next sampled t') - V_t``,
``A_t = delta_t + gamma lam A_{t'}``, ``R_t = A_t + V_t``. ``whiten=True`` then applies
``masked_whiten`` to the advantages only (off by default here; veRL, TRL and OpenRLHF whiten PPO's
GAE advantages by default, so a PPO preset should turn it on).

``CREDIT`` - per-sequence lists (aligned with ``Trajectory.token_ids``) -> per-token advantages:

* ``outcome``:     ``outcome_broadcast(seq_adv [B], loss_masks)``: every sampled token of i gets
  ``seq_adv[i]`` (from any ``ADVANTAGES`` estimator).
* ``turn_return``: ``turn_returns_group_baseline(turn_rewards, turn_ids, loss_masks, group_ids,
  gamma, normalize_std)``: ``G_{i,k} = sum_{j>=k} gamma^{j-k} r_{i,j}``,
  ``A_{i,k} = G_{i,k} - mean_{i' in g with a turn k} G_{i',k}`` (optionally / (std + eps));
  turn k's sampled tokens get ``A_{i,k}``.
* ``turn_gae``:    ``turn_gae(turn_rewards, turn_ids, loss_masks, boundary_values, gamma, lam)``:
  ``delta_k = r_k + gamma V_{k+1} - V_k`` (``V_K = 0``), ``A_k = sum_l (gamma lam)^l delta_{k+l}``;
  returns per-token advantages and per-turn critic targets ``R_k = A_k + V_k``. Read ``V_k`` at
  ``turn_boundaries(turn_ids, loss_mask)[k]``. ``whiten=True`` whitens the token advantages over
  the batch's sampled tokens (targets unchanged).
* ``gigpo``:       ``gigpo(turn_rewards, turn_ids, loss_masks, group_ids [B], state_keys [B][K_i], omega,
  gamma, normalize_std)`` (GiGPO, group-in-group): episode level ``R_i = sum_k r_{i,k}``,
  ``A^E_i = (R_i - mean_g R) / (std_g R + eps)`` (``normalize_std=False``: ``R_i - mean_g R``);
  step level: the anchor group of turn (i, k) is every turn of i's group that started from the same
  ``state_keys[i][k]``, ``G_{i,k} = sum_{j>=k} gamma^{j-k} r_{i,j}`` normalised the same way within
  it (a singleton anchor group gives 0, so with no repeated state GiGPO equals ``A^E``);
  ``A_{i,k} = A^E_i + omega A^S_{i,k}`` on turn k's sampled tokens. Keys come from the env's
  ``state_key()`` (``Trajectory.turns[k].state_key``; a hash of the observation text otherwise).

Every credit mode gives mask-0 tokens (prompt, tool output, glue) advantage 0.

``POLICY_LOSSES`` - ``(logp [N], old_logp [N], adv [N], **kw) -> (loss [N], metrics {name: [N]})``,
``r = exp(logp - old_logp)`` (log-ratio clamped to [-20, 20]):

* ``ppo_clip``:   ``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``; ``clip_high > clip_low``
  is DAPO's clip-higher; ``dual_clip_c = c > 1``: for ``A < 0``, ``min(that, -A c)``.
  Metrics: clipfrac, clipfrac_high, clipfrac_low, dual_clipfrac, ratio, ppo_kl.
* ``vanilla_pg``: ``-A r`` (unclipped; REINFORCE when on-policy).
* ``sft``:        ``-logp`` (the SFT stage through the same trainer).
* ``gspo``:       GSPO-token. Needs ``seq_index [N]`` (each token's sequence id); optional ``mask``.
  ``s_i = exp(mean_{t in i} (logp - old_logp))`` over i's sampled tokens;
  ``s_{i,t} = sg[s_i] exp(logp_t - sg[logp_t])``; ``max(-A s_{i,t}, -A clip(s_{i,t}, 1 - clip_low,
  1 + clip_high))`` (one clip decision per sequence; paper ranges 3e-4 / 4e-4). With
  ``seq-mean-token-mean`` and one advantage per sequence its gradient is sequence-level GSPO's.
* ``cispo``:      ``-sg(clip(r, 1 - clip_low, 1 + clip_high)) A logp`` (MiniMax-M1; ``clip_low=None``
  = no lower bound): every token keeps a gradient, its importance weight capped. Use ``token-mean``.

``AGGREGATIONS`` - ``aggregate(mode, loss_tok [N], mask [N], seq_ntokens [N], global_tokens,
global_seqs, norm_len) -> []``, one micro-batch's share; the shares of all micro-batches and ranks
of one optimizer step sum to the step's loss (with DDP/FSDP gradient *averaging* over W ranks,
scale each share by W). ``seq_ntokens`` from ``tokens_per_sequence(seq_index, mask)``:

* ``token-mean``:              ``sum(l m) / global_tokens``
* ``seq-mean-token-sum``:      ``sum(l m) / global_seqs``
* ``seq-mean-token-mean``:     ``sum(l m / seq_ntokens) / global_seqs``
* ``seq-mean-token-sum-norm``: ``sum(l m) / (global_seqs * norm_len)`` (Dr.GRPO, constant norm_len)

``KL_ESTIMATORS`` - ``(logp [N], ref_logp [N]) -> [N]`` for KL(pi || ref), samples from pi.
In the loss: add ``beta * k`` per token. In the reward:
``apply_kl_in_reward(turn_rewards, kl, turn_ids, loss_masks, beta)``; ``beta`` fixed or adapted
towards a target KL by ``adaptive_kl_coef(beta, kl, target, horizon, n)`` (``kl_control``).

* ``k1``: ``logp - ref`` (unbiased, high variance, may be negative)
* ``k2``: ``0.5 (logp - ref)^2`` (biased, low variance)
* ``k3``: ``exp(d) - d - 1`` with ``d = ref - logp`` clamped to [-20, 20], the result clamped to
  [0, 10] (unbiased before the clamp, low variance, >= 0; verl's ``low_var_kl``)

DAPO's pieces: clip-higher is ``ppo_clip(clip_high > clip_low)``; token-level loss is
``token-mean``; the other two are pure functions over sequences (not registries):

* ``overlong_penalty(lengths [B], max_new_tokens, cache_len, factor=1) -> [B]``: 0 up to
  ``max_new_tokens - cache_len``, then linear down to ``-factor`` at ``max_new_tokens`` and beyond;
  add it to the reward before the estimator.
* ``dynamic_sampling_keep(rewards [B], group_ids [B], atol=0) -> bool [B]``: keep the sequences
  whose group's rewards are not all equal (``max - min > atol``); singleton groups are dropped.

Other per-token functions
-------------------------
* ``entropy_from_logits(logits [N,V]) -> [N]``; entropy bonus: add ``-coef * H`` per token.
* ``logprobs_from_logits(logits [N,V], labels [N]) -> [N]``.
* ``value_loss(v, old_v, R [N], clip=0.2) -> [N]``: ``0.5 max((v-R)^2, (old + clip(v-old, ±c) - R)^2)``.
* ``truncated_is_weights(train_logp, behaviour_logp, cap=2.0) -> [N]``: ``min(exp(train - behaviour),
  cap)``, no grad; multiply the policy loss by it (TIS). ``mismatch_metrics(train, behaviour, mask)``.

``ROLLOUT_CORRECTIONS`` - the training/inference mismatch (``rollout_correction``):
``(train_logp [N], behaviour_logp [N], *, mask, seq_index, bounds) -> (weights [N] | None, metrics)``
on ``rho_t = exp(train_logp_t - behaviour_logp_t)`` (no grad; multiply the policy loss by the weights).
Only action tokens (``mask`` 1) count:

* ``tis``:        ``min(rho_t, cap)`` (``cap`` null: none)
* ``icepop``:     ``rho_t 1[low <= rho_t <= high]`` (IcePop, Ring-1T; 0.5 / 5): both tails masked
* ``mis``:        the same formula with TRL's ``token_mask`` defaults: no lower bound, ``high`` 3
* ``seq_reject``: ``1[low <= rho_i <= high]`` on every token of sequence i, ``rho_i`` the geometric
  mean of its action tokens' ratios (SkyRL, verl geometric RS; 0.99 / 1.01)
* ``none``:       nothing

The masks report ``rollout_masked_frac`` (1 on a masked action token) and ``rollout_weight``.

``DISTILLATION`` - on-policy distillation (``distillation``): ``(logp [N], teacher_logp [N],
old_logp [N]) -> (loss [N], metrics)``, the teacher's log-probs of the student's own sampled tokens:

* ``reverse_kl``: ``k_t = sg(logp_t) - teacher_t`` (sampled-token reverse KL), advantage ``-k_t``,
  ``loss_t = k_t exp(logp_t - sg(old_t))`` (REINFORCE on ``-k_t``, discount 0; Thinking Machines'
  "On-Policy Distillation"). Metric ``opd_reverse_kl``. The trainer adds ``opd_coef * loss_t``.

Composing one micro-batch (what the trainer does; every term is per token, then one aggregate)::

    loss_tok, metrics = POLICY_LOSSES[name](logp, old_logp, adv, clip_low=..., clip_high=...)
    w, _ = ROLLOUT_CORRECTIONS["tis"](old_logp, behaviour_logp, cap=2.0)    # or icepop, mis, ...
    loss_tok = loss_tok * w                                                 # unless w is None
    loss_tok = loss_tok + beta * KL_ESTIMATORS["k3"](logp, ref_logp) - ent_coef * entropy
    loss_tok = loss_tok + opd_coef * DISTILLATION["reverse_kl"](logp, teacher_logp, old_logp)[0] * w
    share = aggregate("token-mean", loss_tok, mask, seq_ntokens, global_tokens=..., global_seqs=...)
"""

from __future__ import annotations

from agentrl.algos.advantages import (
    ADVANTAGES,
    dr_grpo,
    gae,
    gdpo,
    group_index,
    grpo,
    masked_whiten,
    no_advantage,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
)
from agentrl.algos.credit import (
    CREDIT,
    apply_kl_in_reward,
    gigpo,
    outcome_broadcast,
    turn_boundaries,
    turn_gae,
    turn_returns_group_baseline,
    turn_rewards_to_tokens,
)
from agentrl.algos.distillation import DISTILLATION, opd_reverse_kl
from agentrl.algos.kl_control import adaptive_kl_coef
from agentrl.algos.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    aggregate,
    cispo,
    entropy_from_logits,
    gspo,
    k1,
    k2,
    k3,
    logprobs_from_logits,
    mismatch_metrics,
    ppo_clip,
    sft,
    tokens_per_sequence,
    truncated_is_weights,
    value_loss,
    vanilla_pg,
)
from agentrl.algos.registry import REGISTRIES, lookup
from agentrl.algos.rollout_correction import ROLLOUT_CORRECTIONS, icepop, mis, no_correction, seq_reject, tis
from agentrl.algos.sampling import dynamic_sampling_keep
from agentrl.algos.shaping import overlong_penalty

__all__ = [
    "REGISTRIES",
    "lookup",
    "ADVANTAGES",
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "no_advantage",
    "gdpo",
    "gae",
    "group_index",
    "masked_whiten",
    "CREDIT",
    "outcome_broadcast",
    "turn_returns_group_baseline",
    "turn_gae",
    "gigpo",
    "turn_boundaries",
    "turn_rewards_to_tokens",
    "apply_kl_in_reward",
    "POLICY_LOSSES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "ppo_clip",
    "vanilla_pg",
    "sft",
    "gspo",
    "cispo",
    "aggregate",
    "tokens_per_sequence",
    "k1",
    "k2",
    "k3",
    "entropy_from_logits",
    "logprobs_from_logits",
    "value_loss",
    "truncated_is_weights",
    "mismatch_metrics",
    "ROLLOUT_CORRECTIONS",
    "tis",
    "icepop",
    "mis",
    "seq_reject",
    "no_correction",
    "DISTILLATION",
    "opd_reverse_kl",
    "overlong_penalty",
    "dynamic_sampling_keep",
    "adaptive_kl_coef",
]
