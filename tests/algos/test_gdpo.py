"""GDPO (per-component group normalisation of multi-component rewards) against numbers worked by hand,
against GRPO where it must equal it, and against TRL's documented normalize_then_sum computed
independently."""

import math

import pytest
import torch

from agentrl.algos import gdpo, grpo

S3 = math.sqrt(3.0)


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0
    )


# One group of four episodes, two components: correct (0/1, what the task is about) and a length-style
# reward with a wide spread (0..6). The summed reward lets the wide component decide.
CORRECT = [1.0, 0.0, 0.0, 1.0]
LENGTH = [2.0, 6.0, 0.0, 4.0]


def test_summed_normalisation_ranks_the_wrong_episode_first_and_gdpo_does_not():
    # summed (GRPO on c + l): r = [3, 6, 0, 5], mean 3.5, deviations [-0.5, 2.5, -3.5, 1.5],
    #   sum of squares 0.25 + 6.25 + 12.25 + 2.25 = 21, unbiased var 21 / 3 = 7, std sqrt(7) = 2.645751
    #   A = [-0.188982, 0.944911, -1.322876, 0.566947]: episode 1 (WRONG answer, longest) ranks first
    r = torch.tensor([c + n for c, n in zip(CORRECT, LENGTH)], dtype=torch.float64)
    summed = grpo(r, torch.zeros(4))
    s7 = math.sqrt(7.0)
    close(summed, [-0.5 / s7, 2.5 / s7, -3.5 / s7, 1.5 / s7])
    assert int(summed.argmax()) == 1 and CORRECT[1] == 0.0
    # GDPO: correct = [1, 0, 0, 1]: mean 0.5, deviations +-0.5, sum of squares 1, var 1/3, std 1/sqrt(3)
    #   -> A_c = +-0.5 sqrt(3) = [0.866025, -0.866025, -0.866025, 0.866025]
    # length = [2, 6, 0, 4]: mean 3, deviations [-1, 3, -3, 1], sum of squares 20, var 20/3, std 2.581989
    #   -> A_l = [-0.387298, 1.161895, -1.161895, 0.387298]
    # A = A_c + A_l = [0.478727, 0.295870, -2.027921, 1.253323]: both correct episodes (3, then 0) rank
    #   above both wrong ones
    sd_l = math.sqrt(20.0 / 3.0)
    want = [S3 / 2 - 1 / sd_l, -S3 / 2 + 3 / sd_l, -S3 / 2 - 3 / sd_l, S3 / 2 + 1 / sd_l]
    close(want, [0.478727, 0.295870, -2.027921, 1.253323])
    a = gdpo(torch.tensor([CORRECT, LENGTH], dtype=torch.float64).T, torch.zeros(4))
    close(a, want)
    assert torch.argsort(a, descending=True).tolist() == [3, 0, 1, 2]


def test_weights_scale_each_normalised_component():
    # weights (1, 0.5): A = A_c + 0.5 A_l = [0.866025 - 0.193649, -0.866025 + 0.580948, ...]
    sd_l = math.sqrt(20.0 / 3.0)
    a = gdpo(torch.tensor([CORRECT, LENGTH]).T, torch.zeros(4), weights=torch.tensor([1.0, 0.5]))
    close(a, [S3 / 2 - 0.5 / sd_l, -S3 / 2 + 1.5 / sd_l, -S3 / 2 - 1.5 / sd_l, S3 / 2 + 0.5 / sd_l])
    # weight 0 drops a component: GRPO of the other one
    a = gdpo(torch.tensor([CORRECT, LENGTH]).T, torch.zeros(4), weights=torch.tensor([1.0, 0.0]))
    close(a, [S3 / 2, -S3 / 2, -S3 / 2, S3 / 2])


def test_groups_are_normalised_apart_and_constants_add_nothing():
    # group 0: as above, component 2 constant (5) -> adds 0; group 1: c = [0, 1] (std 0.707107 -> -+0.707107),
    # l = [3, 3] constant -> 0; group 2: a singleton -> 0
    comps = torch.tensor(
        [[1, 2, 5], [0, 6, 5], [0, 0, 5], [1, 4, 5], [0, 3, 1], [1, 3, 2], [1, 9, 9]], dtype=torch.float64
    )
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    a = gdpo(comps, groups)
    close(a[:4], [0.478727, 0.295870, -2.027921, 1.253323])
    # group 1's third component [1, 2] also varies: +-0.707107, same signs as c
    close(a[4:], [-2 * 0.707107, 2 * 0.707107, 0.0])


@pytest.mark.parametrize("seed", range(3))
def test_one_component_with_weight_one_is_exactly_grpo(seed):
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 3, (24,), generator=g).double() + torch.rand(24, generator=g, dtype=torch.float64)
    groups = torch.arange(24) // 4
    assert torch.equal(gdpo(r[:, None], groups), grpo(r, groups))
    assert torch.equal(gdpo(r[:, None].float(), groups), grpo(r.float(), groups))


def test_shapes_are_checked():
    with pytest.raises(ValueError, match=r"components must have shape \[B, K\]"):
        gdpo(torch.zeros(4), torch.zeros(4))
    with pytest.raises(ValueError, match=r"weights must have shape \[K\] = \[2\]"):
        gdpo(torch.zeros(4, 2), torch.zeros(4), weights=torch.ones(3))


@pytest.mark.parametrize("seed", range(3))
def test_trl_normalize_then_sum_is_this_sum_divided_by_one_number(seed):
    # TRL GRPOTrainer, multi_objective_aggregation="normalize_then_sum" (its docs): rewards_per_func [B, K]
    # viewed as [groups, G, K]; each column minus its group mean, over its group std (+ eps); weighted
    # sum over K; then the batch step (x - mean) / (std + eps). Computed here in that layout (TRL's eps is
    # 1e-4; 1e-6 here, agentrl's). Before the batch step it is gdpo exactly; the batch step subtracts a
    # mean that is 0 and divides by one scalar.
    g = torch.Generator().manual_seed(seed)
    G, n_groups, K = 4, 6, 3
    rpf = torch.randint(0, 4, (n_groups * G, K), generator=g).double() * torch.tensor([1.0, 2.5, 0.1])
    w = torch.tensor([1.0, 0.3, 2.0], dtype=torch.float64)
    view = rpf.view(n_groups, G, K)
    per = (view - view.mean(1, keepdim=True)) / (view.std(1, keepdim=True) + 1e-6)
    summed = (per.reshape(-1, K) * w).sum(1)
    ours = gdpo(rpf, torch.arange(n_groups * G) // G, weights=w)
    close(ours, summed, atol=1e-9)
    assert abs(float(summed.mean())) < 1e-9
    whitened = (summed - summed.mean()) / (summed.std() + 1e-6)
    close(whitened, ours / (ours.std() + 1e-6), atol=1e-9)
