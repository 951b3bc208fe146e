"""Variable-length ("varlen") causal attention for packed rows on any device, as an HF attention backend.

Owns: the ``varlen_sdpa`` attention implementation registered with transformers' AttentionInterface
(and a matching mask function), which runs one causal SDPA call per packed sequence. A packed row
``[1, T]`` holding sequences of lengths L1..Lk then costs sum(Li^2) attention work instead of the T^2
of a dense block-diagonal mask - on CPU (no flash-attention varlen kernels) the dense mask made packing
*slower* than padding. Sequence boundaries come from ``position_ids`` restarting at 0, the same
convention transformers uses to detect packing. Rows with a padding ``attention_mask`` (the padded
layout) fall through to plain SDPA with that mask.

Shared prefixes (``agentrl.trainer.packing``): within a sequence, a position that jumps back without
restarting at 0 (to p) starts a *branch* of the sequence's first p tokens; the branch attends to
those p tokens and causally to itself, nothing else. Its keys and values are the prefix's, so the
prefix is computed once for all its branches.

Does not: support sliding-window or soft-capped attention (raises), or KV caches (training only).
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

VARLEN_SDPA = "varlen_sdpa"


def segment_bounds(position_ids: torch.Tensor) -> list[tuple[int, int, int]]:
    """[(start, end, root)] of each run of consecutive positions in a packed row ``position_ids``
    [1, T]: a sequence (root = start) starts at position 0; a branch starts where positions jump
    back to some p > 0 and shares the first p tokens of the sequence starting at ``root``."""
    pos = position_ids[0]
    jumps = torch.ones_like(pos, dtype=torch.bool)
    jumps[1:] = pos[1:] != pos[:-1] + 1
    starts = jumps.nonzero().flatten().tolist()
    ends = [*starts[1:], pos.shape[-1]]
    out, root = [], 0
    for s, e in zip(starts, ends):
        if int(pos[s]) == 0 or s == 0:
            root = s
        out.append((s, e, root))
    return out


def _branch(module, query, key, value, s: int, e: int, root: int, p: int, **kwargs) -> torch.Tensor:
    """Attention of branch tokens [s, e) over the root's first ``p`` tokens and, causally, themselves."""
    m = e - s
    k = torch.cat([key[:, :, root : root + p], key[:, :, s:e]], dim=2)
    v = torch.cat([value[:, :, root : root + p], value[:, :, s:e]], dim=2)
    q_at = torch.arange(m, device=query.device)[:, None]
    k_at = torch.arange(p + m, device=query.device)[None, :]
    mask = (k_at < p) | (k_at - p <= q_at)
    return sdpa_attention_forward(module, query[:, :, s:e], k, v, mask[None, None], is_causal=False, **kwargs)[0]


def varlen_sdpa_attention(module, query, key, value, attention_mask, *, position_ids=None, **kwargs):
    """query/key/value [B, H, T, D] -> ([B, T, H, D], None), per-sequence causal attention when packed."""
    if kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None:
        raise NotImplementedError(
            "varlen_sdpa does not implement sliding-window/soft-capped attention; "
            "set trainer.attn_implementation to 'sdpa' or 'flash_attention_2'"
        )
    kwargs.pop("sliding_window", None)
    if attention_mask is not None or position_ids is None or query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    bounds = segment_bounds(position_ids)
    if len(bounds) == 1:
        return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)
    outs = [
        sdpa_attention_forward(
            module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None, is_causal=True, **kwargs
        )[0]
        if root == s
        else _branch(module, query, key, value, s, e, root, int(position_ids[0, s]), **kwargs)
        for s, e, root in bounds
    ]
    return torch.cat(outs, dim=1), None


def _varlen_mask(*args, attention_mask=None, **kwargs):
    # No [T, T] mask is needed for packed rows: causality and sequence separation are done per
    # segment above. With a padding mask (padded rows) build the ordinary SDPA mask.
    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


AttentionInterface.register(VARLEN_SDPA, varlen_sdpa_attention)
AttentionMaskInterface.register(VARLEN_SDPA, _varlen_mask)
