"""The rollout corrections (TIS, IcePop, TRL's MIS, geometric sequence rejection) against numbers worked by
hand, and against the peers' documented formulas computed independently on random inputs."""

import math

import pytest
import torch

import agentrl.algos as algos
from agentrl.algos import ROLLOUT_CORRECTIONS, icepop, mis, no_correction, seq_reject, tis, truncated_is_weights
from agentrl.errors import ConfigError


def close(actual, expected, atol=1e-9):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0
    )


def ratios(*r):
    """(train_logp, behaviour_logp) whose ratio is exactly r per token: train = log r, behaviour = 0."""
    t = torch.log(torch.tensor(r, dtype=torch.float64))
    return t, torch.zeros_like(t)


R = (0.25, 0.5, 0.9, 1.0, 3.0, 5.0, 8.0)


def test_registry_lists_every_mode():
    assert sorted(ROLLOUT_CORRECTIONS) == ["icepop", "mis", "none", "seq_reject", "tis"]
    assert algos.lookup("rollout_correction", "icepop") is icepop
    with pytest.raises(ConfigError, match="unknown rollout_correction 'icepp'.*did you mean 'icepop'"):
        algos.lookup("rollout_correction", "icepp")


def test_icepop_masks_both_tails_and_keeps_the_ratio_inside():
    # default band [0.5, 5]: 0.25 < 0.5 and 8 > 5 are masked (weight 0, no gradient); the bounds
    # themselves (0.5 and 5) are kept; inside, the weight is the ratio itself (IcePop's M(k) = k)
    w, m = icepop(*ratios(*R))
    close(w, [0.0, 0.5, 0.9, 1.0, 3.0, 5.0, 0.0])
    close(m["rollout_masked_frac"], [1, 0, 0, 0, 0, 0, 1])
    close(m["rollout_weight"], w)
    # a narrower band [0.8, 2]: 0.25, 0.5, 3, 5, 8 are out
    w, m = icepop(*ratios(*R), low=0.8, high=2.0)
    close(w, [0.0, 0.0, 0.9, 1.0, 0.0, 0.0, 0.0])
    assert float(m["rollout_masked_frac"].sum()) == 5


def test_mis_is_trl_token_mask_one_sided_by_default():
    # TRL's token_mask defaults: no lower bound, cap 3 -> only 5 and 8 are masked; 0.25 keeps weight 0.25
    w, m = mis(*ratios(*R))
    close(w, [0.25, 0.5, 0.9, 1.0, 3.0, 0.0, 0.0])
    close(m["rollout_masked_frac"], [0, 0, 0, 0, 0, 1, 1])
    # low=0 is "no lower bound" too
    close(mis(*ratios(*R), low=0.0)[0], w)
    # with both bounds set it is IcePop's formula
    close(mis(*ratios(*R), low=0.5, high=5.0)[0], icepop(*ratios(*R))[0])


def test_only_action_tokens_count_as_masked():
    # token 0 (ratio 0.25) and token 6 (ratio 8) are observation tokens (mask 0): out of band, but never
    # reported as masked (the aggregation ignores their loss anyway)
    mask = torch.tensor([0, 1, 1, 1, 1, 1, 0])
    _, m = icepop(*ratios(*R), mask=mask)
    close(m["rollout_masked_frac"], [0, 0, 0, 0, 0, 0, 0])
    _, m = mis(*ratios(*R), mask=torch.tensor([1, 1, 1, 1, 1, 0, 1]))
    close(m["rollout_masked_frac"], [0, 0, 0, 0, 0, 0, 1])


def test_seq_reject_uses_the_geometric_mean_of_action_tokens_only():
    # per token log-ratios d (behaviour 0, train = d); sequences 0..3; default band [0.99, 1.01]
    #   seq 0: action d = 0.02, -0.01, 0.005 and an observation token with d = 3 (mask 0)
    #          mean over action tokens = 0.015 / 3 = 0.005 -> rho = e^0.005 = 1.00501 in band: kept
    #          (had the observation counted: 3.015 / 4 = 0.754 -> rho = 2.13 -> rejected)
    #          its first token alone has ratio e^0.02 = 1.0202 > 1.01: the decision is per sequence
    #   seq 1: d = 0.03, 0.01 -> mean 0.02 -> rho = 1.0202 > 1.01: rejected
    #   seq 2: d = -0.02, -0.01, 0 -> mean -0.01 -> rho = 0.99005 >= 0.99: kept
    #   seq 3: d = -0.03 -> rho = 0.97045 < 0.99: rejected
    d = torch.tensor([0.02, -0.01, 3.0, 0.005, 0.03, 0.01, -0.02, -0.01, 0.0, -0.03], dtype=torch.float64)
    seq = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2, 3])
    mask = torch.tensor([1, 1, 0, 1, 1, 1, 1, 1, 1, 1])
    w, m = seq_reject(d, torch.zeros_like(d), seq_index=seq, mask=mask)
    close(w, [1, 1, 1, 1, 0, 0, 1, 1, 1, 0])
    close(m["rollout_masked_frac"], [0, 0, 0, 0, 1, 1, 0, 0, 0, 1])
    # 3 of the 9 action tokens are masked
    assert float(m["rollout_masked_frac"].sum()) / int(mask.sum()) == pytest.approx(3 / 9)
    # a wider band [0.95, 1.05] keeps every sequence
    w, m = seq_reject(d, torch.zeros_like(d), seq_index=seq, mask=mask, low=0.95, high=1.05)
    close(w, [1] * 10)
    # a sequence with no action token has rho = 1 and is kept
    w, _ = seq_reject(torch.tensor([5.0]), torch.tensor([0.0]), seq_index=torch.tensor([0]), mask=torch.tensor([0]))
    close(w, [1.0])


def test_seq_reject_needs_the_sequence_index():
    with pytest.raises(ValueError, match="seq_reject needs seq_index"):
        seq_reject(*ratios(1.0, 1.0))
    with pytest.raises(ValueError, match="seq_index shape"):
        seq_reject(*ratios(1.0, 1.0), seq_index=torch.tensor([0]))


def test_tis_and_none():
    # tis: min(rho, cap); no cap -> no weights at all (today's default: the loss untouched)
    assert tis(*ratios(*R)) == (None, {})
    assert tis(*ratios(*R), cap=0.0) == (None, {})
    w, m = tis(*ratios(*R), cap=2.0)
    close(w, [0.25, 0.5, 0.9, 1.0, 2.0, 2.0, 2.0])
    close(w, truncated_is_weights(*ratios(*R), cap=2.0))
    assert set(m) == {"tis_weight"}
    assert no_correction(*ratios(*R)) == (None, {})


def test_weights_carry_no_gradient():
    train = torch.log(torch.tensor([0.9, 1.1, 7.0], dtype=torch.float64)).requires_grad_()
    beh = torch.zeros(3, dtype=torch.float64)
    for name, kw in [("tis", {"cap": 2.0}), ("icepop", {}), ("mis", {}), ("seq_reject", {"seq_index": torch.zeros(3)})]:
        w, m = ROLLOUT_CORRECTIONS[name](train, beh, **kw)
        assert not w.requires_grad and not any(v.requires_grad for v in m.values()), name


def test_ratios_are_clamped_like_every_other_log_ratio():
    # log-ratio 50 -> clamped to 20: the ratio is e^20, far outside any band, and finite
    w, m = mis(torch.tensor([50.0, -50.0]), torch.zeros(2))
    close(w, [0.0, math.exp(-20.0)], atol=1e-12)
    close(m["rollout_masked_frac"], [1, 0])


@pytest.mark.parametrize(
    "fn,kw,needle",
    [
        (icepop, {"low": 1.5}, "icepop: lower bound 1.5 must be in \\[0, 1\\]"),
        (icepop, {"low": -0.1}, "icepop: lower bound -0.1"),
        (mis, {"high": 0.5}, "mis: upper bound 0.5 must be >= 1"),
        (seq_reject, {"high": 0.999, "seq_index": torch.zeros(1)}, "seq_reject: upper bound 0.999"),
    ],
)
def test_a_band_without_ratio_one_is_a_config_error(fn, kw, needle):
    with pytest.raises(ConfigError, match=needle):
        fn(*ratios(1.0), **kw)


# ---- the peers' documented formulas, computed independently on random inputs ---------------------------


def _random_batch(seed: int, n_seqs: int = 12):
    """Packed tokens of ``n_seqs`` sequences of random length with random masks and log-ratios that
    straddle every band (|d| up to 2.5), plus the same data padded to [B, T] for the references."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 9, (n_seqs,), generator=g).tolist()
    seq = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])
    train = torch.randn(len(seq), generator=g, dtype=torch.float64) - 3.0
    d = (torch.rand(len(seq), generator=g, dtype=torch.float64) - 0.5) * 5.0
    d[torch.rand(len(seq), generator=g) < 0.5] *= 0.004  # many sequences near ratio 1 (seq_reject's band)
    beh = train - d
    mask = (torch.rand(len(seq), generator=g) < 0.8).long()
    return train, beh, seq, mask, lens


@pytest.mark.parametrize("seed", range(5))
def test_icepop_and_mis_match_the_peers_formulas_on_random_tokens(seed):
    train, beh, _, mask, _ = _random_batch(seed)
    # IcePop (Ring-1T report): M(k) = k if alpha <= k <= beta else 0, k = pi_train / pi_infer, elementwise
    want = []
    for a, b in zip(train.tolist(), beh.tolist()):
        k = math.exp(a - b)
        want.append(k if 0.5 <= k <= 5.0 else 0.0)
    close(icepop(train, beh, mask=mask)[0], want, atol=1e-12)
    # TRL GRPOTrainer, vllm_importance_sampling_mode="token_mask": ratio = exp(old - sampling) on
    # completion tokens, then masked_fill(ratio < clip_min or ratio > clip_max, 0); clip_min None means no
    # lower bound. Computed here on a [B, T]-free flat tensor with torch.where, written from the docs.
    k = torch.exp(train - beh)
    trl_default = torch.where(k > 3.0, torch.zeros_like(k), k)
    trl_both = torch.where((k < 0.2) | (k > 3.0), torch.zeros_like(k), k)
    close(mis(train, beh, mask=mask)[0], trl_default, atol=1e-12)
    close(mis(train, beh, mask=mask, low=0.2)[0], trl_both, atol=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_seq_reject_matches_verl_geometric_rejection_on_padded_sequences(seed):
    # verl rollout_corr (rollout_rs="geometric"), from its documented formula: per sequence on a padded
    # [B, T] batch with response mask m, rho_geo = exp(sum_t m log rho_t / sum_t m), accept iff
    # lower <= rho_geo <= upper; the accept flag multiplies every token of the sequence.
    train, beh, seq, mask, lens = _random_batch(seed, n_seqs=20)
    B, T = len(lens), max(lens)
    logr = torch.zeros(B, T, dtype=torch.float64)
    m = torch.zeros(B, T, dtype=torch.float64)
    start = 0
    for i, n in enumerate(lens):
        logr[i, :n] = (train - beh)[start : start + n]
        m[i, :n] = mask[start : start + n].double()
        start += n
    geo = torch.exp((logr * m).sum(1) / m.sum(1).clamp(min=1.0))
    accept = ((geo >= 0.99) & (geo <= 1.01)).double()
    want = torch.cat([accept[i].repeat(n) for i, n in enumerate(lens)])
    w, metrics = seq_reject(train, beh, seq_index=seq, mask=mask)
    close(w, want, atol=0)
    close(metrics["rollout_masked_frac"], (1 - want) * mask.double(), atol=0)
    assert 0 < want.sum() < len(want)  # both outcomes exercised
