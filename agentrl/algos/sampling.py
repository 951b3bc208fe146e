"""Which groups carry a learning signal: DAPO's dynamic sampling filter, as a pure mask.

Owns: ``dynamic_sampling_keep``. A group whose rewards are all equal gets advantage 0 from every
group-baseline estimator (GRPO, RLOO, Dr.GRPO), so training on it spends compute and dilutes
token-mean aggregation for nothing; DAPO drops such groups and samples more until the batch is
full. Does not: sample, refill the batch or count what it dropped (the caller's batching does).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from agentrl.algos.advantages import group_index

__all__ = ["dynamic_sampling_keep"]


def dynamic_sampling_keep(rewards: Tensor, group_ids: Tensor | Sequence[Hashable], *, atol: float = 0.0) -> Tensor:
    """``[B]`` rewards, ``[B]`` group ids (any keys, see ``group_index``) -> ``[B]`` bool mask of the
    sequences to keep: those whose group's rewards are not all equal, i.e.
    ``max_g r - min_g r > atol``. A group of one is dropped (it has no baseline, so no signal).
    Non-finite rewards raise ValueError naming the first bad index."""
    r = torch.as_tensor(rewards)
    if r.dim() != 1:
        raise ValueError(f"dynamic_sampling_keep: rewards must have shape [B], got {tuple(r.shape)}")
    r = r.detach().to(torch.float64)
    bad = (~torch.isfinite(r)).nonzero()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"dynamic_sampling_keep: reward {i} is {r[i].item()!r}; rewards must be finite")
    g = group_index(group_ids).to(r.device)
    if g.shape != r.shape:
        raise ValueError(f"dynamic_sampling_keep: group_ids shape {tuple(g.shape)} != rewards shape {tuple(r.shape)}")
    if atol < 0:
        raise ValueError(f"dynamic_sampling_keep: atol must be >= 0, got {atol!r}")
    k = int(g.max()) + 1 if g.numel() else 0
    hi = torch.full((k,), -torch.inf, dtype=torch.float64, device=r.device).scatter_reduce(0, g, r, "amax")
    lo = torch.full((k,), torch.inf, dtype=torch.float64, device=r.device).scatter_reduce(0, g, r, "amin")
    return (hi - lo)[g] > atol
