"""DAPO's pure pieces: the soft overlong penalty and the dynamic-sampling group filter."""

import pytest
import torch

from agentrl.algos import dynamic_sampling_keep, grpo, overlong_penalty, rloo
from agentrl.errors import ConfigError


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0
    )


def test_overlong_penalty_soft_zone_by_hand():
    # max 10, cache 4: free up to 6, then -(L - 6)/4: 7 -> -.25, 8 -> -.5, 9 -> -.75, 10 -> -1; past 10: -1
    close(overlong_penalty(torch.tensor([0, 6, 7, 8, 9, 10, 12]), 10, 4), [0, 0, -0.25, -0.5, -0.75, -1, -1])
    close(overlong_penalty([7, 10], 10, 4, factor=0.5), [-0.125, -0.5])
    assert overlong_penalty([3], 10, 4).dtype == torch.float32
    assert overlong_penalty([], 10, 4).shape == (0,)


def test_overlong_penalty_hard_and_full_zone():
    # cache 0: -1 exactly at/over the maximum
    close(overlong_penalty([9, 10, 11], 10, 0), [0, -1, -1])
    # cache = max: the whole range is the soft zone, -L/10
    close(overlong_penalty([0, 5, 10], 10, 10), [0, -0.5, -1])


@pytest.mark.parametrize(
    "args, kw, err, match",
    [
        ((10, 11), {}, ConfigError, "cache_len"),
        ((10, -1), {}, ConfigError, "cache_len"),
        ((0, 0), {}, ConfigError, "max_new_tokens"),
        ((10, 4), {"factor": -1.0}, ConfigError, "factor"),
    ],
)
def test_overlong_penalty_rejects_bad_settings(args, kw, err, match):
    with pytest.raises(err, match=match):
        overlong_penalty([1], *args, **kw)


def test_overlong_penalty_rejects_bad_lengths():
    with pytest.raises(ValueError, match=">= 0"):
        overlong_penalty([3, -1], 10, 4)
    with pytest.raises(ValueError, match=r"\[B\]"):
        overlong_penalty(torch.zeros(2, 2), 10, 4)


def test_dynamic_sampling_keep_by_hand():
    # a: {1, 0} has signal; b: {1, 1} all equal; c, d: singletons (no baseline)
    keep = dynamic_sampling_keep(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 2.0]), ["a", "a", "b", "b", "c", "d"])
    assert keep.tolist() == [True, True, False, False, False, False]
    # tensor group ids, and a tolerance for float noise
    r = torch.tensor([1.0, 1.0 + 1e-9, 0.0, 1.0], dtype=torch.float64)
    g = torch.tensor([7, 7, 3, 3])
    assert dynamic_sampling_keep(r, g).tolist() == [True, True, True, True]
    assert dynamic_sampling_keep(r, g, atol=1e-6).tolist() == [False, False, True, True]
    assert dynamic_sampling_keep(torch.zeros(0), []).shape == (0,)


def test_dynamic_sampling_keep_errors():
    with pytest.raises(ValueError, match="reward 1 is nan"):
        dynamic_sampling_keep(torch.tensor([0.0, float("nan")]), [0, 0])
    with pytest.raises(ValueError, match="shape"):
        dynamic_sampling_keep(torch.zeros(3), [0, 0])
    with pytest.raises(ValueError, match="atol"):
        dynamic_sampling_keep(torch.zeros(2), [0, 0], atol=-1.0)


def test_dropped_sequences_are_exactly_those_with_no_group_baseline_signal():
    # every dropped sequence has advantage 0 under GRPO and RLOO; every kept group has a nonzero one
    torch.manual_seed(0)
    rewards = torch.randint(0, 2, (64,)).float()
    groups = torch.randint(0, 20, (64,))
    keep = dynamic_sampling_keep(rewards, groups)
    assert 0 < keep.sum() < 64
    for adv in (grpo(rewards, groups), rloo(rewards, groups)):
        assert bool((adv[~keep] == 0).all())
        assert bool((adv[keep] != 0).all())  # binary rewards with a mixed group: nobody sits on the mean
