"""Token sampling of the local engine: one token per row of a logits batch.

Owns :func:`sample_tokens` (temperature, top-k / top-p, greedy rows, seeded rows) and
:func:`filter_top_k_top_p`. Pure functions of tensors and generators: they neither run the model
nor know about requests (see :mod:`agentrl.engine.local.engine`).

Conventions (the same as SGLang's ``return_logprob``): the logprob of a sampled token is that of the
distribution after temperature scaling and *before* top-k/top-p filtering; at temperature 0 (greedy)
that of the unscaled softmax.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentrl.engine.base import SamplingParams


def filter_top_k_top_p(logp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``logp`` [n, V] -> the same with tokens outside each row's top-k / top-p set at -inf.
    ``top_k`` [n] (0 = off), ``top_p`` [n]. Top-p counts mass before top-k, like SGLang; the most
    likely token always survives."""
    sorted_lp, order = logp.sort(dim=-1, descending=True)
    probs = sorted_lp.exp()
    rank = torch.arange(logp.shape[-1])[None, :]
    drop = (probs.cumsum(-1) - probs) > top_p[:, None]
    drop |= (top_k[:, None] > 0) & (rank >= top_k[:, None])
    sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
    return torch.full_like(logp, float("-inf")).scatter_(-1, order, sorted_lp)


def sample_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    shared: torch.Generator,
) -> tuple[list[int], list[float]]:
    """One token per row of ``logits`` [n, V] under ``params[i]``; (token ids, their logprobs).

    Sampled rows use inverse-CDF sampling with one uniform each, drawn from ``generators[i]`` when
    it is given (a seeded request: its samples then do not depend on the rest of the batch), else
    from ``shared``. Greedy rows (temperature 0) take the argmax and draw nothing."""
    temps = torch.tensor([p.temperature for p in params])
    greedy = temps == 0
    logp = torch.log_softmax(logits / torch.where(greedy, 1.0, temps)[:, None], dim=-1)
    tokens = logits.argmax(dim=-1)
    rand = (~greedy).nonzero().flatten().tolist()
    if rand:
        lp = logp[rand]
        top_k = torch.tensor([params[i].top_k for i in rand])
        top_p = torch.tensor([params[i].top_p for i in rand])
        if bool((top_k > 0).any() or (top_p < 1).any()):
            lp = filter_top_k_top_p(lp, top_k, top_p)
        u = torch.rand(len(rand), generator=shared)
        for j, i in enumerate(rand):
            if generators[i] is not None:
                u[j] = torch.rand(1, generator=generators[i])[0]
        cdf = lp.exp().cumsum(dim=-1)
        x = (u * cdf[:, -1])[:, None]
        tokens[rand] = torch.searchsorted(cdf, x, right=True).flatten().clamp_(max=logits.shape[-1] - 1)
    chosen = logp.gather(1, tokens[:, None]).flatten().tolist()
    return tokens.tolist(), chosen
