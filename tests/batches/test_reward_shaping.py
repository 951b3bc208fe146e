"""Rewards before credit: KL in the reward (hand-checked), DAPO's overlong term per turn, the
adaptive KL controller, and build_samples carrying them into the advantages."""

import math

import pytest

from agentrl.algos import adaptive_kl_coef
from agentrl.batches.rewards import KLController, RewardShaping, shaped_turn_rewards
from agentrl.batches.samples import ALGOS, build_samples, has_signal
from agentrl.errors import ConfigError
from agentrl.trajectory import Trajectory, TurnRecord


def two_turns(rewards=(0.0, 1.0), logprobs=None, group="g", lens=(2, 1), outcome="ok"):
    """prompt 2 | turn 0: lens[0] sampled, 1 observation | turn 1: lens[1] sampled."""
    a, b = lens
    mask = [0, 0] + [1] * a + [0] + [1] * b
    tids = [-1, -1] + [0] * a + [-1] + [1] * b
    n = len(mask)
    turns = [TurnRecord(0, 2, a, 1, "stop", reward=rewards[0]), TurnRecord(1, 3 + a, b, 0, "stop", reward=rewards[1])]
    return Trajectory(
        "e",
        group,
        "x",
        prompt_len=2,
        token_ids=list(range(n)),
        loss_mask=mask,
        logprobs=logprobs or [0.0] * n,
        turn_ids=tids,
        versions=[0 if m else -1 for m in mask],
        turns=turns,
        reward=rewards[-1],
        outcome=outcome,
    )


def test_kl_in_reward_by_hand():
    # behaviour logprobs at the sampled tokens: turn 0 (-1.0, -2.0), turn 1 (-0.5); reference one lower
    # on the first token, equal elsewhere. k1 = logp - ref: turn 0 sums to 1.0, turn 1 to 0.
    lp = [0.0, 0.0, -1.0, -2.0, -9.0, -0.5]
    ref = [0.0, 0.0, -2.0, -2.0, 3.0, -0.5]  # the observation token's value must be ignored
    t = two_turns(logprobs=lp)
    rewards, stats = shaped_turn_rewards([t], RewardShaping(kl_coef=0.1, kl_estimator="k1"), [ref])
    assert rewards == [[pytest.approx(0.0 - 0.1 * 1.0), pytest.approx(1.0)]]
    assert stats["kl_in_reward/kl_mean"] == pytest.approx(1.0) and stats["kl_in_reward/coef"] == 0.1
    # k2 = 0.5 d^2 on the same tokens: 0.5 in turn 0
    rewards, _ = shaped_turn_rewards([t], RewardShaping(kl_coef=0.1, kl_estimator="k2"), lambda trajs: [ref])
    assert rewards[0][0] == pytest.approx(-0.05)


def test_kl_needs_the_reference():
    with pytest.raises(ValueError, match="needs the reference logprobs"):
        shaped_turn_rewards([two_turns()], RewardShaping(kl_coef=0.1))


def test_overlong_penalty_per_turn():
    # max_new_tokens 4, cache 2: a turn of 3 tokens is half into the soft zone (-0.5 * factor), 4 is -factor
    t = two_turns(lens=(3, 4))
    shaping = RewardShaping(max_new_tokens=4, overlong_cache_len=2, overlong_factor=2.0)
    rewards, stats = shaped_turn_rewards([t], shaping)
    assert rewards == [[pytest.approx(-1.0), pytest.approx(1.0 - 2.0)]]
    assert stats["overlong/penalty_mean"] == pytest.approx(-3.0) and stats["overlong/penalised_turn_frac"] == 1.0
    short = two_turns(lens=(1, 2))
    assert shaped_turn_rewards([short], RewardShaping(max_new_tokens=4, overlong_cache_len=2))[0] == [[0.0, 1.0]]


def test_build_samples_puts_kl_before_credit():
    # reinforce_pp normalises returns over the batch: KL that differs between two episodes of equal
    # reward must give them different advantages, the one with more KL the lower.
    lp = [0.0, 0.0, -1.0, -1.0, 0.0, -1.0]
    a, b = two_turns(logprobs=lp), two_turns(logprobs=lp)
    refs = [lp, [0.0, 0.0, -3.0, -1.0, 0.0, -1.0]]  # b: k1 sum 2.0
    samples, stats = build_samples(
        [[a, b]], ALGOS["reinforce_pp"], shaping=RewardShaping(kl_coef=0.5), ref_fn=lambda trajs: refs
    )
    adv_a, adv_b = samples[0].advantages[2], samples[1].advantages[2]
    assert adv_a > 0 > adv_b and adv_a == pytest.approx(-adv_b)
    assert stats["kl_in_reward/kl_mean"] == pytest.approx(1.0)
    # without shaping equal rewards give 0
    samples, _ = build_samples([[a, b]], ALGOS["reinforce_pp"])
    assert samples[0].advantages[2] == 0.0


def test_adaptive_kl_controller_by_hand():
    # KL twice the target: error clipped to +0.2; 100 samples over a horizon of 1000 -> x 1.02
    assert adaptive_kl_coef(0.1, 2.0, 1.0, horizon=1000, n=100) == pytest.approx(0.102)
    assert adaptive_kl_coef(0.1, 0.95, 1.0, horizon=1000, n=100) == pytest.approx(0.1 * (1 - 0.05 * 0.1))
    assert adaptive_kl_coef(0.1, math.nan, 1.0, horizon=1000, n=100) == 0.1
    with pytest.raises(ConfigError, match="target must be > 0, got 0"):
        adaptive_kl_coef(0.1, 1.0, 0.0, horizon=10, n=1)
    fixed = KLController(0.1)
    assert fixed.update(5.0, 10) == 0.1
    adaptive = KLController(0.1, target=1.0, horizon=1000)
    assert adaptive.update(2.0, 100) == pytest.approx(0.102)


def test_has_signal():
    assert not has_signal([two_turns((0, 1)), two_turns((0, 1))])  # equal returns
    assert has_signal([two_turns((0, 1)), two_turns((0, 0))])
    assert not has_signal([two_turns((0, 1)), two_turns((0, 0), outcome="sandbox_error")])  # one trainable left
    assert has_signal([two_turns(outcome="sandbox_error")])  # infrastructure failures pass to be counted


def test_whiten_reaches_turn_gae():
    trajs = [two_turns((0.0, r), group="g") for r in (1.0, 0.0, 3.0)]
    values = lambda ts: [[0.0] * len(t.token_ids) for t in ts]  # noqa: E731
    raw, _ = build_samples([trajs], ALGOS["ppo"], values_fn=values)
    white, _ = build_samples([trajs], ALGOS["ppo"], values_fn=values, whiten=True)
    flat = [a for s in white for a, m in zip(s.advantages, s.loss_mask) if m]
    assert sum(flat) == pytest.approx(0.0, abs=1e-9)
    assert [s.returns for s in raw] == [s.returns for s in white]  # critic targets stay raw
