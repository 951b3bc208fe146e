"""Turn-level credit assignment: from trajectories (per-turn rewards, ``turn_ids``, ``loss_mask``)
to PER-TOKEN advantages.

Owns: the ``CREDIT`` registry (``outcome``, ``turn_return``, ``turn_gae``, ``gigpo``) and the helpers that
relate turns to token positions (``turn_boundaries``, ``turn_rewards_to_tokens``) and put a KL
penalty into per-turn rewards (``apply_kl_in_reward``).

Does not: compute sequence-level advantages (``advantages``), read a critic, or touch tensors on
a device. Inputs and outputs are plain per-sequence Python lists, aligned with
``Trajectory.token_ids`` (``turn_ids``: -1 for the prompt, k for the tokens sampled in turn k and
for the observation tokens appended after it).

Every function gives mask-0 tokens (prompt, observation, template glue) advantage exactly 0.

Rewards: ``Trajectory.turns[k].reward`` is the env's reward for turn k; the terminal turn's
reward is the episode's outcome reward, so ``sum_k r_k`` is the undiscounted return and the
outcome must not be added again.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

__all__ = [
    "CREDIT",
    "outcome_broadcast",
    "turn_returns_group_baseline",
    "turn_gae",
    "gigpo",
    "turn_boundaries",
    "turn_rewards_to_tokens",
    "apply_kl_in_reward",
]


def _check(turn_ids: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]], n: int) -> None:
    if len(turn_ids) != n or len(loss_masks) != n:
        raise ValueError(f"expected {n} sequences, got {len(turn_ids)} turn_ids and {len(loss_masks)} loss_masks")
    for i, (t, m) in enumerate(zip(turn_ids, loss_masks)):
        if len(t) != len(m):
            raise ValueError(f"sequence {i}: len(turn_ids)={len(t)} != len(loss_mask)={len(m)}")


def _spread(per_turn: Sequence[Sequence[float]], turn_ids, loss_masks) -> list[list[float]]:
    """Token t of sequence i gets ``per_turn[i][turn_ids[i][t]]`` if sampled, else 0."""
    out = []
    for i, (vals, tids, mask) in enumerate(zip(per_turn, turn_ids, loss_masks)):
        row = []
        for t, (k, m) in enumerate(zip(tids, mask)):
            if not m:
                row.append(0.0)
            elif 0 <= k < len(vals):
                row.append(float(vals[k]))
            else:
                raise ValueError(
                    f"sequence {i} token {t}: sampled token in turn {k}, but the sequence has {len(vals)} turns"
                )
        out.append(row)
    return out


def _discounted_suffix(rewards: Sequence[float], gamma: float) -> list[float]:
    out, acc = [0.0] * len(rewards), 0.0
    for k in range(len(rewards) - 1, -1, -1):
        acc = float(rewards[k]) + gamma * acc
        out[k] = acc
    return out


def outcome_broadcast(seq_adv, loss_masks: Sequence[Sequence[int]]) -> list[list[float]]:
    """Every mask-1 token of sequence i gets ``seq_adv[i]``; mask-0 tokens get 0.
    ``seq_adv``: ``[B]`` list or tensor; ``loss_masks``: B lists -> B lists of floats."""
    adv = [float(a) for a in seq_adv]
    if len(adv) != len(loss_masks):
        raise ValueError(f"{len(adv)} advantages for {len(loss_masks)} sequences")
    return [[a if m else 0.0 for m in mask] for a, mask in zip(adv, loss_masks)]


def turn_returns_group_baseline(
    turn_rewards: Sequence[Sequence[float]],
    turn_ids: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    group_ids: Sequence[Hashable],
    *,
    gamma: float = 1.0,
    normalize_std: bool = False,
    eps: float = 1e-6,
) -> list[list[float]]:
    """Discounted per-turn returns with a group baseline per turn position.

    ``G_{i,k} = sum_{j >= k} gamma^(j-k) r_{i,j}``;
    ``A_{i,k} = G_{i,k} - mean{G_{i',k} : i' in group(i) and i' has a turn k}``
    (``normalize_std``: divided by that set's unbiased std + eps). A sequence that is the only
    one of its group to reach turn k gets ``A_{i,k} = 0``. Tokens sampled in turn k get
    ``A_{i,k}``; mask-0 tokens get 0. B sequences in, B per-token lists out.
    """
    n = len(turn_rewards)
    _check(turn_ids, loss_masks, n)
    if len(group_ids) != n:
        raise ValueError(f"{len(group_ids)} group ids for {n} sequences")
    returns = [_discounted_suffix(r, gamma) for r in turn_rewards]
    buckets: dict[tuple[Hashable, int], list[float]] = defaultdict(list)
    for g, G in zip(group_ids, returns):
        for k, v in enumerate(G):
            buckets[(g, k)].append(v)
    stats = {}
    for key, vals in buckets.items():
        mean = sum(vals) / len(vals)
        var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1) if len(vals) > 1 else 0.0
        stats[key] = (mean, math.sqrt(var), len(vals))
    per_turn = []
    for g, G in zip(group_ids, returns):
        row = []
        for k, v in enumerate(G):
            mean, std, cnt = stats[(g, k)]
            a = 0.0 if cnt < 2 else v - mean
            row.append(a / (std + eps) if normalize_std else a)
        per_turn.append(row)
    return _spread(per_turn, turn_ids, loss_masks)


def turn_gae(
    turn_rewards: Sequence[Sequence[float]],
    turn_ids: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    boundary_values: Sequence[Sequence[float]],
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
    final_values: Sequence[float] | None = None,
    whiten: bool = False,
) -> tuple[list[list[float]], list[list[float]]]:
    """Turn-level GAE: one step per assistant turn, the critic read at turn boundaries.

    ``boundary_values[i][k] = V_k`` = the critic's value of the state before turn k, read at the
    token ``turn_boundaries(...)[k]`` (the last token before turn k's first sampled token).
    ``V_K = final_values[i]`` after the last turn (default 0: the episode ended; pass the value at
    the last token to bootstrap a truncated episode)::

        delta_k = r_k + gamma V_{k+1} - V_k
        A_k     = sum_l (gamma lam)^l delta_{k+l}
        R_k     = A_k + V_k                      (the critic's target at boundary k)

    Returns ``(token_advantages, turn_returns)``: B per-token lists (turn k's sampled tokens get
    ``A_k``, mask-0 tokens 0) and B per-turn lists ``[R_0, ..., R_{K-1}]``.

    ``whiten=True`` normalises the token advantages over every sampled token of the batch
    (``(A - mean) / sqrt(var + 1e-8)``, unbiased var; fewer than 2 sampled tokens give 0) after
    the targets ``R_k`` are formed from the raw ``A_k``, as ``advantages.gae(whiten=True)`` does.
    """
    n = len(turn_rewards)
    _check(turn_ids, loss_masks, n)
    if len(boundary_values) != n or (final_values is not None and len(final_values) != n):
        raise ValueError(f"boundary_values/final_values must have one entry per sequence ({n})")
    per_turn, rets = [], []
    for i, (r, v) in enumerate(zip(turn_rewards, boundary_values)):
        if len(r) != len(v):
            raise ValueError(f"sequence {i}: {len(r)} turn rewards but {len(v)} boundary values")
        K = len(r)
        adv = [0.0] * K
        last, next_v = 0.0, 0.0 if final_values is None else float(final_values[i])
        for k in range(K - 1, -1, -1):
            delta = float(r[k]) + gamma * next_v - float(v[k])
            last = delta + gamma * lam * last
            adv[k], next_v = last, float(v[k])
        per_turn.append(adv)
        rets.append([a + float(vk) for a, vk in zip(adv, v)])
    tok = _spread(per_turn, turn_ids, loss_masks)
    return (_whiten_sampled(tok, loss_masks) if whiten else tok), rets


def _normalized(values: Sequence[float], normalize_std: bool, eps: float) -> list[float]:
    """``v - mean`` (``/ (unbiased std + eps)`` if ``normalize_std``); a single value gives 0."""
    if len(values) < 2:
        return [0.0] * len(values)
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return [(v - mean) / (std + eps) if normalize_std else v - mean for v in values]


def gigpo(
    turn_rewards: Sequence[Sequence[float]],
    turn_ids: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    group_ids: Sequence[Hashable],
    state_keys: Sequence[Sequence[Hashable | None]],
    *,
    omega: float = 1.0,
    gamma: float = 1.0,
    normalize_std: bool = True,
    eps: float = 1e-6,
    stats: dict | None = None,
) -> list[list[float]]:
    """GiGPO (group-in-group): an episode-level group advantage plus a step-level one computed inside
    anchor-state groups.

    ``R_i = sum_k r_{i,k}``; ``A^E_i = (R_i - mean_g R) / (std_g R + eps)`` over i's group g
    (``normalize_std=False``: ``R_i - mean_g R``, Dr.GRPO style). Anchor group of turn (i, k):
    every turn (i', k') with ``group(i') = group(i)`` and ``state_keys[i'][k'] = state_keys[i][k]``
    (the state the turn started from; turns of one trajectory that revisit a state count too).
    ``G_{i,k} = sum_{j >= k} gamma^(j-k) r_{i,j}``; ``A^S_{i,k}`` = the same normalisation of
    ``G_{i,k}`` within its anchor group. ``A_{i,k} = A^E_i + omega A^S_{i,k}``, on turn k's
    sampled tokens; mask-0 tokens get 0. A singleton group or anchor group gives 0 (so with no
    repeated state, GiGPO is exactly the episode-level advantage); a ``None`` key (unknown state)
    is its own singleton. std is unbiased (n-1). ``stats`` (a dict) receives ``anchor_groups``,
    ``anchor_turns_shared`` (turns in anchor groups of size > 1) and ``anchor_group_size_max``.
    B sequences in, B per-token lists out.
    """
    n = len(turn_rewards)
    _check(turn_ids, loss_masks, n)
    if len(group_ids) != n or len(state_keys) != n:
        raise ValueError(f"{len(group_ids)} group ids and {len(state_keys)} state-key lists for {n} sequences")
    for i, (r, keys) in enumerate(zip(turn_rewards, state_keys)):
        if len(keys) != len(r):
            raise ValueError(f"sequence {i}: {len(r)} turn rewards but {len(keys)} state keys")
    episode: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        episode[g].append(i)
    a_ep = [0.0] * n
    for members in episode.values():
        for i, a in zip(members, _normalized([math.fsum(turn_rewards[i]) for i in members], normalize_std, eps)):
            a_ep[i] = a
    returns = [_discounted_suffix(r, gamma) for r in turn_rewards]
    anchors: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for i, (g, keys) in enumerate(zip(group_ids, state_keys)):
        for k, key in enumerate(keys):
            anchors[(g, key) if key is not None else (g, None, i, k)].append((i, k))
    a_step = [[0.0] * len(r) for r in turn_rewards]
    for members in anchors.values():
        for (i, k), a in zip(members, _normalized([returns[i][k] for i, k in members], normalize_std, eps)):
            a_step[i][k] = a
    if stats is not None:
        sizes = [len(m) for m in anchors.values()]
        stats.update(
            anchor_groups=len(sizes),
            anchor_turns_shared=sum(s for s in sizes if s > 1),
            anchor_group_size_max=max(sizes, default=0),
        )
    per_turn = [[a_ep[i] + omega * a for a in row] for i, row in enumerate(a_step)]
    return _spread(per_turn, turn_ids, loss_masks)


def _whiten_sampled(
    rows: list[list[float]], loss_masks: Sequence[Sequence[int]], eps: float = 1e-8
) -> list[list[float]]:
    """Whiten the mask-1 entries of ``rows`` together (unbiased var); mask-0 entries stay 0."""
    sel = [x for row, mask in zip(rows, loss_masks) for x, m in zip(row, mask) if m]
    if len(sel) < 2:
        return [[0.0] * len(row) for row in rows]
    mean = math.fsum(sel) / len(sel)
    scale = 1.0 / math.sqrt(math.fsum((x - mean) ** 2 for x in sel) / (len(sel) - 1) + eps)
    return [[(x - mean) * scale if m else 0.0 for x, m in zip(row, mask)] for row, mask in zip(rows, loss_masks)]


def turn_boundaries(turn_ids: Sequence[int], loss_mask: Sequence[int], *, num_turns: int | None = None) -> list[int]:
    """For each turn k, the index of the token whose (causal) value is V(state before turn k):
    the token just before turn k's first sampled token. A turn with no sampled token uses the
    token before its first token (or the last token if it has none). ``num_turns`` defaults to
    ``max(turn_ids) + 1``. One sequence's ``[T]`` lists -> ``[K]`` indices."""
    if len(turn_ids) != len(loss_mask):
        raise ValueError(f"len(turn_ids)={len(turn_ids)} != len(loss_mask)={len(loss_mask)}")
    K = num_turns if num_turns is not None else max(turn_ids, default=-1) + 1
    first_sampled: dict[int, int] = {}
    first_any: dict[int, int] = {}
    for t, (k, m) in enumerate(zip(turn_ids, loss_mask)):
        first_any.setdefault(k, t)
        if m:
            first_sampled.setdefault(k, t)
    out = []
    for k in range(K):
        start = first_sampled.get(k)
        if start is None:
            start = min((t for kk, t in first_any.items() if kk >= k), default=len(turn_ids))
        if start < 1:
            raise ValueError(f"turn {k} starts at token 0: there is no state before it to read a value at")
        out.append(start - 1)
    return out


def turn_rewards_to_tokens(
    turn_rewards: Sequence[Sequence[float]], turn_ids: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]]
) -> list[list[float]]:
    """Token-level rewards for ``advantages.gae``: ``r_k`` sits on turn k's last sampled token (on
    its last token if it sampled none); every other token gets 0. B lists in, B per-token lists out."""
    _check(turn_ids, loss_masks, len(turn_rewards))
    out = []
    for i, (r, tids, mask) in enumerate(zip(turn_rewards, turn_ids, loss_masks)):
        row = [0.0] * len(tids)
        last_sampled: dict[int, int] = {}
        last_any: dict[int, int] = {}
        for t, (k, m) in enumerate(zip(tids, mask)):
            last_any[k] = t
            if m:
                last_sampled[k] = t
        for k, rk in enumerate(r):
            pos = last_sampled.get(k, last_any.get(k))
            if pos is None:
                if rk:
                    raise ValueError(f"sequence {i}: turn {k} has reward {rk} but no tokens")
                continue
            row[pos] += float(rk)
        out.append(row)
    return out


def apply_kl_in_reward(
    turn_rewards: Sequence[Sequence[float]],
    kl: Sequence[Sequence[float]],
    turn_ids: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    *,
    beta: float,
) -> list[list[float]]:
    """KL in the reward (REINFORCE++, PPO-style): ``r_k' = r_k - beta * sum_{t in turn k, mask 1} kl_t``.

    ``kl``: per-token KL estimates (e.g. ``losses.k1(logp, ref_logp)`` as B lists), aligned with
    ``turn_ids``; mask-0 tokens are ignored. Returns new per-turn reward lists; apply it before any
    estimator (for sequence-level estimators sum the result per sequence).
    """
    _check(turn_ids, loss_masks, len(turn_rewards))
    out = []
    for i, (r, kls, tids, mask) in enumerate(zip(turn_rewards, kl, turn_ids, loss_masks)):
        if len(kls) != len(tids):
            raise ValueError(f"sequence {i}: {len(kls)} KL values for {len(tids)} tokens")
        per_turn = [0.0] * len(r)
        for t, (x, k, m) in enumerate(zip(kls, tids, mask)):
            if m:
                if not 0 <= k < len(r):
                    raise ValueError(
                        f"sequence {i} token {t}: sampled token in turn {k}, but the sequence has {len(r)} turns"
                    )
                per_turn[k] += float(x)
        out.append([float(rk) - beta * s for rk, s in zip(r, per_turn)])
    return out


CREDIT: dict[str, Callable[..., Any]] = {  # each scheme returns its own shape (see its function)
    "outcome": outcome_broadcast,
    "turn_return": turn_returns_group_baseline,
    "turn_gae": turn_gae,
    "gigpo": gigpo,
}
