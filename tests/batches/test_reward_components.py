"""GDPO in build_samples: episodes' named reward components (Trajectory.info["reward_components"]) become
per-token advantages by hand-worked numbers; without components the advantages are exactly today's."""

import math

import pytest
from test_reward_shaping import two_turns

from agentrl.batches.rewards import RewardShaping
from agentrl.batches.samples import ALGOS, build_samples, reward_components, token_advantages
from agentrl.errors import ConfigError

GDPO = RewardShaping(reward_normalization="gdpo")


def _episode(correct, length, group="g"):
    """Two turns; the env pays correct + length at the end and reports them as components."""
    t = two_turns((0.0, correct + length), group=group)
    t.info["reward_components"] = {"correct": correct, "length": length}
    return t


def _first_token_adv(samples):
    return [s.advantages[2] for s in samples]  # token 2: turn 0's first sampled token


def test_an_env_with_two_components_gdpo_ranks_the_correct_episodes_first():
    # the env of tests/algos/test_gdpo.py: correct [1, 0, 0, 1], length [2, 6, 0, 4] in one group
    group = [_episode(1.0, 2.0), _episode(0.0, 6.0), _episode(0.0, 0.0), _episode(1.0, 4.0)]
    # 'sum': GRPO of the returns [3, 6, 0, 5] (std sqrt 7): the wrong episode 1 gets the largest advantage
    summed, _ = build_samples([group], ALGOS["grpo"])
    s7 = math.sqrt(7.0)
    assert _first_token_adv(summed) == pytest.approx([-0.5 / s7, 2.5 / s7, -3.5 / s7, 1.5 / s7], abs=1e-6)
    # 'gdpo': A_c + A_l = [0.478727, 0.295870, -2.027921, 1.253323] (worked in test_gdpo.py) on every
    # sampled token; prompt and observation tokens keep 0
    samples, stats = build_samples([group], ALGOS["grpo"], shaping=GDPO)
    assert _first_token_adv(samples) == pytest.approx([0.478727, 0.295870, -2.027921, 1.253323], abs=1e-5)
    for s in samples:
        assert [a for a, m in zip(s.advantages, s.loss_mask) if not m] == [0.0, 0.0, 0.0]
        assert len({a for a, m in zip(s.advantages, s.loss_mask) if m}) == 1
    assert stats["gdpo/components"] == 2.0
    assert stats["gdpo/correct_mean"] == 0.5 and stats["gdpo/length_mean"] == 3.0
    # weights: length at 0 -> GRPO of correctness alone, +-sqrt(3)/2
    samples, _ = build_samples(
        [group], ALGOS["grpo"], shaping=RewardShaping(reward_normalization="gdpo", reward_weights={"length": 0.0})
    )
    h = math.sqrt(3.0) / 2
    assert _first_token_adv(samples) == pytest.approx([h, -h, -h, h], abs=1e-5)  # eps 1e-6 on the std


def test_without_components_gdpo_is_exactly_the_summed_grpo():
    # the documented default: an episode that reports no components has one, 'reward' (its env return)
    returns = {"a": (1.0, 0.0, 0.5), "b": (2.0, 2.0, -1.0)}
    groups = [[two_turns((0.0, r), group=g) for r in rs] for g, rs in returns.items()]
    names, comps = reward_components([t for g in groups for t in g], [[0.0, r] for rs in returns.values() for r in rs])
    assert names == ["reward"] and comps[:, 0].tolist() == [1.0, 0.0, 0.5, 2.0, 2.0, -1.0]
    summed, _ = build_samples(groups, ALGOS["grpo"])
    decoupled, _ = build_samples(groups, ALGOS["grpo"], shaping=GDPO)
    assert [s.advantages for s in decoupled] == [s.advantages for s in summed]  # bit for bit
    # one component that is the whole reward: the same again
    for g in groups:
        for t in g:
            t.info["reward_components"] = {"score": t.reward}
    one, _ = build_samples(groups, ALGOS["grpo"], shaping=GDPO)
    assert [s.advantages for s in one] == [s.advantages for s in summed]


def test_shaping_terms_are_their_own_component():
    # overlong punishment (max_new_tokens 2, cache 1): turn 0 samples lens[0] tokens -> 2 tokens = the
    # limit -> -1; 1 token -> 0. Episodes: correct 1 with a long turn, correct 0 with a short one.
    a, b = two_turns((0.0, 1.0), lens=(2, 1)), two_turns((0.0, 0.0), lens=(1, 1))
    for t, c in ((a, 1.0), (b, 0.0)):
        t.info["reward_components"] = {"correct": c}
    shaping = RewardShaping(max_new_tokens=2, overlong_cache_len=1, reward_normalization="gdpo")
    names, comps = reward_components([a, b], [[-1.0, 1.0], [0.0, 0.0]])
    assert names == ["correct", "shaping"] and comps.tolist() == [[1.0, -1.0], [0.0, 0.0]]
    # correct [1, 0] -> +-0.707107; shaping [-1, 0] -> -+0.707107: they cancel (the sum, [0, 0], would too)
    samples, stats = build_samples([[a, b]], ALGOS["grpo"], shaping=shaping)
    assert _first_token_adv(samples) == pytest.approx([0.0, 0.0], abs=1e-6)
    assert stats["gdpo/components"] == 2.0 and stats["gdpo/shaping_mean"] == -0.5


def test_missing_components_count_as_zero_and_shaping_is_reserved():
    a, b = _episode(1.0, 2.0), two_turns((0.0, 0.0))  # b ended without a scored step: no components
    names, comps = reward_components([a, b], [[0.0, 3.0], [0.0, 0.0]])
    assert names == ["correct", "length", "reward"] and comps.tolist() == [[1.0, 2.0, 0.0], [0.0, 0.0, 0.0]]
    a.info["reward_components"] = {"shaping": 1.0}
    with pytest.raises(ValueError, match="component named 'shaping', which is reserved"):
        reward_components([a], [[0.0, 3.0]])


def test_gdpo_needs_outcome_credit_and_grpo():
    group = [_episode(1.0, 2.0), _episode(0.0, 6.0)]
    with pytest.raises(ConfigError, match="algo.reward_normalization: 'gdpo' .* credit 'turn_return'"):
        token_advantages(group, "grpo", "turn_return", reward_normalization="gdpo")
    with pytest.raises(ConfigError, match="advantage 'rloo'"):
        token_advantages(group, "rloo", "outcome", reward_normalization="gdpo")
    with pytest.raises(ValueError, match="unknown reward normalization 'gpdo'"):
        token_advantages(group, "grpo", "outcome", reward_normalization="gpdo")
