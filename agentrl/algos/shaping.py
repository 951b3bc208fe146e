"""Reward shaping terms that depend only on a sequence's shape, not its content: DAPO's soft
overlong punishment.

Owns: ``overlong_penalty``, a pure ``[B] -> [B]`` function the caller adds to each sequence's
reward before any advantage estimator runs. Does not: decide which length counts (the number of
sampled tokens of a turn or of an episode is the caller's choice), read configs, or touch
trajectories.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from agentrl.errors import ConfigError

__all__ = ["overlong_penalty"]


def overlong_penalty(
    lengths: Tensor | Sequence[int], max_new_tokens: int, cache_len: int, *, factor: float = 1.0
) -> Tensor:
    """DAPO's soft overlong punishment: ``[B]`` generated lengths -> ``[B]`` float32 penalties <= 0.

    With ``L_max = max_new_tokens``, ``L_c = cache_len`` (the soft zone: the last ``L_c`` tokens
    before the maximum) and a sequence of length ``L``::

        0                                 if L <= L_max - L_c
        -factor * (L - (L_max - L_c)) / L_c   if L_max - L_c < L <= L_max
        -factor                           if L > L_max

    so the penalty falls linearly from 0 to ``-factor`` across the soft zone and is ``-factor``
    at the maximum (a response cut off by the length limit). ``cache_len = 0`` is the hard form:
    ``-factor`` exactly when ``L >= L_max``. Add it to the task reward (DAPO: ``factor = 1``).
    """
    if max_new_tokens < 1:
        raise ConfigError(f"overlong_penalty: max_new_tokens must be >= 1, got {max_new_tokens!r}")
    if not 0 <= cache_len <= max_new_tokens:
        raise ConfigError(
            f"overlong_penalty: cache_len must be in [0, max_new_tokens={max_new_tokens}], got {cache_len!r}"
        )
    if factor < 0:
        raise ConfigError(f"overlong_penalty: factor must be >= 0, got {factor!r}")
    n = torch.as_tensor(lengths)
    if n.dim() != 1:
        raise ValueError(f"overlong_penalty: lengths must have shape [B], got {tuple(n.shape)}")
    n = n.to(torch.float64)
    if n.numel() and bool((n < 0).any()):
        raise ValueError(f"overlong_penalty: lengths must be >= 0, got {n.min().item():g}")
    if cache_len == 0:
        over = (n >= max_new_tokens).to(torch.float64)
    else:
        over = ((n - (max_new_tokens - cache_len)) / cache_len).clamp(0.0, 1.0)
    return (-factor * over).to(torch.float32)
