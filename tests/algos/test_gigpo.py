"""GiGPO credit (algos.credit.gigpo): hand-computed advantages, the no-repeat reduction to the
episode-level advantage, the samples dispatch, and the state_key field of the data contract."""

import json
import math

import pytest
import torch

from agentrl import algos
from agentrl.batches.samples import token_advantages
from agentrl.errors import ConfigError
from agentrl.trajectory import Trajectory, TurnRecord, read_jsonl, write_jsonl


def layout(n_turns):
    """2 prompt tokens, then per turn 2 sampled tokens + 1 observation token."""
    tids, mask = [-1, -1], [0, 0]
    for k in range(n_turns):
        tids += [k, k, k]
        mask += [1, 1, 0]
    return tids, mask


def per_turn(row, n_turns):
    """The advantage of each turn's sampled tokens, checking both tokens agree and mask-0 are 0."""
    out = []
    for k in range(n_turns):
        a, b, obs = row[2 + 3 * k : 5 + 3 * k]
        assert a == b and obs == 0.0
        out.append(a)
    assert row[:2] == [0.0, 0.0]
    return out


def run(rewards, keys, groups, **kw):
    lay = [layout(len(r)) for r in rewards]
    tok = algos.gigpo(rewards, [t for t, _ in lay], [m for _, m in lay], groups, keys, **kw)
    return [per_turn(row, len(r)) for row, r in zip(tok, rewards)]


def test_no_repeated_state_is_exactly_the_episode_advantage():
    rewards = [[0, 1], [0, 0, 0], [0.5], [0, 0, 1], [0, 0]]
    groups = ["a", "a", "a", "b", "b"]
    keys = [["a0", "a1"], ["a2", "a3", "a4"], ["a5"], ["b0", "b1", "b2"], ["b3", "b4"]]
    got = run(rewards, keys, groups, omega=1.0, gamma=0.9)
    R = torch.tensor([sum(r) for r in rewards], dtype=torch.float64)
    ref = algos.grpo(R, algos.group_index(groups)).tolist()
    for row, a in zip(got, ref):
        assert row == pytest.approx([a] * len(row), rel=1e-12, abs=1e-12)
    assert got[0][0] == pytest.approx((1 - 0.5) / (0.5 + 1e-6))  # group a: R = [1, 0, .5], mean .5, unbiased std .5


def test_repeated_state_across_three_trajectories_dr_grpo():
    # S0 starts every trajectory; S1 is reached by t0 (turn 1), t1 (turn 1) and t2 (turn 2, a detour via Y)
    rewards = [[0, 0, 1], [0, 0], [0, 0, 0, 1]]
    keys = [["S0", "S1", "X"], ["S0", "S1"], ["S0", "Y", "S1", "Z"]]
    got = run(rewards, keys, ["g"] * 3, omega=1.0, gamma=0.5, normalize_std=False)
    # A^E = R - mean(R) = [1, 0, 1] - 2/3; returns t0 [.25, .5, 1], t1 [0, 0], t2 [.125, .25, .5, 1]
    # S0: {.25, 0, .125} mean .125; S1: {.5, 0, .5} mean 1/3; X, Y, Z singletons -> 0
    assert got[0] == pytest.approx([1 / 3 + 0.125, 1 / 3 + 1 / 6, 1 / 3])
    assert got[1] == pytest.approx([-2 / 3 - 0.125, -2 / 3 - 1 / 3])
    assert got[2] == pytest.approx([1 / 3, 1 / 3, 1 / 3 + 1 / 6, 1 / 3])


def test_std_normalisation_omega_and_stats():
    rewards = [[0, 1], [0, 0], [0, 1]]
    keys = [["S", "A"], ["S", "B"], ["S", "A"]]
    stats = {}
    got = run(rewards, keys, ["g"] * 3, omega=0.5, gamma=1.0, stats=stats)
    sd = math.sqrt(((1 - 2 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)  # R = [1, 0, 1]
    ae = [(1 - 2 / 3) / (sd + 1e-6), (0 - 2 / 3) / (sd + 1e-6), (1 - 2 / 3) / (sd + 1e-6)]
    # turn 0: anchor S holds G = [1, 0, 1]: the same normalised values; turn 1: A holds {1, 1} -> 0, B alone -> 0
    assert got[0] == pytest.approx([ae[0] * 1.5, ae[0]])
    assert got[1] == pytest.approx([ae[1] * 1.5, ae[1]])
    assert got[2] == pytest.approx([ae[2] * 1.5, ae[2]])
    assert stats == {"anchor_groups": 3, "anchor_turns_shared": 5, "anchor_group_size_max": 3}


def test_anchor_groups_do_not_cross_task_groups_and_none_keys_are_singletons():
    rewards = [[0, 1], [0, 0], [0, 1], [0, 0]]
    keys = [["S", None], ["S", None], ["S", "T"], ["S", "T"]]
    got = run(rewards, keys, ["a", "a", "b", "b"], gamma=1.0, normalize_std=False)
    # per group: A^E = +-0.5; anchor S (per group) adds +-0.5 at turn 0; None keys add nothing; T adds +-0.5
    assert got == [
        pytest.approx([1.0, 0.5]),
        pytest.approx([-1.0, -0.5]),
        pytest.approx([1.0, 1.0]),
        pytest.approx([-1.0, -1.0]),
    ]


def test_rejects_misaligned_inputs():
    tids, mask = layout(2)
    with pytest.raises(ValueError, match="state keys"):
        algos.gigpo([[0, 1]], [tids], [mask], ["g"], [["S"]])
    with pytest.raises(ValueError, match="state-key lists"):
        algos.gigpo([[0, 1]], [tids], [mask], ["g"], [])


def _traj(i, group, rewards, keys):
    tids, mask = layout(len(rewards))
    turns = [
        TurnRecord(
            index=k, start=2 + 3 * k, n_sampled=2, n_observation=1, finish_reason="stop", reward=r, state_key=key
        )
        for k, (r, key) in enumerate(zip(rewards, keys))
    ]
    return Trajectory(
        episode_id=f"e{i}",
        group_id=group,
        env_id="x",
        prompt_len=2,
        token_ids=list(range(len(tids))),
        loss_mask=mask,
        logprobs=[0.0] * len(tids),
        turn_ids=tids,
        versions=[0 if m else -1 for m in mask],
        turns=turns,
        reward=rewards[-1],
    )


def test_samples_dispatch_reads_turn_state_keys():
    trajs = [
        _traj(0, "g", [0, 0, 1], ["S0", "S1", "X"]),
        _traj(1, "g", [0, 0], ["S0", "S1"]),
        _traj(2, "g", [0, 0, 0, 1], ["S0", "Y", "S1", "Z"]),
    ]
    stats = {}
    adv, returns, vmask = token_advantages(trajs, "dr_grpo", "gigpo", gamma=0.5, omega=1.0, credit_stats=stats)
    assert returns is None and vmask is None
    assert per_turn(adv[1], 2) == pytest.approx([-2 / 3 - 0.125, -1.0])
    assert stats["anchor_turns_shared"] == 6
    with pytest.raises(ConfigError, match="rloo"):
        token_advantages(trajs, "rloo", "gigpo")


def test_old_trajectories_without_state_key_still_load(tmp_path):
    t = _traj(0, "g", [0, 1], ["S0", "S1"])
    path = tmp_path / "t.jsonl"
    write_jsonl(path, [t])
    assert [r.state_key for r in next(read_jsonl(path)).turns] == ["S0", "S1"]
    d = json.loads(path.read_text())
    for turn in d["turns"]:
        del turn["state_key"]  # a file written before the field existed
    path.write_text(json.dumps(d) + "\n")
    old = next(read_jsonl(path))
    assert [r.state_key for r in old.turns] == [None, None]
    tids, mask = layout(2)
    assert per_turn(algos.gigpo([[0, 1]], [tids], [mask], ["g"], [[None, None]])[0], 2) == [0.0, 0.0]
