"""The unbiased pass@k estimator (Chen et al. 2021) against values worked out by hand."""

import math

import pytest

from agentrl.episodes.pass_at_k import pass_at_k, pass_at_k_rates


def test_n5_c2_by_hand():
    # n=5 attempts, c=2 solved, n-c=3 unsolved; pass@k = 1 - C(3, k) / C(5, k)
    #   k=1: 1 - 3/5   = 0.4
    #   k=2: 1 - 3/10  = 0.7
    #   k=3: 1 - 1/10  = 0.9
    #   k=4: 1 - 0/5   = 1.0   (only 3 unsolved: any 4 of 5 hold a solved one)
    #   k=5: 1 - 0/1   = 1.0
    expected = [0.4, 0.7, 0.9, 1.0, 1.0]
    got = [pass_at_k(5, 2, k) for k in range(1, 6)]
    assert got == pytest.approx(expected, abs=1e-12)


def test_edges_none_and_all_solved():
    assert [pass_at_k(5, 0, k) for k in range(1, 6)] == [0.0] * 5
    assert [pass_at_k(5, 5, k) for k in range(1, 6)] == [1.0] * 5
    assert pass_at_k(1, 0, 1) == 0.0 and pass_at_k(1, 1, 1) == 1.0


def test_pass_at_1_is_the_solved_fraction_and_large_n_stays_finite():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    # C(200, 100) is ~9e58 and C(400, 200) overflows a float: the product form does not care
    assert pass_at_k(200, 7, 100) == pytest.approx(1 - math.comb(193, 100) / math.comb(200, 100), rel=1e-9)
    p = pass_at_k(2000, 1, 1000)
    assert math.isfinite(p) and p == pytest.approx(0.5)


@pytest.mark.parametrize(
    "n,c,k,match",
    [
        (5, 2, 6, r"1 <= k <= n .*k=6 with n=5"),
        (5, 2, 0, r"1 <= k <= n"),
        (5, 6, 1, r"c=6 must be within 0..n=5"),
        (5, -1, 1, r"c=-1"),
        (0, 0, 1, r"at least one attempt"),
        (5, 2.0, 1, r"c must be an int"),
    ],
)
def test_bad_arguments_are_refused(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)


def test_rates_average_over_tasks():
    # three tasks of 3 attempts, solved 0, 1 and 3 times
    #   pass@1 = (0 + 1/3 + 1) / 3 = 4/9
    #   pass@2 = (0 + (1 - C(2,2)/C(3,2)) + 1) / 3 = (0 + 2/3 + 1) / 3 = 5/9
    #   pass@3 = (0 + 1 + 1) / 3 = 2/3
    #   avg@3  = 4 solved / 9 attempts
    r = pass_at_k_rates([0, 1, 3], 3)
    assert list(r) == ["pass@1", "pass@2", "pass@3", "avg@3"]
    assert [r["pass@1"], r["pass@2"], r["pass@3"], r["avg@3"]] == pytest.approx([4 / 9, 5 / 9, 2 / 3, 4 / 9])
    assert pass_at_k_rates([], 2) == {"pass@1": 0.0, "pass@2": 0.0, "avg@2": 0.0}
