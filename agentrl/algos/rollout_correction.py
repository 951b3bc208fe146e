"""Rollout corrections: what the trainer does about the engine's probabilities differing from its own.

Owns the ``ROLLOUT_CORRECTIONS`` registry. Every entry is a pure function of the per-token
log-probabilities over FLAT packed tokens ``[N]``::

    (train_logp [N], behaviour_logp [N], *, mask=None, seq_index=None, <bounds>)
        -> (weights [N] or None, metrics {name: [N] float})

``train_logp`` are the trainer's log-probs of the sampled tokens under the policy the step starts
from (the step's ``old_logp``), ``behaviour_logp`` the engine's (the policy that sampled them,
possibly some versions older in an async run, and computed by other kernels), so every function
looks at the same per-token ratio::

    rho_t = pi_train(y_t) / pi_rollout(y_t) = exp(train_logp_t - behaviour_logp_t)

(the log-ratio clamped to [-20, 20], as everywhere in ``agentrl.algos``). The trainer multiplies
the per-token policy loss by ``weights`` (no gradient flows through them; ``None``: leave the loss
as it is) and averages each metric over the step's loss tokens. ``mask [N]`` (default all 1) marks
the action tokens (loss mask 1): only they are ever counted as masked, and only they enter
``seq_reject``'s per-sequence mean; observation tokens (tool output, prompt, glue) never count.

* ``tis``: truncated importance sampling, ``w_t = min(rho_t, cap)`` (``cap`` null/0: no weights).
  Metric ``tis_weight``.
* ``icepop``: IcePop (Ling Team, "Every Step Evolves: Scaling Reinforcement Learning for
  Trillion-Scale Thinking Model", the Ring-1T report): a two-sided band on the token ratio;
  inside it the ratio stays the importance weight, outside it the token gets no gradient::

      w_t = rho_t * 1[low <= rho_t <= high]            (defaults low = 0.5, high = 5, IcePop's band)

* ``mis``: masked importance sampling as TRL's GRPOTrainer ships it
  (``vllm_importance_sampling_mode="token_mask"``): the same weight formula as ``icepop``, but
  TRL's band is one-sided by default: tokens with a ratio above the cap get no gradient, a ratio
  far below 1 keeps its (small) weight::

      w_t = rho_t * 1[rho_t <= high] * 1[rho_t >= low]  (defaults: no lower bound, high = 3, TRL's
                                                         vllm_importance_sampling_clip_max)

  With both bounds set, ``mis`` and ``icepop`` compute the same weights: the names keep each
  source's defaults (IcePop masks both tails; TRL only the upper one unless told otherwise).
* ``seq_reject``: sequence rejection on the geometric mean of the ratios (SkyRL's
  ``sequence_mask_metric=geometric``, verl's geometric rejection sampling ``rollout_rs=geometric``).
  Per sequence i, over its action tokens only::

      rho_i = exp( mean_{t in i, m_t = 1} log rho_t )
      w_t   = 1[low <= rho_i <= high]   for every token t of i   (defaults 0.99 / 1.01, SkyRL's)

  A rejected sequence loses its whole gradient; an accepted one is not reweighted (a pure
  rejection, no importance weight). Needs ``seq_index [N]`` (each token's sequence id, ``-1`` =
  padding); a sequence without action tokens has ``rho_i = 1``.
* ``none``: no correction (no weights, no metrics).

Masking functions report ``rollout_masked_frac`` (1.0 on an action token whose weight the mask set to
0; the trainer's mean over the step's loss tokens is the masked fraction) and ``rollout_weight`` (the
weight). Bounds: ``low`` in [0, 1] (0 = no lower bound), ``high`` >= 1, so every band holds ratio 1
(an on-policy token is never masked); a bound outside that raises ConfigError. A ratio exactly on a
bound is kept.

Does not: choose which log-probs are "train" (the trainer's ``old_logprobs`` setting does: with
``behaviour`` and no recorded old log-probs the ratio is 1 and nothing is masked), nor aggregate.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from agentrl.algos.losses import _LOG_RATIO_CLAMP, _seq_mean, truncated_is_weights
from agentrl.errors import ConfigError

__all__ = ["ROLLOUT_CORRECTIONS", "tis", "icepop", "mis", "seq_reject", "no_correction"]

Result = tuple[Tensor | None, dict[str, Tensor]]


def _log_ratio(train_logp: Tensor, behaviour_logp: Tensor) -> Tensor:
    return (train_logp.detach() - behaviour_logp.detach()).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)


def _check_band(name: str, low: float | None, high: float | None) -> None:
    if low is not None and not 0.0 <= low <= 1.0:
        raise ConfigError(f"{name}: lower bound {low!r} must be in [0, 1] (0 = none; the band must hold ratio 1)")
    if high is not None and not high >= 1.0:
        raise ConfigError(f"{name}: upper bound {high!r} must be >= 1 (the band must hold ratio 1)")


def _outside(log_rho: Tensor, low: float | None, high: float | None) -> Tensor:
    """``rho`` outside ``[low, high]`` (compared in log space, so a ratio exactly on a bound is kept)."""
    out = torch.zeros_like(log_rho, dtype=torch.bool)
    if low is not None and low > 0.0:
        out |= log_rho < math.log(low)
    if high is not None and math.isfinite(high):
        out |= log_rho > math.log(high)
    return out


def _action(mask: Tensor | None, like: Tensor) -> Tensor:
    return torch.ones_like(like, dtype=torch.bool) if mask is None else mask.to(torch.bool)


def _masked_weights(rho_or_one: Tensor, drop: Tensor, action: Tensor) -> Result:
    w = torch.where(drop, torch.zeros_like(rho_or_one), rho_or_one)
    return w, {"rollout_masked_frac": (drop & action).to(w.dtype), "rollout_weight": w}


def tis(train_logp: Tensor, behaviour_logp: Tensor, *, cap: float | None = None) -> Result:
    """Truncated importance sampling: ``w_t = min(rho_t, cap)`` (``truncated_is_weights``); ``cap``
    null or 0: no correction. Metric ``tis_weight``. All ``[N]``."""
    if not cap:
        return None, {}
    w = truncated_is_weights(train_logp.detach(), behaviour_logp.detach(), cap=cap)
    return w, {"tis_weight": w}


def _band(
    name: str, train_logp: Tensor, behaviour_logp: Tensor, mask: Tensor | None, low: float | None, high: float
) -> Result:
    """``w_t = rho_t`` where ``low <= rho_t <= high`` (``low`` None: no lower bound), else 0."""
    _check_band(name, low, high)
    with torch.no_grad():
        d = _log_ratio(train_logp, behaviour_logp)
        return _masked_weights(torch.exp(d), _outside(d, low, high), _action(mask, d))


def icepop(
    train_logp: Tensor, behaviour_logp: Tensor, *, mask: Tensor | None = None, low: float = 0.5, high: float = 5.0
) -> Result:
    """IcePop's two-sided token mask: ``w_t = rho_t 1[low <= rho_t <= high]`` (see the module
    docstring; defaults 0.5 / 5, the Ring-1T report's band). All ``[N]``."""
    return _band("icepop", train_logp, behaviour_logp, mask, low, high)


def mis(
    train_logp: Tensor,
    behaviour_logp: Tensor,
    *,
    mask: Tensor | None = None,
    low: float | None = None,
    high: float = 3.0,
) -> Result:
    """TRL's masked importance sampling (``token_mask``): ``w_t = rho_t 1[rho_t <= high]
    1[rho_t >= low]``; ``low`` None (or 0, TRL's default): no lower bound; ``high`` 3 (TRL's
    ``vllm_importance_sampling_clip_max``). All ``[N]``."""
    return _band("mis", train_logp, behaviour_logp, mask, low, high)


def seq_reject(
    train_logp: Tensor,
    behaviour_logp: Tensor,
    *,
    seq_index: Tensor | None = None,
    mask: Tensor | None = None,
    low: float = 0.99,
    high: float = 1.01,
) -> Result:
    """Geometric-mean sequence rejection: every token of sequence i gets ``w = 1[low <= rho_i <=
    high]``, ``rho_i = exp(mean of log rho_t over i's action tokens)`` (see the module docstring;
    defaults 0.99 / 1.01, SkyRL's). ``seq_index [N]`` is required. All ``[N]``."""
    if seq_index is None:
        raise ValueError("seq_reject needs seq_index [N] (each token's sequence id): the caller must pass it")
    if seq_index.shape != train_logp.shape:
        raise ValueError(
            f"seq_reject: seq_index shape {tuple(seq_index.shape)} != logp shape {tuple(train_logp.shape)}"
        )
    _check_band("seq_reject", low, high)
    with torch.no_grad():
        d = _log_ratio(train_logp, behaviour_logp)
        action = _action(mask, d)
        log_rho_seq = _seq_mean(d, seq_index, action)
        return _masked_weights(torch.ones_like(d), _outside(log_rho_seq, low, high), action)


def no_correction(train_logp: Tensor, behaviour_logp: Tensor) -> Result:
    """No correction: the loss is left as it is, nothing is reported."""
    return None, {}


ROLLOUT_CORRECTIONS: dict[str, Callable[..., Result]] = {
    "tis": tis,
    "icepop": icepop,
    "mis": mis,
    "seq_reject": seq_reject,
    "none": no_correction,
}
