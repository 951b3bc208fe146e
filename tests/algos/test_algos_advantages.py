"""Sequence-level advantage estimators and token-level GAE against hand-computed numbers."""

import math

import pytest
import torch

from agentrl.algos import (
    ADVANTAGES,
    dr_grpo,
    gae,
    group_index,
    grpo,
    lookup,
    masked_whiten,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
)
from agentrl.errors import ConfigError

EPS = 1e-6


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0
    )


R4 = torch.tensor([1.0, 0.0, 1.0, 1.0])
G4 = torch.tensor([0, 0, 0, 0])


def test_grpo_one_group():
    # mean = 3/4 = 0.75; deviations [.25, -.75, .25, .25]; sum of squares = 3*.0625 + .5625 = .75
    # unbiased var = .75 / 3 = .25 -> std = .5
    s = 0.5 + EPS
    close(grpo(R4, G4), [0.25 / s, -0.75 / s, 0.25 / s, 0.25 / s])


def test_grpo_two_interleaved_groups_singleton_and_constant():
    # group 7: [1, 0, 1, 1] as above; group 3: [2, 4] -> mean 3, devs -1, +1, var (1+1)/1 = 2, std sqrt(2)
    # group 9: singleton -> 0; group 5: all equal -> 0 / (0 + eps) = 0
    r = torch.tensor([1.0, 2.0, 0.0, 1.0, 4.0, 1.0, 5.0, 3.0, 3.0])
    g = torch.tensor([7, 3, 7, 7, 3, 7, 9, 5, 5])
    s, s3 = 0.5 + EPS, math.sqrt(2) + EPS
    close(grpo(r, g), [0.25 / s, -1 / s3, -0.75 / s, 0.25 / s, 1 / s3, 0.25 / s, 0.0, 0.0, 0.0])


def test_grpo_accepts_string_group_ids_and_keeps_float_dtype():
    gi = group_index(["p1", "p2", "p1", "p1", "p2"])
    assert gi.tolist() == [0, 1, 0, 0, 1] and gi.dtype == torch.int64
    out = grpo(torch.tensor([1, 0, 0, 1, 1]), gi)  # integer rewards -> float32
    assert out.dtype == torch.float32
    # group p1 (idx 0, 2, 3): [1, 0, 1] -> mean 2/3, devs [1/3, -2/3, 1/3], var (1/9 + 4/9 + 1/9)/2 = 1/3
    # group p2 (idx 1, 4):    [0, 1]    -> mean 1/2, devs [-1/2, 1/2],      var (1/4 + 1/4)/1 = 1/2
    s1, s2 = math.sqrt(1 / 3) + EPS, math.sqrt(0.5) + EPS
    close(out, [(1 / 3) / s1, -0.5 / s2, (-2 / 3) / s1, (1 / 3) / s1, 0.5 / s2])
    close(grpo(torch.tensor([1, 0, 0, 1, 1]), ["p1", "p2", "p1", "p1", "p2"]), out)  # keys passed directly
    assert grpo(torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0, 0])).dtype == torch.float64


def test_dr_grpo_no_std():
    # r - mean_g: [1,0,1,1] - .75; singleton group 1 -> 0
    close(
        dr_grpo(torch.tensor([1.0, 0.0, 1.0, 1.0, 5.0]), torch.tensor([0, 0, 0, 0, 1])), [0.25, -0.75, 0.25, 0.25, 0.0]
    )


def test_rloo_leave_one_out():
    # i=0: others [0,1,1] mean 2/3 -> 1 - 2/3 = 1/3; i=1: others [1,1,1] -> 0 - 1 = -1
    # (= n/(n-1) * (r - mean) = 4/3 * .25 = 1/3 and 4/3 * -.75 = -1); singleton -> 0
    close(
        rloo(torch.tensor([1.0, 0.0, 1.0, 1.0, 5.0]), torch.tensor([0, 0, 0, 0, 1])), [1 / 3, -1.0, 1 / 3, 1 / 3, 0.0]
    )


def test_reinforce_pp_batch_normalised():
    # batch [1,0,1,1,2,4]: mean 9/6 = 1.5; devs [-.5,-1.5,-.5,-.5,.5,2.5]
    # squares [.25,2.25,.25,.25,.25,6.25] sum 9.5; unbiased var 9.5/5 = 1.9
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 2.0, 4.0])
    s = math.sqrt(1.9) + EPS
    expected = [d / s for d in [-0.5, -1.5, -0.5, -0.5, 0.5, 2.5]]
    close(reinforce_pp(r), expected)
    close(reinforce_pp(r, torch.tensor([0, 0, 0, 0, 1, 1])), expected)  # group ids are ignored
    close(reinforce_pp(torch.tensor([3.0])), [0.0])


def test_reinforce_pp_baseline():
    # a = r - mean_g = [.25,-.75,.25,.25, -1, 1]; mean(a) = 0; sum a^2 = 3*.0625+.5625+1+1 = 2.75
    # unbiased var 2.75/5 = .55
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 2.0, 4.0])
    s = math.sqrt(0.55) + EPS
    close(
        reinforce_pp_baseline(r, torch.tensor([0, 0, 0, 0, 1, 1])),
        [a / s for a in [0.25, -0.75, 0.25, 0.25, -1.0, 1.0]],
    )


def test_registry_and_lookup():
    assert set(ADVANTAGES) >= {"grpo", "dr_grpo", "rloo", "reinforce_pp"}
    assert lookup("advantage", "rloo") is rloo
    with pytest.raises(ConfigError, match="did you mean 'grpo'"):
        lookup("advantage", "grop")
    with pytest.raises(ConfigError, match="registry"):
        lookup("advantages", "grpo")
    for fn in ADVANTAGES.values():  # uniform call: (rewards, group_ids)
        assert fn(R4, G4).shape == (4,)


def test_gae_single_turn_by_hand():
    # gamma .9, lam .8 (gamma*lam = .72); r = [0,0,1], V = [.5,.6,.7], all sampled
    # t2: delta = 1 + 0 - .7 = .3                 A2 = .3
    # t1: delta = 0 + .9*.7 - .6 = .03            A1 = .03 + .72*.3 = .246
    # t0: delta = 0 + .9*.6 - .5 = .04            A0 = .04 + .72*.246 = .21712
    adv, ret = gae(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.7]]), torch.ones(1, 3), gamma=0.9, lam=0.8
    )
    close(adv, [[0.21712, 0.246, 0.3]])
    close(ret, [[0.71712, 0.846, 1.0]])  # A + V


# Two turns with an observation gap. Positions:
#   0  1 | 2   3  | 4  5 | 6   7  | 8
#   P  P | a0  a0 | o  o | a1  a1 | o      (P prompt, o observation: mask 0)
MASK = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 1, 0]])
VALS = torch.tensor([[9.0, 9.0, 0.2, 0.3, 9.0, 9.0, 0.4, 0.5, 9.0]])  # 9s sit on mask-0 tokens: never read
REW = torch.tensor([[0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 1.0, 0.0]])  # turn rewards on each turn's last sampled token
# steps are t2, t3, t6, t7 only (gamma .9, lam .8):
# t7: delta = 1 + .9*0 - .5 = .5                                   A = .5
# t6: delta = 0 + .9*.5 - .4 = .05                                 A = .05 + .72*.5 = .41
# t3: delta = .5 + .9*V(t6)=.4 - .3 = .56  (bootstraps across the gap, not V(t4) = 9)
#                                                                  A = .56 + .72*.41 = .8552
# t2: delta = 0 + .9*.3 - .2 = .07                                 A = .07 + .72*.8552 = .685744
ADV_EXP = [[0, 0, 0.685744, 0.8552, 0, 0, 0.41, 0.5, 0]]
RET_EXP = [[0, 0, 0.885744, 1.1552, 0, 0, 0.81, 1.0, 0]]


def test_gae_multi_turn_skips_masked_positions():
    adv, ret = gae(REW, VALS, MASK, gamma=0.9, lam=0.8)
    close(adv, ADV_EXP)
    close(ret, RET_EXP)
    # values on masked positions are irrelevant
    adv2, _ = gae(REW, torch.where(MASK.bool(), VALS, torch.full_like(VALS, -123.0)), MASK, gamma=0.9, lam=0.8)
    close(adv2, adv)
    # same as GAE on the row with the masked positions cut out
    keep = MASK[0].bool()
    adv3, _ = gae(REW[:, keep], VALS[:, keep], torch.ones(1, 4), gamma=0.9, lam=0.8)
    close(adv[:, keep], adv3)


def test_gae_reward_on_observation_token_goes_to_the_action_before_it():
    rew = torch.zeros_like(REW)
    rew[0, 4], rew[0, 8] = 0.5, 1.0  # on the observation tokens after each turn
    rew[0, 0] = 7.0  # before any sampled token: dropped
    adv, ret = gae(rew, VALS, MASK, gamma=0.9, lam=0.8)
    close(adv, ADV_EXP)
    close(ret, RET_EXP)


def test_gae_batch_of_rows_with_padding_and_monte_carlo_limit():
    # row 1: padded tail (mask 0); gamma = lam = 1 -> A_t = (sum of rewards from t on) - V_t
    rew = torch.cat([REW, torch.tensor([[0.0, 1.0, 0.0, 2.0, 0, 0, 0, 0, 0]])])
    val = torch.cat([VALS, torch.tensor([[0.0, 0.5, 0.25, 1.0, 0, 0, 0, 0, 0]])])
    mask = torch.cat([MASK, torch.tensor([[0, 1, 1, 1, 0, 0, 0, 0, 0]])])
    adv, ret = gae(rew, val, mask, gamma=1.0, lam=1.0)
    # row 0: returns-to-go 1.5, 1.5, 1, 1 at t2, t3, t6, t7
    close(adv[0], [0, 0, 1.5 - 0.2, 1.5 - 0.3, 0, 0, 1 - 0.4, 1 - 0.5, 0])
    close(ret[0], [0, 0, 1.5, 1.5, 0, 0, 1, 1, 0])
    # row 1: returns-to-go 3, 2, 2 at t1, t2, t3
    close(adv[1], [0, 3 - 0.5, 2 - 0.25, 2 - 1.0, 0, 0, 0, 0, 0])
    with pytest.raises(ValueError):
        gae(rew[0], val[0], mask[0])


def test_masked_whiten():
    # over mask-1 entries [1,2,3]: mean 2, unbiased var 1 -> [-1, 0, 1]; mask-0 -> 0
    out = masked_whiten(torch.tensor([1.0, 2.0, 3.0, 100.0]), torch.tensor([1, 1, 1, 0]))
    close(out, [-1.0, 0.0, 1.0, 0.0], atol=1e-7)
    close(masked_whiten(torch.tensor([1.0, 2.0, 3.0]), torch.ones(3), shift_mean=False), [1.0, 2.0, 3.0], atol=1e-7)


def test_gae_whiten_normalises_advantages_not_returns():
    # gamma = lam = 1, r = [0, 0, 1], V = [0, -1, -2]: A_t = 1 - V_t = [1, 2, 3], R = A + V = [1, 1, 1]
    # whitened over the mask-1 entries: mean 2, unbiased std 1 -> [-1, 0, 1]; returns keep the raw A
    rew, val = torch.tensor([[0.0, 0.0, 1.0, 0.0]]), torch.tensor([[0.0, -1.0, -2.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    raw, ret_raw = gae(rew, val, mask, gamma=1.0, lam=1.0)
    adv, ret = gae(rew, val, mask, gamma=1.0, lam=1.0, whiten=True)
    close(raw, [[1.0, 2.0, 3.0, 0.0]])
    close(adv, [[-1.0, 0.0, 1.0, 0.0]], atol=1e-6)
    close(ret, [[1.0, 1.0, 1.0, 0.0]])
    close(ret, ret_raw)
