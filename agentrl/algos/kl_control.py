"""The KL-in-reward coefficient over a run: fixed, or adapted towards a target KL.

Owns: ``adaptive_kl_coef``, the proportional controller of Ziegler et al. (2019) that PPO-style RLHF
uses for a KL penalty in the reward: a pure ``(coef, measured KL) -> next coef`` step. Does not:
measure the KL (the caller passes the batch's mean per-sequence KL), hold the coefficient between
steps (the run does, and checkpoints it) or read configs.
"""

from __future__ import annotations

import math

from agentrl.errors import ConfigError

__all__ = ["adaptive_kl_coef"]


def adaptive_kl_coef(coef: float, kl: float, target: float, *, horizon: int, n: int, clip: float = 0.2) -> float:
    """One controller step: ``e = clip(kl / target - 1, -clip, clip)``;
    ``coef' = coef * (1 + e * n / horizon)``.

    ``kl``: the measured KL of the step (mean over its sequences of the summed per-token estimate),
    ``target``: the KL wanted, ``n``: samples in the step, ``horizon``: samples over which the
    error is corrected. A KL above the target raises the coefficient, below lowers it, by at most
    ``clip * n / horizon`` relative per step. A non-finite ``kl`` leaves ``coef`` unchanged."""
    if target <= 0:
        raise ConfigError(f"adaptive_kl_coef: target must be > 0, got {target!r}")
    if horizon < 1:
        raise ConfigError(f"adaptive_kl_coef: horizon must be >= 1, got {horizon!r}")
    if coef < 0 or n < 0 or clip < 0:
        raise ConfigError(f"adaptive_kl_coef: coef, n and clip must be >= 0, got {coef!r}, {n!r}, {clip!r}")
    if not math.isfinite(kl):
        return coef
    err = min(max(kl / target - 1.0, -clip), clip)
    return coef * (1.0 + err * n / horizon)
