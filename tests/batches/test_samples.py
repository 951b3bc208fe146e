"""build_samples' stats: how many loss tokens carry an advantage and how large it is on average
(``adv_abs_mean``: the size of the update a credit mode asks for at a given lr), by hand."""

import pytest
from test_reward_shaping import two_turns

from agentrl.batches.samples import ALGOS, build_samples


def _pair(keys=None):
    """A group of two: returns 1 (the last turn) and 0; ``keys``: both turns' state keys, shared by the two."""
    a, b = two_turns((0.0, 1.0)), two_turns((0.0, 0.0))
    for t in (a, b):
        for turn, key in zip(t.turns, keys or (None, None)):
            turn.state_key = key
    return [[a, b]]


def test_outcome_advantage_size_is_the_group_normalized_return():
    # returns 1, 0: mean 0.5, unbiased std 0.7071 -> +-0.7071 on every sampled token
    samples, stats = build_samples(_pair(), ALGOS["grpo"])
    assert stats["adv_nonzero_frac"] == 1.0
    assert stats["adv_abs_mean"] == pytest.approx(0.5 / 0.7071068, rel=1e-5)
    assert [s.advantages[2] for s in samples] == pytest.approx([0.7071068, -0.7071068], rel=1e-5)


def test_gigpo_with_shared_states_asks_for_twice_the_update():
    # both turns start from shared states: each anchor group holds returns 1, 0 (gamma 1), so the step
    # term equals the episode term and A = 2 x 0.7071 with omega 1
    _, stats = build_samples(_pair(("s0", "s1")), ALGOS["grpo"], credit="gigpo", omega=1.0)
    assert stats["anchor_turns_shared"] == 4 and stats["anchor_group_size_max"] == 2
    assert stats["adv_abs_mean"] == pytest.approx(2 * 0.7071068, rel=1e-5)


def test_empty_batch_has_no_advantage_stats():
    _, stats = build_samples([[two_turns(outcome="sandbox_error")]], ALGOS["grpo"])
    assert stats == {"excluded": 1, "samples": 0}
