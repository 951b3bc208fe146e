"""GSPO (token form) and CISPO against hand-computed values and gradients."""

import math

import pytest
import torch

from agentrl.algos import POLICY_LOSSES, aggregate, cispo, gspo, lookup, ppo_clip, tokens_per_sequence
from agentrl.errors import ConfigError

LN2, LN3 = math.log(2), math.log(3)
SQRT2 = math.sqrt(2)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0
    )


# ---- GSPO ----------------------------------------------------------------------------------------------
# Two sequences packed back to back, old_logp = 0 so logp is the token log-ratio:
#   seq 0: tokens 0, 1    logp [ln2, 0]             mean ln2/2 -> s_0 = sqrt(2) ~ 1.41421   A = +1
#   seq 1: tokens 2, 3, 4 logp [ln3, -ln3, 0]       mean 0     -> s_1 = 1                   A = -1
#   token 5: seq 1 but mask 0 (an observation), logp 5: must not enter s_1
SEQ = torch.tensor([0, 0, 1, 1, 1, 1])
MASK = torch.tensor([1, 1, 1, 1, 1, 0])
LOGP = [LN2, 0.0, LN3, -LN3, 0.0, 5.0]
ADV = [1.0, 1.0, -1.0, -1.0, -1.0, -1.0]


def _gspo(**kw):
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    loss, m = gspo(
        logp,
        torch.zeros(6, dtype=torch.float64),
        torch.tensor(ADV, dtype=torch.float64),
        seq_index=SEQ,
        mask=MASK,
        **kw,
    )
    loss.sum().backward()
    return loss, m, logp.grad


def test_gspo_paper_ranges_clip_whole_sequences():
    # clip 3e-4 / 4e-4: s_0 = 1.414 > 1.0004 with A > 0 -> every token of seq 0 takes the clipped,
    # constant branch: l = max(-1.41421, -1.0004) = -1.0004, gradient 0.
    # s_1 = 1 is inside: l = -A s = 1 per token; d l / d logp_t = -A s_{1,t} = +1 (s_{i,t}'s
    # gradient is s_i d logp_t). Token 5 (mask 0) sees s_1 too: its value is defined, aggregate masks it.
    loss, m, grad = _gspo()
    close(loss, [-1.0004, -1.0004, 1, 1, 1, 1])
    close(grad, [0, 0, 1, 1, 1, 1])
    close(m["ratio"], [SQRT2, SQRT2, 1, 1, 1, 1])
    close(m["clipfrac"], [1, 1, 0, 0, 0, 0])
    close(m["clipfrac_high"], [1, 1, 0, 0, 0, 0])
    close(m["clipfrac_low"], [0] * 6)
    close(m["ppo_kl"], [-x for x in LOGP])


def test_gspo_wide_range_gradient_is_the_sequence_ratio_times_each_token():
    # clip .5 / .5: s_0 = 1.414 < 1.5 is inside. l_t = -A s_0 = -1.41421 for tokens 0 and 1, and
    # d l_t / d logp_t = -A s_0 = -1.41421 for each (not -A r_t = -2 / -1 as token-level PPO gives)
    loss, m, grad = _gspo(clip_low=0.5, clip_high=0.5)
    close(loss, [-SQRT2, -SQRT2, 1, 1, 1, 1])
    close(grad, [-SQRT2, -SQRT2, 1, 1, 1, 1])
    close(m["clipfrac"], [0] * 6)


def test_gspo_negative_advantage_clips_below():
    # one sequence, logp [-ln2, 0]: s = 2^-1/2 ~ .70711; A = -1, clip .2 -> clip(s) = .8
    # l = max(.70711, .8) = .8 (clipped below, no gradient)
    logp = torch.tensor([-LN2, 0.0], dtype=torch.float64, requires_grad=True)
    loss, m = gspo(
        logp,
        torch.zeros(2, dtype=torch.float64),
        -torch.ones(2, dtype=torch.float64),
        seq_index=torch.tensor([3, 3]),
        clip_low=0.2,
        clip_high=0.2,
    )
    loss.sum().backward()
    close(loss, [0.8, 0.8])
    close(logp.grad, [0, 0])
    close(m["clipfrac_low"], [1, 1])


def _sequence_level_gspo(logp, old, adv_seq, bounds, clip_low, clip_high):
    """GSPO's sequence objective written directly from the paper: -(1/G) sum_i max-clip(s_i) A_i."""
    terms = []
    for (a, b), A in zip(bounds, adv_seq):
        s = torch.exp((logp[a:b] - old[a:b]).mean())
        terms.append(torch.maximum(-A * s, -A * s.clamp(1 - clip_low, 1 + clip_high)))
    return torch.stack(terms).mean()


def test_gspo_token_with_seq_mean_token_mean_matches_sequence_gspo_gradient():
    torch.manual_seed(0)
    lengths = [3, 1, 5, 4, 2]
    bounds, start = [], 0
    for n in lengths:
        bounds.append((start, start + n))
        start += n
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    old = torch.randn(start, dtype=torch.float64) * 0.3 - 1.0
    base = old + torch.randn(start, dtype=torch.float64) * 0.25
    adv_seq = torch.tensor([1.0, -0.5, 2.0, -1.5, 0.7], dtype=torch.float64)
    adv = adv_seq[seq]
    clip = 0.1  # tight enough that some sequences clip, loose enough that others do not
    lp_tok = base.clone().requires_grad_()
    loss_tok, m = gspo(lp_tok, old, adv, seq_index=seq, clip_low=clip, clip_high=clip)
    ones = torch.ones(start)
    total = aggregate(
        "seq-mean-token-mean",
        loss_tok,
        ones,
        tokens_per_sequence(seq, ones),
        global_tokens=float(start),
        global_seqs=float(len(lengths)),
    )
    total.backward()
    lp_seq = base.clone().requires_grad_()
    ref = _sequence_level_gspo(lp_seq, old, adv_seq, bounds, clip, clip)
    ref.backward()
    close(total.detach(), ref.detach(), atol=1e-12)
    close(lp_tok.grad, lp_seq.grad, atol=1e-12)
    clipped = m["clipfrac"][[a for a, _ in bounds]]
    assert 0 < clipped.sum() < len(lengths), "the data must exercise both branches"


def test_gspo_padding_ids_and_missing_seq_index():
    # seq_index -1 (padding) joins no sequence: seq 0's ratio is exp(mean(ln2, 0)) regardless of token 2
    logp = torch.tensor([LN2, 0.0, 9.0], dtype=torch.float64)
    _, m = gspo(
        logp,
        torch.zeros(3, dtype=torch.float64),
        torch.ones(3, dtype=torch.float64),
        seq_index=torch.tensor([0, 0, -1]),
    )
    close(m["ratio"][:2], [SQRT2, SQRT2])
    with pytest.raises(ValueError, match="seq_index"):
        gspo(logp, torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="shape"):
        gspo(logp, torch.zeros(3), torch.ones(3), seq_index=torch.tensor([0, 0]))


def test_gspo_on_policy_with_one_token_per_sequence_is_ppo():
    # a sequence of one token: s_i = r_t, so GSPO-token is token-level PPO
    logp = torch.tensor([0.3, -0.1, 0.05], dtype=torch.float64)
    old = torch.zeros(3, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    a, _ = gspo(logp, old, adv, seq_index=torch.arange(3), clip_low=0.2, clip_high=0.2)
    b, _ = ppo_clip(logp, old, adv, clip_low=0.2, clip_high=0.2)
    close(a, b, atol=1e-12)


# ---- CISPO ---------------------------------------------------------------------------------------------
# old_logp = 0, logp = ln r; clip_high .2, no lower bound:
#   r   = [.5,  1.1, 1.5, .5,  1.5]      A = [1, 1, 1, -1, -1]
#   w   = [.5,  1.1, 1.2, .5,  1.2]      (only the top is capped)
#   l   = -w A ln r = [.5 ln2, -1.1 ln1.1, -1.2 ln1.5, -.5 ln2, 1.2 ln1.5]
#   dl/dlogp = -w A (w is a constant: no term from the ratio's own dependence on logp)
R = [0.5, 1.1, 1.5, 0.5, 1.5]
A_C = [1.0, 1.0, 1.0, -1.0, -1.0]


def _cispo(**kw):
    logp = torch.log(torch.tensor(R, dtype=torch.float64)).requires_grad_()
    loss, m = cispo(logp, torch.zeros(5, dtype=torch.float64), torch.tensor(A_C, dtype=torch.float64), **kw)
    loss.sum().backward()
    return loss, m, logp.grad


def test_cispo_by_hand_and_stop_gradient():
    loss, m, grad = _cispo(clip_high=0.2)
    close(loss, [0.5 * LN2, -1.1 * math.log(1.1), -1.2 * math.log(1.5), -0.5 * LN2, 1.2 * math.log(1.5)])
    close(grad, [-0.5, -1.1, -1.2, 0.5, 1.2])
    close(m["clipfrac"], [0, 0, 1, 0, 1])
    close(m["clipfrac_high"], [0, 0, 1, 0, 1])
    close(m["clipfrac_low"], [0] * 5)
    close(m["ratio"], R)
    # PPO drops token 2 (A > 0, r above the range: gradient 0); CISPO keeps it with weight 1.2
    lp = torch.log(torch.tensor(R, dtype=torch.float64)).requires_grad_()
    ppo_loss, _ = ppo_clip(lp, torch.zeros(5, dtype=torch.float64), torch.tensor(A_C, dtype=torch.float64))
    ppo_loss.sum().backward()
    assert lp.grad[2] == 0 and grad[2] == pytest.approx(-1.2)


def test_cispo_lower_bound():
    # clip_low .2: w floors at .8 for r = .5 -> grad [-.8, ..., .8, ...]
    loss, m, grad = _cispo(clip_low=0.2, clip_high=0.2)
    close(grad, [-0.8, -1.1, -1.2, 0.8, 1.2])
    close(m["clipfrac_low"], [1, 0, 0, 1, 0])
    # clip_low >= 1: no lower bound, same as None
    _, _, grad_none = _cispo(clip_low=1.0, clip_high=0.2)
    close(grad_none, [-0.5, -1.1, -1.2, 0.5, 1.2])


def test_cispo_on_policy_is_reinforce():
    # r = 1: l = -A logp, gradient -A (REINFORCE)
    logp = torch.tensor([-0.7, -2.0], dtype=torch.float64, requires_grad=True)
    loss, _ = cispo(logp, logp.detach(), torch.tensor([2.0, -1.0], dtype=torch.float64))
    loss.sum().backward()
    close(loss, [1.4, -2.0])
    close(logp.grad, [-2.0, 1.0])
    with pytest.raises(ConfigError, match="-0.1"):
        cispo(logp, logp.detach(), torch.ones(2), clip_high=-0.1)


def test_registered_and_callable_like_the_trainer_calls_them():
    assert lookup("policy_loss", "gspo") is gspo and lookup("policy_loss", "cispo") is cispo
    assert {"gspo", "cispo"} <= set(POLICY_LOSSES)
    # the trainer passes (logp, old, adv, clip_low=..., clip_high=...) on [N] tensors; gspo also seq_index=...
    n = 4
    logp, old, adv = torch.zeros(n, requires_grad=True), torch.zeros(n), torch.ones(n)
    for name, extra in (("cispo", {}), ("gspo", {"seq_index": torch.tensor([0, 0, 1, 1])})):
        loss, metrics = POLICY_LOSSES[name](logp, old, adv, clip_low=0.2, clip_high=0.28, **extra)
        assert loss.shape == (n,) and all(v.shape == (n,) for v in metrics.values())
