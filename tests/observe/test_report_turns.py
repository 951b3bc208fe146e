"""The trajectory viewer's per-turn table: each turn's reward, advantage and state key (GiGPO's
anchor state), with how many shown turns of the same task start from that state."""

from agentrl.observe.report import anchor_sizes, render, trajectory_html, turn_advantages, turns_html
from agentrl.trajectory import Trajectory, TurnRecord


def _traj(i, group, keys, adv_turns, rewards):
    """2 prompt tokens, then per turn 2 sampled tokens + 1 observation token."""
    tids, mask, adv = [-1, -1], [0, 0], [0.0, 0.0]
    for k, a in enumerate(adv_turns):
        tids += [k, k, k]
        mask += [1, 1, 0]
        adv += [a, a, 0.0]
    turns = [
        TurnRecord(k, 2 + 3 * k, 2, 1, "stop", reward=r, state_key=key) for k, (key, r) in enumerate(zip(keys, rewards))
    ]
    t = Trajectory(
        episode_id=f"{group}-{i}",
        group_id=group,
        env_id="textworld",
        prompt_len=2,
        token_ids=list(range(len(tids))),
        loss_mask=mask,
        logprobs=[-0.5 if m else 0.0 for m in mask],
        turn_ids=tids,
        versions=[1 if m else -1 for m in mask],
        turns=turns,
        reward=rewards[-1],
    )
    t.info["advantages"] = adv
    t.validate()
    return t


def test_turn_advantages_and_anchor_sizes():
    a = _traj(0, "g", ["S0", "S1"], [0.25, -0.5], [0.0, 1.0])
    b = _traj(1, "g", ["S0", "S2"], [0.1, 0.2], [0.0, 0.0])
    c = _traj(0, "h", ["S0", None], [0.0, 0.0], [0.0, 0.0])
    assert turn_advantages(a) == [0.25, -0.5]
    a.info.pop("advantages")
    assert turn_advantages(a) == [None, None]
    sizes = anchor_sizes([a, b, c])
    assert sizes[("g", "S0")] == 2 and sizes[("h", "S0")] == 1 and sizes[("g", "S1")] == 1
    assert ("h", None) not in sizes


def test_viewer_shows_per_turn_advantage_state_key_and_shared_anchor():
    a = _traj(0, "g", ["abc123", "def456"], [0.25, -0.5], [0.0, 1.0])
    b = _traj(1, "g", ["abc123", "fff000"], [0.1, 0.2], [0.0, 0.0])
    table = turns_html(a, anchor_sizes([a, b]))
    assert "<code>abc123</code>" in table and "<code>def456</code>" in table
    assert "+0.250" in table and "-0.500" in table and "+1.000" in table
    assert "<td>2</td>" in table  # two shown turns start from abc123
    assert "per-turn rewards" in trajectory_html(a, None, 0, anchor_sizes([a, b]))
    old = _traj(2, "g", [None, None], [0.0, 0.0], [0.0, 0.0])  # saved before state keys existed
    assert "<code>-</code>" in turns_html(old)


def test_run_page_includes_the_turn_tables(tmp_path):
    from agentrl.observe.report import RunData

    run = RunData(run_dir=tmp_path)
    run.trajectories = [
        _traj(0, "g", ["k0", "k1"], [0.5, 0.5], [0.0, 1.0]),
        _traj(1, "g", ["k0", "k2"], [-0.5, -0.5], [0.0, 0.0]),
    ]
    page = render(run)
    assert page.count("per-turn rewards, advantages and states") == 2 and "<code>k0</code>" in page
