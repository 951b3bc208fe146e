"""Per-step rollout statistics and the trajectory log the report reads."""

import pytest

from agentrl.observe.run_log import TrajectoryLog, rollout_extra
from agentrl.trajectory import Outcome, Trajectory, TurnRecord, read_jsonl


def traj(ep, group, sampled, outcome=Outcome.OK):
    ids = [1, 2] + sampled
    t = Trajectory(
        episode_id=ep,
        group_id=group,
        env_id="x",
        prompt_len=2,
        token_ids=ids,
        loss_mask=[0, 0] + [1] * len(sampled),
        logprobs=[0.0] * len(ids),
        turn_ids=[-1, -1] + [0] * len(sampled),
        versions=[-1, -1] + [1] * len(sampled),
        turns=[TurnRecord(0, 2, len(sampled), 0, "stop")],
        outcome=outcome,
    )
    t.validate()
    return t


def test_rollout_extra_counts_distinct_completions_and_outcomes():
    g1 = [traj("a0", "a", [5, 6]), traj("a1", "a", [5, 6]), traj("a2", "a", [7])]
    g2 = [traj("b0", "b", [5]), traj("b1", "b", [8, 9, 9], Outcome.ENGINE_ERROR)]
    s = rollout_extra([g1, g2])
    assert s["tokens_per_episode"] == pytest.approx((2 + 2 + 1 + 1 + 3) / 5)
    assert s["distinct_frac"] == pytest.approx((2 / 3 + 2 / 2) / 2)
    assert s["outcome/ok"] == 4 and s["outcome/engine_error"] == 1
    assert rollout_extra([]) == {}


def test_trajectory_log_writes_trained_first_with_advantages(tmp_path):
    g = [traj("a0", "a", [5, 6]), traj("a1", "a", [7], Outcome.SANDBOX_ERROR), traj("a2", "a", [8])]
    log = TrajectoryLog(tmp_path, per_step=-1)
    path = log.write(3, [g], [g[0], g[2]], [[0, 0, 0.5, 0.5], [0, 0, -0.5]])
    back = list(read_jsonl(path))
    assert path.name == "step_000003.jsonl" and [t.episode_id for t in back] == ["a0", "a2", "a1"]
    assert back[0].info["advantages"] == [0, 0, 0.5, 0.5] and "advantages" not in back[2].info
    assert not list(tmp_path.glob("trajectories/*.tmp"))
    assert [t.episode_id for t in read_jsonl(TrajectoryLog(tmp_path, 1).write(4, [g], [g[0]], [[0, 0, 1, 1]]))] == [
        "a0"
    ]
    assert TrajectoryLog(tmp_path, 0).write(5, [g], [], []) is None


def test_trajectory_log_rejects_misaligned_advantages(tmp_path):
    t = traj("a0", "a", [5, 6])
    with pytest.raises(ValueError, match="a0: 3 advantages for 4 tokens"):
        TrajectoryLog(tmp_path, -1).write(1, [[t]], [t], [[0, 0, 1]])
