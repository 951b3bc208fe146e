"""The run's display off a terminal: one plain line per step and per eval, rates with their counts."""

from agentrl.observe.progress import RunDisplay, eval_line, step_line

STEP = {
    "rollout/reward_mean": 0.4375,
    "rollout/solve_rate": 0.375,
    "rollout/episodes": 32.0,
    "rollout/infra_failures": 1.0,
    "rollout/tool_use_rate": 0.96875,
    "train/loss": 0.01234,
    "train/step_time_s": 6.04,
    "time/wait_rollout_s": 5.1,
    "time/weight_sync_s": 1.23,
    "time/step_s": 12.34,
    "memory/rss_gb": 3.42,
}
EVAL = {"eval/solve_rate": 0.5, "eval/episodes": 500.0, "eval/infra_failures": 0.0, "eval/tool_use_rate": 1.0}


def test_a_step_line_has_the_counts_and_where_the_time_went():
    assert step_line(3, 120, STEP) == (
        "step 3/120  reward 0.438  solve 0.375 (12/32 solved, 1 infra)  tool use 0.97  loss 0.01234  "
        "12.3 s (rollout wait 5.1, train 6.0, sync 1.2)  rss 3.4 GB"
    )
    assert eval_line(3, EVAL) == "eval after step 3: solve 0.500 (250/500 solved, 0 infra)  tool use 1.00"
    assert step_line(1, 2, {"rollout/solve_rate": 0.0}) == "step 1/2  solve 0.000"  # what a row lacks is left out


def test_off_a_terminal_every_step_and_eval_is_one_line_on_stderr(capsys):
    d = RunDisplay(True, 120, terminal=False)
    d.note("sandbox: local")
    d.update(0, EVAL)
    d.update(3, {**STEP, **EVAL})
    d.close()
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "sandbox: local",
        "eval after step 0: solve 0.500 (250/500 solved, 0 infra)  tool use 1.00",
        step_line(3, 120, STEP),
        eval_line(3, EVAL),
    ]


def test_quiet_prints_only_the_notes(capsys):
    d = RunDisplay(False, 120, terminal=False)
    d.note("stopped")
    d.update(3, STEP)
    assert capsys.readouterr().err.splitlines() == ["stopped"]


def test_a_long_eval_says_how_far_it_is_every_tenth_of_its_episodes():
    from agentrl.jobs.run.held_out import EvalProgress
    from agentrl.trajectory import Outcome, Trajectory

    said = []
    tick = EvalProgress(20, said.append, quiet_s=0.0)
    for i in range(20):
        t = Trajectory(f"e{i}", f"g{i}", "x", prompt_len=0, reward=float(i % 2), outcome=Outcome.OK)
        if i == 3:
            t.outcome = Outcome.ENGINE_ERROR
        tick(t)
        tick(Trajectory(f"e{i}", f"g{i}", "x", prompt_len=0, info={"segment": 0}))  # not a task's end
    assert len(said) == 9  # 2, 4, ..., 18 of 20: the end is the eval's own line
    assert said[1].startswith("eval: 4/20 episodes, 1 solved, 1 infra, ") and said[1].endswith(" min")
    assert said[-1].startswith("eval: 18/20 episodes, 8 solved, 1 infra, ")
    quick = []
    tick = EvalProgress(20, quick.append)  # a quick eval (under quiet_s) says nothing
    for i in range(20):
        tick(Trajectory(f"e{i}", f"g{i}", "x", prompt_len=0, outcome=Outcome.OK))
    assert quick == []
