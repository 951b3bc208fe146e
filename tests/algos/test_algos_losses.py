"""Per-token losses, aggregation, KL, entropy, value loss and TIS against hand-computed numbers."""

import math

import pytest
import torch

import agentrl.algos as algos
from agentrl.algos import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    aggregate,
    entropy_from_logits,
    k1,
    k2,
    k3,
    logprobs_from_logits,
    mismatch_metrics,
    ppo_clip,
    sft,
    tokens_per_sequence,
    truncated_is_weights,
    value_loss,
    vanilla_pg,
)
from agentrl.errors import ConfigError

LN2, LN3 = math.log(2), math.log(3)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0
    )


# ---- PPO clip ------------------------------------------------------------------------------------------
# old_logp = 0 and logp = log(r), so the ratio is exactly the chosen r
RATIOS = [0.5, 0.9, 1.1, 1.25, 1.3, 0.5, 0.75, 1.3, 5.0]
ADV = [1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0]


def _ppo(**kw):
    logp = torch.log(torch.tensor(RATIOS, dtype=torch.float64)).requires_grad_()
    loss, m = ppo_clip(
        logp, torch.zeros(len(RATIOS), dtype=torch.float64), torch.tensor(ADV, dtype=torch.float64), **kw
    )
    loss.sum().backward()
    return loss, m, logp.grad


def test_ppo_clip_symmetric():
    # clip 0.2 -> clip(r) in [0.8, 1.2]; l = max(-A r, -A clip(r))
    # A=+1: r=.5 -> max(-.5, -.8) = -.5 | .9 -> -.9 | 1.1 -> -1.1 | 1.25 -> max(-1.25,-1.2) = -1.2 (clipped)
    #        1.3 -> max(-1.3, -1.2) = -1.2 (clipped)
    # A=-1: r=.5 -> max(.5, .8) = .8 (clipped) | .75 -> max(.75, .8) = .8 (clipped) | 1.3 -> max(1.3, 1.2) = 1.3
    #        5 -> max(5, 1.2) = 5
    loss, m, grad = _ppo()
    close(loss, [-0.5, -0.9, -1.1, -1.2, -1.2, 0.8, 0.8, 1.3, 5.0])
    close(m["clipfrac"], [0, 0, 0, 1, 1, 1, 1, 0, 0])
    close(m["clipfrac_high"], [0, 0, 0, 1, 1, 0, 0, 0, 0])
    close(m["clipfrac_low"], [0, 0, 0, 0, 0, 1, 1, 0, 0])
    close(m["dual_clipfrac"], [0] * 9)
    close(m["ratio"], RATIOS)
    close(m["ppo_kl"], [-math.log(r) for r in RATIOS])
    # d(-A r)/dlogp = -A r where unclipped; 0 where the clipped (constant) branch is active
    close(grad, [-0.5, -0.9, -1.1, 0, 0, 0, 0, 1.3, 5.0])


def test_ppo_clip_higher_asymmetric():
    # DAPO: clip_low .2, clip_high .28 -> clip(r) in [0.8, 1.28]
    # A=+1, r=1.25 now unclipped (-1.25); r=1.3 clipped at -1.28; A=-1 side unchanged (lower bound .8)
    loss, m, grad = _ppo(clip_low=0.2, clip_high=0.28)
    close(loss, [-0.5, -0.9, -1.1, -1.25, -1.28, 0.8, 0.8, 1.3, 5.0])
    close(m["clipfrac"], [0, 0, 0, 0, 1, 1, 1, 0, 0])
    close(grad, [-0.5, -0.9, -1.1, -1.25, 0, 0, 0, 1.3, 5.0])


def test_ppo_dual_clip():
    # c = 3: for A < 0, l = min(l, -A c) = min(l, 3): r=5 -> min(5, 3) = 3 (dual clipped, no gradient);
    # r=1.3 -> min(1.3, 3) = 1.3; A > 0 tokens are untouched
    loss, m, grad = _ppo(dual_clip_c=3.0)
    close(loss, [-0.5, -0.9, -1.1, -1.2, -1.2, 0.8, 0.8, 1.3, 3.0])
    close(m["dual_clipfrac"], [0, 0, 0, 0, 0, 0, 0, 0, 1])
    close(grad, [-0.5, -0.9, -1.1, 0, 0, 0, 0, 1.3, 0])
    with pytest.raises(ConfigError, match="dual_clip_c"):
        ppo_clip(torch.zeros(1), torch.zeros(1), torch.ones(1), dual_clip_c=0.5)


def test_ppo_zero_advantage_gives_zero_loss_even_for_huge_ratio():
    # a mask-0 token has A = 0; the log-ratio clamp keeps r finite, so -0 * r is 0, not nan
    loss, m = ppo_clip(torch.tensor([500.0]), torch.tensor([0.0]), torch.tensor([0.0]))
    assert loss.item() == 0.0 and m["ratio"].item() == pytest.approx(math.exp(20))


def test_vanilla_pg_and_sft():
    # vanilla: -A r: r = [.5, 2], A = [1, -1] -> [-.5, 2]; sft: -logp
    logp = torch.log(torch.tensor([0.5, 2.0]))
    loss, m = vanilla_pg(logp, torch.zeros(2), torch.tensor([1.0, -1.0]), clip_low=0.2)
    close(loss, [-0.5, 2.0])
    close(m["ratio"], [0.5, 2.0])
    loss, m = sft(torch.tensor([-0.5, -2.0]), torch.zeros(2), torch.zeros(2), clip_high=0.28)
    close(loss, [0.5, 2.0])
    assert m == {}
    assert set(POLICY_LOSSES) >= {"ppo_clip", "sft", "vanilla_pg"}


# ---- aggregation -----------------------------------------------------------------------------------------
# micro-batch 1: seq0 loss [1,2,3] mask [1,1,1]; seq1 loss [inf, 4] mask [0,1] (inf on a masked token)
# micro-batch 2: seq2 loss [5,6,nan,8] mask [1,1,0,1]
# step totals: global_tokens = 3 + 1 + 3 = 7, global_seqs = 3; per-seq masked sums 6, 4, 19 (total 29)
MB1 = dict(
    loss_tok=torch.tensor([1.0, 2.0, 3.0, math.inf, 4.0]),
    mask=torch.tensor([1, 1, 1, 0, 1]),
    seq_ntokens=torch.tensor([3.0, 3.0, 3.0, 1.0, 1.0]),
)
MB2 = dict(
    loss_tok=torch.tensor([5.0, 6.0, math.nan, 8.0]),
    mask=torch.tensor([1, 1, 0, 1]),
    seq_ntokens=torch.tensor([3.0, 3.0, 3.0, 3.0]),
)
EXPECTED = {
    "token-mean": 29 / 7,  # (6 + 4 + 19) / 7
    "seq-mean-token-sum": 29 / 3,  # (6 + 4 + 19) / 3
    "seq-mean-token-mean": (6 / 3 + 4 / 1 + 19 / 3) / 3,  # = 37/9 = 4.111...
    "seq-mean-token-sum-norm": 29 / (3 * 4),  # norm_len 4
}


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_aggregation_micro_batches_sum_to_full_batch(mode):
    kw = dict(global_tokens=7, global_seqs=3, norm_len=4)
    a, b = aggregate(mode, **MB1, **kw), aggregate(mode, **MB2, **kw)
    full = aggregate(mode, **{k: torch.cat([MB1[k], MB2[k]]) for k in MB1}, **kw)
    assert math.isfinite(a.item()) and math.isfinite(b.item())
    close(a + b, EXPECTED[mode])
    close(full, EXPECTED[mode])


def test_aggregation_gradients_accumulate_to_full_batch_gradient():
    w = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], requires_grad=True)
    mask = torch.tensor([1, 0, 1, 1, 1, 0, 1])
    seq = torch.tensor([0, 0, 0, 1, 2, 2, 2])
    ntok = tokens_per_sequence(seq, mask)
    close(ntok, [2, 2, 2, 1, 2, 2, 2])
    kw = dict(global_tokens=5, global_seqs=3)
    full_grad = torch.autograd.grad(aggregate("seq-mean-token-mean", w**2, mask, ntok, **kw), w)[0]
    acc = torch.zeros(7)
    for sl in (slice(0, 4), slice(4, 7)):
        acc[sl] += torch.autograd.grad(aggregate("seq-mean-token-mean", w[sl] ** 2, mask[sl], ntok[sl], **kw), w)[0][sl]
    close(acc, full_grad)
    # d/dw (w^2 / n_seq / 3) = 2w / (n_seq * 3) on sampled tokens, 0 on masked ones
    close(full_grad, [2 / 6, 0, 6 / 6, 8 / 3, 10 / 6, 0, 14 / 6])


def test_aggregation_errors():
    assert set(AGGREGATIONS) == set(EXPECTED)
    with pytest.raises(ConfigError, match="token-mean"):
        aggregate("token-sum", **MB1, global_tokens=7, global_seqs=3)
    with pytest.raises(ConfigError, match="norm_len"):
        aggregate("seq-mean-token-sum-norm", **MB1, global_tokens=7, global_seqs=3)
    with pytest.raises(ValueError):
        aggregate("token-mean", **MB1, global_tokens=0, global_seqs=3)


# ---- KL, entropy, log-probs ---------------------------------------------------------------------------------


def test_kl_estimators_by_hand():
    # token 0: pi = .5, ref = .25: k1 = ln2 = .693147; k2 = .5 ln2^2 = .240227; d = ref-logp = -ln2 -> k3 = .5 + ln2
    # - 1 = .193147
    # token 1: pi = .25, ref = .5: k1 = -ln2; k2 = .240227; d = ln2 -> k3 = 2 - ln2 - 1 = .306853
    # token 2: equal -> 0
    logp = torch.log(torch.tensor([0.5, 0.25, 0.3]))
    ref = torch.log(torch.tensor([0.25, 0.5, 0.3]))
    close(k1(logp, ref), [LN2, -LN2, 0.0])
    close(k2(logp, ref), [0.5 * LN2**2, 0.5 * LN2**2, 0.0])
    close(k3(logp, ref), [0.5 + LN2 - 1, 2 - LN2 - 1, 0.0])
    assert set(KL_ESTIMATORS) >= {"k1", "k3"}


def test_k3_expectation_is_the_kl_and_the_clamp():
    # p = [.5, .25, .25], q = [.25, .5, .25]: KL(p||q) = .5 ln2 + .25 ln(.5) + 0 = .25 ln2 = .173287
    p, q = torch.tensor([0.5, 0.25, 0.25]), torch.tensor([0.25, 0.5, 0.25])
    close((p * k3(p.log(), q.log())).sum(), 0.25 * LN2)
    close((p * k1(p.log(), q.log())).sum(), 0.25 * LN2)
    # ref - logp = 50 -> clamped to 20 -> exp(20) - 21 -> result clamped to 10; never negative
    out = k3(torch.tensor([-50.0, 0.0]), torch.tensor([0.0, -50.0]))
    close(out, [10.0, min(10.0, math.exp(-20) + 20 - 1)])
    assert torch.isfinite(out).all()


def test_entropy_of_known_distributions():
    # uniform over 4: ln 4 = 1.386294; [.5, .25, .25]: .5 ln2 + 2 * .25 ln4 = 1.5 ln2 = 1.039721
    logits = torch.stack([torch.zeros(4), torch.log(torch.tensor([0.5, 0.25, 0.25, 1e-30]))])
    close(entropy_from_logits(logits), [math.log(4), 1.5 * LN2])
    close(entropy_from_logits(logits + 1000.0), [math.log(4), 1.5 * LN2], atol=1e-4)  # shift-invariant, no overflow
    close(entropy_from_logits(torch.tensor([[100.0, 0.0, 0.0]])), [0.0], atol=1e-6)
    assert entropy_from_logits(torch.zeros(2, 4, dtype=torch.bfloat16)).dtype == torch.float32


def test_logprobs_from_logits():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]])) + 3.0
    close(logprobs_from_logits(logits, torch.tensor([0, 2])), [math.log(0.5), math.log(0.7)])


# ---- value loss -------------------------------------------------------------------------------------------


def test_value_loss_clipping():
    # old = .5, clip .2 -> clipped value in [.3, .7]
    # t0: v=1, R=2: (1-2)^2 = 1; clipped v .7: (.7-2)^2 = 1.69 -> .5 * 1.69 = .845 (clipped branch wins)
    # t1: v=1, R=0: 1 vs (.7-0)^2 = .49 -> .5
    # t2: v=0, R=.45: .2025 vs (.3-.45)^2 = .0225 -> .10125
    v = torch.tensor([1.0, 1.0, 0.0], requires_grad=True)
    old, ret = torch.tensor([0.5, 0.5, 0.5]), torch.tensor([2.0, 0.0, 0.45])
    loss = value_loss(v, old, ret, clip=0.2)
    close(loss, [0.845, 0.5, 0.10125])
    loss.sum().backward()
    close(v.grad, [0.0, 1.0, -0.45])  # clipped branch is constant in v; else (v - R)
    close(value_loss(v, old, ret, clip=None), [0.5, 0.5, 0.10125])


# ---- truncated IS and mismatch metrics ---------------------------------------------------------------------


def test_truncated_is_weights_cap():
    # ratios train/behaviour = [.5/.5, .9/.3, .3/.6] = [1, 3, .5] -> cap 2 -> [1, 2, .5]
    train = torch.log(torch.tensor([0.5, 0.9, 0.3])).requires_grad_()
    behaviour = torch.log(torch.tensor([0.5, 0.3, 0.6]))
    w = truncated_is_weights(train, behaviour, cap=2.0)
    close(w, [1.0, 2.0, 0.5])
    assert not w.requires_grad
    close(truncated_is_weights(train, behaviour, cap=5.0), [1.0, 3.0, 0.5])
    with pytest.raises(ConfigError):
        truncated_is_weights(train, behaviour, cap=0.0)


def test_mismatch_metrics():
    # mask [1, 1, 0]: d = train - behaviour = [0, ln3]
    # |d| mean = ln3/2 = .549306, max ln3; ratio mean (1 + 3)/2 = 2; k3 mean = (0 + 3 - ln3 - 1)/2 = .450694
    train = torch.log(torch.tensor([0.5, 0.9, 0.3]))
    behaviour = torch.log(torch.tensor([0.5, 0.3, 0.6]))
    m = mismatch_metrics(train, behaviour, torch.tensor([1, 1, 0]), cap=2.0)
    close(m["abs_diff_mean"], LN3 / 2)
    close(m["abs_diff_max"], LN3)
    close(m["ratio_mean"], 2.0)
    close(m["kl_k3"], (2 - LN3) / 2)
    close(m["frac_capped"], 0.5)
    empty = mismatch_metrics(train, behaviour, torch.zeros(3))
    assert all(v.item() == 0.0 for v in empty.values()) and "frac_capped" not in empty


def test_docstring_documents_every_registered_name():
    for reg in algos.REGISTRIES.values():
        for name in reg:
            assert f"``{name}``" in algos.__doc__, name
