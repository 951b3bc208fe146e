"""Turn-level credit assignment against hand-computed numbers."""

import pytest
import torch

from agentrl.algos import (
    CREDIT,
    apply_kl_in_reward,
    dr_grpo,
    gae,
    group_index,
    lookup,
    outcome_broadcast,
    turn_boundaries,
    turn_gae,
    turn_returns_group_baseline,
    turn_rewards_to_tokens,
)
from agentrl.trajectory import Trajectory, TurnRecord

EPS = 1e-6


def close(actual, expected, atol=1e-6):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a == pytest.approx(e, abs=atol), (actual, expected)


# Four sequences. turn_ids: -1 prompt, k = sampled in turn k or its observation (mask 0).
# s0: P P | a a o | a            turns 0, 1
# s1: P | a o | a o | a          turns 0, 1, 2
# s2: P | a a                    turn 0
# s3: P | a | a                  turns 0, 1   (alone in group "b")
TIDS = [[-1, -1, 0, 0, 0, 1], [-1, 0, 0, 1, 1, 2], [-1, 0, 0], [-1, 0, 1]]
MASKS = [[0, 0, 1, 1, 0, 1], [0, 1, 0, 1, 0, 1], [0, 1, 1], [0, 1, 1]]
GROUPS = ["a", "a", "a", "b"]
TURN_R = [[0.0, 1.0], [0.5, 0.0, 1.0], [1.0], [2.0, 2.0]]


def test_outcome_broadcast():
    out = outcome_broadcast([0.5, -1.0], [[0, 0, 1, 1, 0, 1], [0, 1, 1]])
    assert out == [[0, 0, 0.5, 0.5, 0, 0.5], [0, -1.0, -1.0]]
    assert outcome_broadcast(torch.tensor([2.0]), [[0, 1]]) == [[0.0, 2.0]]
    with pytest.raises(ValueError):
        outcome_broadcast([1.0, 2.0], [[1]])


def test_turn_return_group_baseline_with_ragged_turns():
    # gamma .5:  G_s0 = [0 + .5*1, 1] = [.5, 1];  G_s1 = [.5 + .5*(0 + .5*1), 0 + .5*1, 1] = [.75, .5, 1];  G_s2 = [1]
    # group a, turn 0: {.5, .75, 1} mean .75 -> s0 -.25, s1 0, s2 .25
    #          turn 1: {s0: 1, s1: .5} mean .75 (s2 has no turn 1) -> s0 .25, s1 -.25
    #          turn 2: only s1 -> 0
    # group b (s3 alone): 0 everywhere
    out = turn_returns_group_baseline(TURN_R, TIDS, MASKS, GROUPS, gamma=0.5)
    close(out[0], [0, 0, -0.25, -0.25, 0, 0.25])
    close(out[1], [0, 0, 0, -0.25, 0, 0])
    close(out[2], [0, 0.25, 0.25])
    close(out[3], [0, 0, 0])


def test_turn_return_normalize_std():
    # turn 0 of group a: devs [-.25, 0, .25], unbiased var (.0625*2)/2 = .0625, std .25
    # turn 1: devs [.25, -.25], var (.0625*2)/1 = .125, std .353553
    out = turn_returns_group_baseline(TURN_R, TIDS, MASKS, GROUPS, gamma=0.5, normalize_std=True)
    s0, s1 = 0.25 + EPS, 0.125**0.5 + EPS
    close(out[0], [0, 0, -0.25 / s0, -0.25 / s0, 0, 0.25 / s1])
    close(out[1], [0, 0, 0, -0.25 / s1, 0, 0])
    close(out[2], [0, 0.25 / s0, 0.25 / s0])


def test_turn_return_single_turn_equals_dr_grpo_outcome_broadcast():
    rewards, groups = [[1.0], [0.0], [1.0], [3.0], [5.0]], [0, 0, 0, 1, 1]
    tids, masks = [[-1, 0, 0]] * 5, [[0, 1, 1]] * 5
    seq_adv = dr_grpo(torch.tensor([r[0] for r in rewards], dtype=torch.float64), group_index(groups))
    for got, want in zip(turn_returns_group_baseline(rewards, tids, masks, groups), outcome_broadcast(seq_adv, masks)):
        close(got, want)


def test_turn_gae_by_hand():
    # gamma .9, lam .8 (gamma lam = .72)
    # s0: r = [0, 1], V = [.4, .6]
    #   k1: delta = 1 + 0 - .6 = .4                    A1 = .4
    #   k0: delta = 0 + .9*.6 - .4 = .14               A0 = .14 + .72*.4 = .428
    #   returns A + V = [.828, 1.0]
    # s1: r = [-.1, 0, 1], V = [.5, .2, .9]
    #   k2: delta = 1 - .9 = .1                        A2 = .1
    #   k1: delta = 0 + .9*.9 - .2 = .61               A1 = .61 + .72*.1 = .682
    #   k0: delta = -.1 + .9*.2 - .5 = -.42            A0 = -.42 + .72*.682 = .07104
    #   returns [.57104, .882, 1.0]
    adv, ret = turn_gae(
        [[0.0, 1.0], [-0.1, 0.0, 1.0]], TIDS[:2], MASKS[:2], [[0.4, 0.6], [0.5, 0.2, 0.9]], gamma=0.9, lam=0.8
    )
    close(adv[0], [0, 0, 0.428, 0.428, 0, 0.4])
    close(adv[1], [0, 0.07104, 0, 0.682, 0, 0.1])
    close(ret[0], [0.828, 1.0])
    close(ret[1], [0.57104, 0.882, 1.0])


def test_turn_gae_bootstrap_and_monte_carlo_limit():
    # final value .5 after the last turn of s0: k1 delta = 1 + .9*.5 - .6 = .85; k0: A0 = .14 + .72*.85 = .752
    adv, ret = turn_gae([[0.0, 1.0]], TIDS[:1], MASKS[:1], [[0.4, 0.6]], gamma=0.9, lam=0.8, final_values=[0.5])
    close(adv[0], [0, 0, 0.752, 0.752, 0, 0.85])
    close(ret[0], [1.152, 1.45])
    # gamma = lam = 1: A_k = (sum of rewards from k on) - V_k
    adv, ret = turn_gae([[-0.1, 0.0, 1.0]], TIDS[1:2], MASKS[1:2], [[0.5, 0.2, 0.9]], gamma=1.0, lam=1.0)
    close(adv[0], [0, 0.9 - 0.5, 0, 1 - 0.2, 0, 1 - 0.9])
    close(ret[0], [0.9, 1.0, 1.0])
    with pytest.raises(ValueError, match="boundary values"):
        turn_gae([[0.0, 1.0]], TIDS[:1], MASKS[:1], [[0.4]])


def test_turn_gae_matches_token_gae_when_each_turn_is_one_token():
    # one sampled token per turn with the boundary value on it: token-level GAE over the masked
    # row is the same recursion as turn-level GAE
    r, v = [0.3, -0.2, 1.0], [0.1, 0.5, 0.7]
    tids, mask = [-1, 0, 0, 0, 1, 1, 2], [0, 1, 0, 0, 1, 0, 1]
    adv_turn, _ = turn_gae([r], [tids], [mask], [v], gamma=0.95, lam=0.9)
    tok_r = torch.tensor([turn_rewards_to_tokens([r], [tids], [mask])[0]])
    vals = torch.tensor([[0, v[0], 0, 0, v[1], 0, v[2]]], dtype=torch.float64)
    adv_tok, _ = gae(tok_r, vals, torch.tensor([mask]), gamma=0.95, lam=0.9)
    close(adv_turn[0], adv_tok[0].tolist())


def test_turn_boundaries():
    # s0: first sampled token of turn 0 is 2, of turn 1 is 5 -> boundaries [1, 4]
    assert turn_boundaries(TIDS[0], MASKS[0]) == [1, 4]
    assert turn_boundaries(TIDS[1], MASKS[1]) == [0, 2, 4]
    # leading glue (mask 0) inside a turn: the boundary is the token just before the first SAMPLED one
    assert turn_boundaries([-1, 0, 0, 0, 1, 1], [0, 0, 1, 1, 0, 1]) == [1, 4]
    # turn 1 sampled nothing (only an observation token at 3); turn 2 has no tokens at all
    assert turn_boundaries([-1, 0, 0, 1], [0, 1, 0, 0], num_turns=3) == [0, 2, 3]
    with pytest.raises(ValueError, match="token 0"):
        turn_boundaries([0, 0], [1, 1])


def test_turn_rewards_to_tokens_and_kl_in_reward():
    assert turn_rewards_to_tokens([[0.5, 1.0]], TIDS[:1], MASKS[:1]) == [[0, 0, 0, 0.5, 0, 1.0]]
    # per-token KL (the 9s sit on mask-0 tokens and are ignored); beta .5
    # turn 0: .5 - .5*(.1 + .2) = .35;  turn 1: 1 - .5*.3 = .85
    out = apply_kl_in_reward([[0.5, 1.0]], [[9, 9, 0.1, 0.2, 9, 0.3]], TIDS[:1], MASKS[:1], beta=0.5)
    close(out[0], [0.35, 0.85])


def test_credit_from_a_real_trajectory():
    # prompt of 2, turn 0: 2 sampled + 2 observation, turn 1: 1 sampled; turn rewards [-.1, 1]
    t = Trajectory(
        episode_id="e",
        group_id="g",
        env_id="x",
        prompt_len=2,
        token_ids=[1, 2, 3, 4, 5, 6, 7],
        loss_mask=[0, 0, 1, 1, 0, 0, 1],
        logprobs=[0, 0, -0.1, -0.2, 0, 0, -0.3],
        turn_ids=[-1, -1, 0, 0, 0, 0, 1],
        versions=[-1, -1, 3, 3, -1, -1, 3],
        turns=[TurnRecord(0, 2, 2, 2, "stop", reward=-0.1), TurnRecord(1, 6, 1, 0, "stop", reward=1.0)],
        reward=1.0,
    )
    t.validate()
    u = Trajectory(
        **{
            **t.__dict__,
            "episode_id": "f",
            "turns": [TurnRecord(0, 2, 2, 2, "stop", reward=0.0), TurnRecord(1, 6, 1, 0, "stop", reward=0.0)],
        }
    )
    trajs = [t, u]
    args = ([x.turn_rewards for x in trajs], [x.turn_ids for x in trajs], [x.loss_mask for x in trajs])
    out = turn_returns_group_baseline(*args, [x.group_id for x in trajs])
    # G_t = [.9, 1], G_u = [0, 0]: means [.45, .5] -> t: [.45, .5], u: [-.45, -.5]
    close(out[0], [0, 0, 0.45, 0.45, 0, 0, 0.5])
    close(out[1], [0, 0, -0.45, -0.45, 0, 0, -0.5])
    assert turn_boundaries(t.turn_ids, t.loss_mask) == [1, 5]
    assert set(CREDIT) == {"outcome", "turn_return", "turn_gae", "gigpo"} and lookup("credit", "turn_gae") is turn_gae


def test_mask_zero_tokens_never_get_credit():
    for out in (
        turn_returns_group_baseline(TURN_R, TIDS, MASKS, GROUPS),
        turn_gae(TURN_R, TIDS, MASKS, [[0.3] * len(r) for r in TURN_R])[0],
        outcome_broadcast([1.0, 2.0, 3.0, 4.0], MASKS),
    ):
        for row, mask in zip(out, MASKS):
            assert all(a == 0.0 for a, m in zip(row, mask) if not m)
    with pytest.raises(ValueError, match="turn 2"):
        turn_returns_group_baseline([[1.0, 1.0]], [[-1, 0, 1, 2]], [[0, 1, 1, 1]], ["g"])


def test_turn_gae_whiten_over_the_batch_sampled_tokens():
    # gamma = lam = 1, s1's rewards [-.1, 0, 1] (returns-to-go .9, 1, 1), V = [-.1, -1, -2]:
    # A = [1, 2, 3] on s1's sampled tokens (one per turn), targets R = A + V = [.9, 1, 1];
    # whitened over those three tokens: mean 2, unbiased std 1 -> [-1, 0, 1]; the targets do not move
    args = ([[-0.1, 0.0, 1.0]], TIDS[1:2], MASKS[1:2], [[-0.1, -1.0, -2.0]])
    raw, ret_raw = turn_gae(*args, gamma=1.0, lam=1.0)
    adv, ret = turn_gae(*args, gamma=1.0, lam=1.0, whiten=True)
    close(raw[0], [0, 1.0, 0, 2.0, 0, 3.0])
    close(adv[0], [0, -1.0, 0, 0.0, 0, 1.0])
    close(ret[0], [0.9, 1.0, 1.0])
    assert ret == ret_raw
    # two sequences are whitened together (batch statistics), not each on its own:
    # s0 (gamma = lam = 1, V = [0, 0], r = [0, 1]) has A = 1 on its three sampled tokens; with s1's
    # [1, 2, 3] the six values have mean 1.5 and unbiased var (3 * .25 + .25 + .25 + 2.25) / 5 = .7
    adv2, _ = turn_gae(
        [[0.0, 1.0], [-0.1, 0.0, 1.0]],
        TIDS[:2],
        MASKS[:2],
        [[0.0, 0.0], [-0.1, -1.0, -2.0]],
        gamma=1.0,
        lam=1.0,
        whiten=True,
    )
    s = 0.7**-0.5
    close(adv2[0], [0, 0, -0.5 * s, -0.5 * s, 0, -0.5 * s])
    close(adv2[1], [0, -0.5 * s, 0, 0.5 * s, 0, 1.5 * s])
    # fewer than two sampled tokens: nothing to whiten against -> 0
    assert turn_gae([[1.0]], [[-1, 0]], [[0, 1]], [[0.0]], whiten=True)[0] == [[0.0, 0.0]]
