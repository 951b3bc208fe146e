"""The held-out eval's counting (agentrl.jobs.run.held_out): one trajectory per task, whatever the episode
manager returned. The eval through the agent program end to end: tests/agents/test_proxy_run.py."""

from dataclasses import replace

from agentrl.episodes.summary import eval_stats
from agentrl.jobs.run.held_out import eval_specs, per_task
from agentrl.trajectory import Outcome, Trajectory


def _traj(spec, reward=1.0, **kw):
    return Trajectory(
        episode_id=f"{spec.group_id}-{spec.sample_index}",
        group_id=spec.group_id,
        env_id="e",
        prompt_len=1,
        sample_index=spec.sample_index,
        reward=reward,
        **kw,
    )


def test_eval_specs_are_one_per_task_with_fixed_seeds():
    specs = eval_specs(3)
    assert [s.group_id for s in specs] == ["eval-0", "eval-1", "eval-2"]
    assert eval_specs(3) == specs and len({s.task_seed for s in specs}) == 3


def test_a_split_episode_counts_once_by_its_last_trajectory():
    specs = eval_specs(2)
    last = _traj(specs[0], reward=1.0)
    earlier = [replace(last, episode_id=f"eval-0-0-seg{k}", reward=1.0, info={"segment": k}) for k in range(2)]
    failed = _traj(specs[1], reward=0.0)
    tasks = per_task(specs, [*earlier, failed, last], "e")
    assert tasks == [last, failed]
    assert eval_stats(tasks)["episodes"] == 2 and eval_stats(tasks)["solve_rate"] == 0.5


def test_a_task_with_no_trajectory_is_an_infrastructure_failure_in_the_denominator():
    specs = eval_specs(4)
    tasks = per_task(specs, [_traj(s) for s in specs[:3]], "e")
    assert [t.group_id for t in tasks] == ["eval-0", "eval-1", "eval-2", "eval-3"]
    lost = tasks[-1]
    assert lost.outcome == Outcome.ENV_ERROR and "no trajectory" in lost.outcome_detail and not lost.trainable
    stats = eval_stats(tasks)
    assert (stats["episodes"], stats["solve_rate"], stats["infra_failures"]) == (4, 0.75, 1)
