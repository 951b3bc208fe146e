"""Per-token losses, KL estimators, entropy, value loss, loss aggregation and the engine/trainer
mismatch correction, as pure functions over FLAT packed tokens ``[N]``.

Owns: the ``POLICY_LOSSES``, ``AGGREGATIONS`` and ``KL_ESTIMATORS`` registries and the per-token
helpers the trainer composes into one step's loss. Every per-token function returns a value at
every position, mask-0 ones included; masking happens once, in ``aggregate``. A loss that needs a
per-sequence quantity (``gspo``'s sequence ratio) forms it from ``seq_index [N]`` (each token's
sequence id; sequences back to back, ``-1`` = padding) with scatter-adds, never a Python loop.

Does not: compute advantages (``advantages``/``credit``), run models, reduce across ranks or
micro-batches (``aggregate`` returns one micro-batch's share; the trainer sums the shares).

Numerical guards (documented because they change gradients at extremes):

* log-ratios ``logp - old_logp`` (PPO) and ``train - behaviour`` (TIS) are clamped to
  ``[-20, 20]`` before ``exp``, so a ratio is finite (at most ``e^20``).
* ``k3`` clamps ``ref - logp`` to ``[-20, 20]`` and the result to ``[0, 10]`` (as verl's
  ``low_var_kl``): a token whose k3 exceeds 10 contributes 10 and no gradient.
* entropy and log-probs are computed in float32 at least (bf16 logits are upcast).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from agentrl.errors import ConfigError

__all__ = [
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
]

_LOG_RATIO_CLAMP = 20.0


# -- policy losses: (logp [N], old_logp [N], adv [N], **kw) -> (loss [N], metrics {name: [N]}) ----------


def ppo_clip(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip_c: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with asymmetric (DAPO clip-higher) and optional dual clip. All ``[N]``.

    ``r = exp(logp - old_logp)``; ``l = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``;
    with ``dual_clip_c = c > 1``: for ``A < 0``, ``l = min(l, -A c)`` (caps the loss of a token whose
    ratio ran far above 1 on a negative advantage). Metrics (detached, per token, float 0/1 unless
    said): ``clipfrac`` (the clipped branch is active), ``clipfrac_high`` (A > 0, r > 1 + clip_high),
    ``clipfrac_low`` (A < 0, r < 1 - clip_low), ``dual_clipfrac``, ``ratio`` (float),
    ``ppo_kl`` (``old_logp - logp``, float).
    """
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ConfigError(f"dual_clip_c must be > 1, got {dual_clip_c!r}")
    log_ratio = (logp - old_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(l1, l2)
    neg = adv < 0
    dual = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip_c is not None:
        l3 = -adv * dual_clip_c
        dual = neg & (loss > l3)
        loss = torch.where(neg, torch.minimum(loss, l3), loss)
    with torch.no_grad():
        clipped = l2 > l1
        metrics = {
            "clipfrac": clipped.float(),
            "clipfrac_high": (clipped & (adv > 0)).float(),
            "clipfrac_low": (clipped & neg).float(),
            "dual_clipfrac": dual.float(),
            "ratio": ratio.detach(),
            "ppo_kl": -log_ratio.detach(),
        }
    return loss, metrics


def vanilla_pg(logp: Tensor, old_logp: Tensor, adv: Tensor, **_) -> tuple[Tensor, dict[str, Tensor]]:
    """Unclipped importance-weighted policy gradient: ``l = -A exp(logp - old_logp)``; ``[N]``.
    Its gradient is REINFORCE's ``-A grad logp`` when on-policy (ratio 1). Metrics: ``ratio``."""
    ratio = torch.exp((logp - old_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    return -adv * ratio, {"ratio": ratio.detach()}


def sft(logp: Tensor, old_logp: Tensor, adv: Tensor, **_) -> tuple[Tensor, dict[str, Tensor]]:
    """Supervised fine-tuning through the same trainer: ``l = -logp`` (NLL); ``[N]``. Ignores
    ``old_logp`` and ``adv`` (pass zeros)."""
    return -logp, {}


def _seq_mean(x: Tensor, seq_index: Tensor, mask: Tensor) -> Tensor:
    """Per token, the mean of ``x`` over the mask-1 tokens of its sequence (0 for a sequence with none).
    ``seq_index`` < 0 (padding) counts in no sequence. All ``[N]``."""
    idx = seq_index.to(torch.int64)
    w = mask.to(torch.bool) & (idx >= 0)
    idx = idx.clamp(min=0)
    k = int(idx.max()) + 1 if idx.numel() else 0
    xs = torch.where(w, x, torch.zeros_like(x)).to(torch.float64)
    total = torch.zeros(k, dtype=torch.float64, device=x.device).index_add_(0, idx, xs)
    count = torch.zeros(k, dtype=torch.float64, device=x.device).index_add_(0, idx, w.to(torch.float64))
    return (total / count.clamp(min=1.0))[idx].to(x.dtype)


def gspo(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    *,
    seq_index: Tensor | None = None,
    mask: Tensor | None = None,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Group Sequence Policy Optimization), in its token form "GSPO-token". All ``[N]``.

    ``seq_index [N]`` (required, int64): each token's sequence id, sequences packed back to back
    (``-1`` = padding); ``mask [N]`` (default all 1): which tokens are the sequence's sampled
    response. Per sequence i, the length-normalised importance ratio over its mask-1 tokens::

        s_i     = exp( mean_{t in i, m_t = 1} (logp_t - old_logp_t) )
        s_{i,t} = sg[s_i] * exp(logp_t - sg[logp_t])       (value s_i, d s_{i,t} = s_i d logp_t)
        l_t     = max(-A_t s_{i,t}, -A_t clip(s_{i,t}, 1 - clip_low, 1 + clip_high))

    The clip decision is per sequence (every token of i sees the same ratio ``s_i``); GSPO's ranges
    are tiny (paper: 3e-4 / 4e-4, the defaults). Aggregate with ``seq-mean-token-mean``: then, with
    one advantage per sequence (``outcome`` credit), the gradient is exactly sequence-level GSPO's
    ``-(1/G) sum_i A_i grad s_i`` with ``grad s_i = s_i mean_t grad logp_t``; a per-token ``A_t``
    (turn credit) is the GSPO-token generalisation. The per-token log-ratios are clamped to
    [-20, 20] before the mean (as elsewhere here). Metrics: ``clipfrac``, ``clipfrac_high``
    (A > 0, s > 1 + clip_high), ``clipfrac_low`` (A < 0, s < 1 - clip_low), ``ratio`` (the token's
    sequence ratio s_i), ``ppo_kl`` (``old_logp - logp`` per token).
    """
    if seq_index is None:
        raise ValueError("gspo needs seq_index [N] (each token's sequence id): the caller must pass it")
    if seq_index.shape != logp.shape:
        raise ValueError(f"gspo: seq_index shape {tuple(seq_index.shape)} != logp shape {tuple(logp.shape)}")
    m = torch.ones_like(logp, dtype=torch.bool) if mask is None else mask.to(torch.bool)
    log_ratio = (logp - old_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    log_s = _seq_mean(log_ratio.detach(), seq_index, m)
    s_tok = torch.exp(log_s + logp - logp.detach())
    l1 = -adv * s_tok
    l2 = -adv * s_tok.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(l1, l2)
    with torch.no_grad():
        clipped = l2 > l1
        metrics = {
            "clipfrac": clipped.float(),
            "clipfrac_high": (clipped & (adv > 0)).float(),
            "clipfrac_low": (clipped & (adv < 0)).float(),
            "ratio": torch.exp(log_s),
            "ppo_kl": -log_ratio.detach(),
        }
    return loss, metrics


def cispo(
    logp: Tensor, old_logp: Tensor, adv: Tensor, *, clip_low: float | None = None, clip_high: float = 0.2
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1): REINFORCE with a clipped, stop-gradient importance weight. All ``[N]``.

    ``r = exp(logp - old_logp)``; ``w = sg(clip(r, 1 - clip_low, 1 + clip_high))``;
    ``l = -w A logp``, so ``grad l = -w A grad logp``: unlike PPO, a token whose ratio left the
    range still gets a gradient (its weight is capped, the token is not dropped). ``clip_low=None``
    (or >= 1) puts no lower bound on ``w`` (the paper's choice). The loss value is a surrogate
    (it depends on ``logp``'s magnitude); only its gradient is meaningful. Aggregate with
    ``token-mean`` as in the paper. Metrics: ``clipfrac`` (w != r), ``clipfrac_high``
    (r > 1 + clip_high), ``clipfrac_low`` (r < 1 - clip_low), ``ratio``, ``ppo_kl``.
    """
    if clip_high < 0 or (clip_low is not None and clip_low < 0):
        raise ConfigError(f"cispo clip_low/clip_high must be >= 0, got {clip_low!r}, {clip_high!r}")
    log_ratio = (logp - old_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    with torch.no_grad():
        ratio = torch.exp(log_ratio)
        lo = 0.0 if clip_low is None else max(1.0 - clip_low, 0.0)
        w = ratio.clamp(lo, 1.0 + clip_high)
        high, low = ratio > 1.0 + clip_high, ratio < lo
        metrics = {
            "clipfrac": (high | low).float(),
            "clipfrac_high": high.float(),
            "clipfrac_low": low.float(),
            "ratio": ratio,
            "ppo_kl": -log_ratio,
        }
    return -w * adv * logp, metrics


POLICY_LOSSES: dict[str, Callable[..., tuple[Tensor, dict[str, Tensor]]]] = {
    "ppo_clip": ppo_clip,
    "vanilla_pg": vanilla_pg,
    "sft": sft,
    "gspo": gspo,
    "cispo": cispo,
}


# -- aggregation: one micro-batch's share of the step's loss -----------------------------------------------


def _masked(loss_tok: Tensor, mask: Tensor) -> Tensor:
    # where(), not multiply: an inf/nan loss on a mask-0 token must not poison the sum
    return torch.where(mask.to(torch.bool), loss_tok, torch.zeros_like(loss_tok))


def _token_mean(loss_tok, mask, seq_ntokens, *, global_tokens, global_seqs, norm_len=None):
    return _masked(loss_tok, mask).sum() / global_tokens


def _seq_mean_token_sum(loss_tok, mask, seq_ntokens, *, global_tokens, global_seqs, norm_len=None):
    return _masked(loss_tok, mask).sum() / global_seqs


def _seq_mean_token_mean(loss_tok, mask, seq_ntokens, *, global_tokens, global_seqs, norm_len=None):
    per_tok = _masked(loss_tok, mask) / seq_ntokens.to(loss_tok.dtype).clamp(min=1.0)
    return per_tok.sum() / global_seqs


def _seq_mean_token_sum_norm(loss_tok, mask, seq_ntokens, *, global_tokens, global_seqs, norm_len=None):
    if norm_len is None or norm_len <= 0:
        raise ConfigError(f"aggregation 'seq-mean-token-sum-norm' needs norm_len > 0, got {norm_len!r}")
    return _masked(loss_tok, mask).sum() / (global_seqs * norm_len)


AGGREGATIONS: dict[str, Callable[..., Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def aggregate(
    mode: str,
    loss_tok: Tensor,
    mask: Tensor,
    seq_ntokens: Tensor,
    *,
    global_tokens: float,
    global_seqs: float,
    norm_len: float | None = None,
) -> Tensor:
    """One micro-batch's contribution ``[]`` to the step's aggregated loss; summing the
    contributions of all micro-batches (and ranks) of an optimizer step gives the loss over the
    whole step. ``loss_tok``, ``mask``, ``seq_ntokens`` are ``[N]`` packed tokens.

    * ``token-mean``:              ``sum(l m) / global_tokens``
    * ``seq-mean-token-sum``:      ``sum(l m) / global_seqs``
    * ``seq-mean-token-mean``:     ``sum(l m / seq_ntokens) / global_seqs``
    * ``seq-mean-token-sum-norm``: ``sum(l m) / (global_seqs * norm_len)`` (Dr.GRPO; constant norm_len)

    ``seq_ntokens[t]`` is the number of mask-1 tokens of token t's sequence (``tokens_per_sequence``);
    ``global_tokens`` / ``global_seqs`` count the mask-1 tokens / the sequences with at least one
    mask-1 token in the whole step (all micro-batches, all ranks).
    """
    fn = AGGREGATIONS.get(mode)
    if fn is None:
        raise ConfigError(f"unknown loss aggregation {mode!r}; choose one of {sorted(AGGREGATIONS)}")
    if global_tokens <= 0 or global_seqs <= 0:
        raise ValueError(f"aggregate needs global_tokens > 0 and global_seqs > 0, got {global_tokens}, {global_seqs}")
    return fn(loss_tok, mask, seq_ntokens, global_tokens=global_tokens, global_seqs=global_seqs, norm_len=norm_len)


def tokens_per_sequence(seq_index: Tensor, mask: Tensor) -> Tensor:
    """``seq_ntokens`` for ``aggregate``: for packed tokens with sequence index ``seq_index [N]``
    (int64, any non-negative ids), the count of mask-1 tokens of each token's sequence, ``[N]`` float."""
    idx = seq_index.to(torch.int64)
    k = int(idx.max()) + 1 if idx.numel() else 0
    counts = torch.zeros(k, dtype=torch.float32, device=idx.device).index_add_(0, idx, mask.to(torch.float32))
    return counts[idx]


# -- KL to the frozen reference (samples come from the policy) -------------------------------------------


def k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``logp - ref_logp``: unbiased, high variance, can be negative. ``[N]``."""
    return logp - ref_logp


def k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``0.5 (logp - ref_logp)^2``: biased, low variance, >= 0. ``[N]``."""
    return 0.5 * (logp - ref_logp) ** 2


def k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``exp(d) - d - 1`` with ``d = ref_logp - logp`` clamped to ``[-20, 20]``, result clamped to
    ``[0, 10]``: unbiased for KL(pi || ref) (before the clamp), low variance, >= 0. ``[N]``."""
    d = (ref_logp - logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return (torch.exp(d) - d - 1.0).clamp(0.0, 10.0)


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": k1, "k2": k2, "k3": k3}


# -- entropy, log-probs, value loss ------------------------------------------------------------------------


def _f32(x: Tensor) -> Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of ``softmax(logits)`` per row: ``logsumexp(z) - sum softmax(z) z``. ``[N, V]`` -> ``[N]``."""
    z = _f32(logits)
    return torch.logsumexp(z, dim=-1) - (F.softmax(z, dim=-1) * z).sum(-1)


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """``log softmax(logits)[labels]``: ``[N, V]``, ``[N]`` int64 -> ``[N]``."""
    z = _f32(logits)
    return z.gather(-1, labels.unsqueeze(-1).to(torch.int64)).squeeze(-1) - torch.logsumexp(z, dim=-1)


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, *, clip: float | None = 0.2) -> Tensor:
    """Clipped value loss ``0.5 max((v - R)^2, (old + clip(v - old, -c, c) - R)^2)``; with
    ``clip=None`` plain ``0.5 (v - R)^2``. All ``[N]``."""
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * unclipped
    v_clip = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.maximum(unclipped, (v_clip - returns) ** 2)


# -- engine-vs-trainer mismatch ----------------------------------------------------------------------------


def truncated_is_weights(train_logp: Tensor, behaviour_logp: Tensor, *, cap: float = 2.0) -> Tensor:
    """Truncated importance weights ``min(exp(train_logp - behaviour_logp), cap)``, no grad. ``[N]``.

    ``train_logp``: the trainer's log-probs of the sampled tokens under the policy that sampled
    them (the step's ``old_logp``); ``behaviour_logp``: the engine's. Multiply the per-token policy
    loss by these weights to correct for the engine computing slightly different probabilities.
    """
    if cap <= 0:
        raise ConfigError(f"TIS cap must be > 0, got {cap!r}")
    with torch.no_grad():
        d = (train_logp - behaviour_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        return torch.exp(d).clamp(max=cap)


def mismatch_metrics(
    train_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, *, cap: float | None = None
) -> dict[str, Tensor]:
    """Scalar diagnostics over mask-1 tokens (all 0 when there are none):
    ``abs_diff_mean``, ``abs_diff_max`` of ``train - behaviour``, ``ratio_mean`` of
    ``exp(train - behaviour)``, ``kl_k3`` = mean k3 estimate of KL(behaviour || train) (samples come
    from the engine), and with ``cap``, ``frac_capped`` (share of tokens whose TIS weight is capped)."""
    with torch.no_grad():
        m = mask.to(torch.bool)
        d = (train_logp - behaviour_logp)[m].to(torch.float64)
        zero = torch.zeros((), dtype=torch.float64)
        if d.numel() == 0:
            out = {"abs_diff_mean": zero, "abs_diff_max": zero, "ratio_mean": zero, "kl_k3": zero}
            return out | ({"frac_capped": zero} if cap is not None else {})
        dc = d.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        out = {
            "abs_diff_mean": d.abs().mean(),
            "abs_diff_max": d.abs().max(),
            "ratio_mean": torch.exp(dc).mean(),
            "kl_k3": (torch.exp(dc) - dc - 1.0).mean(),
        }
        if cap is not None:
            out["frac_capped"] = (dc > math.log(cap)).to(torch.float64).mean()
        return out
