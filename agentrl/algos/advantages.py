"""Advantage estimators: sequence-level (one scalar per sequence) and token-level GAE.

Owns: the ``ADVANTAGES`` registry of sequence-level estimators (GRPO, Dr.GRPO, RLOO, REINFORCE++
and its group-baseline variant, and ``none``: no reward signal, for pure distillation), GDPO's
per-component normalisation of multi-component rewards (``gdpo``), token-level ``gae`` with a
critic, and the small group helpers they share (``group_index``, ``masked_whiten``). Every
function is pure: tensors in, tensors out, no trainer state, no gradient needed.

Does not: spread a sequence advantage over tokens or assign credit per turn (``credit`` does),
nor compute losses (``losses`` does).

Conventions (shared by every estimator here and by ``credit``):

* A group's std is the **unbiased** (Bessel, ``n - 1``) sample std, as in verl and TRL's GRPO;
  ``eps = 1e-6`` is added to the std, not the variance.
* A sequence alone in its group (singleton) gets advantage **0**: it has no baseline to compare
  against, so it carries no learning signal (verl would pass the raw reward through instead).
* A group whose rewards are all equal gets 0 everywhere (``0 / (0 + eps)``).
* Statistics are computed in float64; results come back in the rewards' floating dtype
  (float32 for integer rewards).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch
from torch import Tensor

__all__ = [
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
]


def group_index(group_ids: Sequence[Hashable] | Tensor) -> Tensor:
    """Map group keys to dense int64 ids ``[B]``: a tensor's values are renumbered 0..k-1 in
    sorted order; other keys (e.g. ``Trajectory.group_id`` strings) in order of first appearance.
    Every estimator taking ``group_ids`` accepts either form."""
    if isinstance(group_ids, Tensor):
        return torch.unique(group_ids, return_inverse=True)[1].to(torch.int64)
    seen: dict[Hashable, int] = {}
    return torch.tensor([seen.setdefault(g, len(seen)) for g in group_ids], dtype=torch.int64)


def _prep(rewards: Tensor) -> tuple[Tensor, torch.dtype]:
    r = torch.as_tensor(rewards)
    if r.dim() != 1:
        raise ValueError(f"rewards must have shape [B], got {tuple(r.shape)}")
    out = r.dtype if r.is_floating_point() else torch.float32
    return r.detach().to(torch.float64), out


def _group_stats(r: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sequence (group mean, unbiased group std, group size), each ``[B]`` float64."""
    g = group_index(group_ids).to(r.device)
    if g.shape != r.shape:
        raise ValueError(f"group_ids shape {tuple(g.shape)} != rewards shape {tuple(r.shape)}")
    k = int(g.max()) + 1 if g.numel() else 0
    n = torch.zeros(k, dtype=torch.float64, device=r.device).index_add_(0, g, torch.ones_like(r))
    mean = torch.zeros(k, dtype=torch.float64, device=r.device).index_add_(0, g, r) / n
    dev2 = (r - mean[g]) ** 2
    var = torch.zeros(k, dtype=torch.float64, device=r.device).index_add_(0, g, dev2) / (n - 1).clamp(min=1)
    return mean[g], var.sqrt()[g], n[g]


def grpo(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """GRPO: ``A_i = (r_i - mean_g) / (std_g + eps)`` over the sequences of i's group.

    rewards ``[B]`` float, group_ids ``[B]`` int64 (any keys; see ``group_index``) -> ``[B]``.
    std is unbiased; a singleton group gives 0.
    """
    r, dt = _prep(rewards)
    mean, std, n = _group_stats(r, group_ids)
    adv = (r - mean) / (std + eps)
    return torch.where(n > 1, adv, torch.zeros_like(adv)).to(dt)


def dr_grpo(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Dr.GRPO: ``A_i = r_i - mean_g`` (no std division). ``[B]``, ``[B]`` -> ``[B]``.

    Its other half, no per-sequence length normalisation, is the aggregation's job: use
    ``seq-mean-token-sum-norm`` with a constant ``norm_len`` (e.g. the max generation length).
    A singleton group gives 0 (``r - r``).
    """
    r, dt = _prep(rewards)
    mean, _, _ = _group_stats(r, group_ids)
    return (r - mean).to(dt)


def rloo(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO: ``A_i = r_i - mean_{j != i, j in g} r_j = n/(n-1) * (r_i - mean_g)``.
    ``[B]``, ``[B]`` -> ``[B]``; a singleton group gives 0."""
    r, dt = _prep(rewards)
    mean, _, n = _group_stats(r, group_ids)
    adv = (r - mean) * n / (n - 1).clamp(min=1)
    return torch.where(n > 1, adv, torch.zeros_like(adv)).to(dt)


def _batch_norm(x: Tensor, eps: float) -> Tensor:
    if x.numel() < 2:
        return torch.zeros_like(x)
    return (x - x.mean()) / (x.std(unbiased=True) + eps)


def reinforce_pp(rewards: Tensor, group_ids: Tensor | None = None, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE++: ``A_i = (r_i - mean_batch) / (std_batch + eps)``; ``[B]`` -> ``[B]``.

    ``group_ids`` is accepted for a uniform call signature and ignored. The KL penalty of
    REINFORCE++ belongs in the reward and is applied by the caller before this (see
    ``credit.apply_kl_in_reward``). A batch of one gives 0.
    """
    r, dt = _prep(rewards)
    return _batch_norm(r, eps).to(dt)


def reinforce_pp_baseline(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE++-baseline: subtract the group mean, then normalise over the batch:
    ``a_i = r_i - mean_g``; ``A_i = (a_i - mean_batch(a)) / (std_batch(a) + eps)``. ``[B]`` -> ``[B]``."""
    r, dt = _prep(rewards)
    mean, _, _ = _group_stats(r, group_ids)
    return _batch_norm(r - mean, eps).to(dt)


def no_advantage(rewards: Tensor, group_ids: Tensor | None = None) -> Tensor:
    """``A_i = 0`` for every sequence: no reward signal (pure on-policy distillation, whose signal is
    the teacher's per-token term in the loss). ``[B] -> [B]``."""
    r, out = _prep(rewards)
    return torch.zeros_like(r).to(out)


def gdpo(components: Tensor, group_ids: Tensor, *, weights: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """GDPO (Group reward-Decoupled normalization Policy Optimization, Liu et al., NVIDIA 2026): each
    named reward component is normalised within the group on its own, as GRPO normalises the
    summed reward, and the normalised components are then added with weights::

        A_i = sum_k w_k (c_{i,k} - mean_g c_k) / (std_g c_k + eps)       (std unbiased, as ``grpo``)

    ``components [B, K]`` (column k: component k of every sequence), ``group_ids [B]``, ``weights
    [K]`` (default all 1) -> ``[B]``. Summing first (``grpo`` of ``sum_k c_k``) lets the component
    with the largest spread in a group decide the order of its episodes; here every component that
    varies in the group weighs ``w_k`` on the unit scale, so a rare correct answer is not drowned
    by a wide length or format reward. A component constant within a group adds 0 there; a
    singleton group gets 0. With one component and weight 1 this is exactly ``grpo``.

    The paper (and TRL's ``multi_objective_aggregation="normalize_then_sum"``) then whitens the
    sum over the batch; this function does not: the weighted sum already has mean 0 in every
    group, so that step only divides all of a step's advantages by one number (a step-size change
    Adam largely undoes), and leaving it out keeps one component identical to GRPO.
    """
    c = torch.as_tensor(components)
    if c.dim() != 2:
        raise ValueError(f"components must have shape [B, K], got {tuple(c.shape)}")
    out = c.dtype if c.is_floating_point() else torch.float32
    w = torch.ones(c.shape[1], dtype=torch.float64) if weights is None else torch.as_tensor(weights).to(torch.float64)
    if w.shape != (c.shape[1],):
        raise ValueError(f"weights must have shape [K] = [{c.shape[1]}], got {tuple(w.shape)}")
    adv = torch.zeros(c.shape[0], dtype=torch.float64, device=c.device)
    for k in range(c.shape[1]):
        adv = adv + w[k].to(c.device) * grpo(c[:, k].to(torch.float64), group_ids, eps=eps)
    return adv.to(out)


def gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float = 1.0, lam: float = 1.0, whiten: bool = False
) -> tuple[Tensor, Tensor]:
    """Token-level GAE over the mask-1 (sampled) positions only. All inputs ``[B, T]``.

    Mask-0 positions (prompt, tool output, glue) are **not steps**: the backward recursion jumps
    over them, so the value of the next *sampled* token bootstraps across an observation gap::

        over mask-1 positions t_1 < t_2 < ... < t_n of a row (V(t_{n+1}) = 0):
        delta_j = r'(t_j) + gamma * V(t_{j+1}) - V(t_j)
        A(t_j)  = delta_j + gamma * lam * A(t_{j+1})
        R(t_j)  = A(t_j) + V(t_j)

    where ``r'(t_j)`` is ``token_rewards[t_j]`` plus any reward placed on the mask-0 positions
    between ``t_j`` and ``t_{j+1}`` (a reward on an observation token is credited to the action
    that caused it; rewards before the first sampled token are dropped). Returns
    ``(advantages [B, T], returns [B, T])``, both 0 at mask-0 positions, detached.

    ``whiten=True`` normalises the advantages over all mask-1 positions of the batch
    (``masked_whiten``: zero mean, unit unbiased std) after the returns are formed, so the critic's
    targets stay unwhitened (as veRL, TRL and OpenRLHF do for PPO by default).

    ``values[b, t]`` must be V(state before token t is sampled), i.e. a causal critic's output at
    position ``t - 1``; at a turn's first sampled token that is the turn-boundary value of
    ``credit.turn_boundaries``.
    """
    v_in = torch.as_tensor(values)
    dt = v_in.dtype if v_in.is_floating_point() else torch.float32
    r = torch.as_tensor(token_rewards).detach().to(torch.float64)
    v = v_in.detach().to(torch.float64)
    m = torch.as_tensor(mask).detach().to(torch.bool)
    if not (r.shape == v.shape == m.shape) or r.dim() != 2:
        raise ValueError(f"gae needs equal [B, T] shapes, got {tuple(r.shape)}, {tuple(v.shape)}, {tuple(m.shape)}")
    B, T = r.shape
    adv = torch.zeros_like(r)
    next_v = torch.zeros(B, dtype=torch.float64, device=r.device)
    last = torch.zeros(B, dtype=torch.float64, device=r.device)
    pending = torch.zeros(B, dtype=torch.float64, device=r.device)  # rewards seen on skipped positions
    for t in range(T - 1, -1, -1):
        mt = m[:, t]
        rt = r[:, t] + pending
        delta = rt + gamma * next_v - v[:, t]
        cur = delta + gamma * lam * last
        adv[:, t] = torch.where(mt, cur, torch.zeros_like(cur))
        last = torch.where(mt, cur, last)
        next_v = torch.where(mt, v[:, t], next_v)
        pending = torch.where(mt, torch.zeros_like(pending), rt)
    ret = torch.where(m, adv + v, torch.zeros_like(adv))
    if whiten:
        adv = masked_whiten(adv, m)
    return adv.to(dt), ret.to(dt)


def masked_whiten(x: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` with mean/var (unbiased) over mask-1 entries; any shape.
    Mask-0 entries come back as 0. With ``shift_mean=False`` the mean is added back (scale only)."""
    m = mask.to(torch.bool)
    n = int(m.sum())
    if n < 2:
        return torch.zeros_like(x)
    sel = x[m].to(torch.float64)
    mean, var = sel.mean(), sel.var(unbiased=True)
    out = (x.to(torch.float64) - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros_like(out)).to(x.dtype)


ADVANTAGES: dict[str, Callable[..., Tensor]] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
    "reinforce_pp_baseline": reinforce_pp_baseline,
    "none": no_advantage,
}
