"""Exactly-once resume: the prompt stream, the staleness queue's snapshot, the ledger's rewind,
replay, and the crash tests — ``agentrl run`` SIGKILLed at random steps and inside checkpoint
writes, then resumed: no prompt lost or trained twice, and with replayed rollouts the final
parameters equal the uninterrupted run's bitwise. ``bench/bench_faults.py`` runs the full 20 kills.
"""

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

import agentrl
from agentrl.batches.ledger import Ledger, read_ledger, rewind
from agentrl.batches.prompt_stream import PromptStream
from agentrl.batches.staleness import StalenessQueue
from agentrl.envs.base import AgentEnv, join_messages, new_stats
from agentrl.errors import ConfigError
from agentrl.jobs.crash_harness import (
    final_checkpoint,
    ledger_check,
    run_with_kills,
    same_weights,
    small_run_cmd,
)
from agentrl.trajectory import Trajectory

KILLS = int(os.environ.get("AGENTRL_CI_KILLS", "4"))  # bench/bench_faults.py: 20


# -- units -------------------------------------------------------------------------------------
def test_prompt_stream_hands_out_requeued_first_and_round_trips():
    s = PromptStream()
    assert [s.take() for _ in range(4)] == [0, 1, 2, 3]
    s.give_back(2)
    s.give_back(0)
    assert s.take() == 0 and s.take() == 2 and s.take() == 4
    s.give_back(1)
    st = s.state(outstanding=[3])
    assert st == {"next": 5, "requeued": [1, 3], "drops": {}, "abandoned": [], "redrops": 0}
    r = PromptStream.from_state(st)
    assert [r.take() for _ in range(3)] == [1, 3, 5]
    with pytest.raises(ValueError, match="never handed out"):
        r.give_back(99)
    with pytest.raises(ValueError, match="already requeued"):
        r.give_back(0), r.give_back(0)


def test_prompt_stream_abandons_a_prompt_dropped_max_drops_times():
    s = PromptStream(max_drops=2)
    assert [s.take() for _ in range(3)] == [0, 1, 2]
    assert s.drop(1) is True and s.take() == 1  # first drop: runs again
    assert s.drop(2) is True
    s.trained([2])  # trained at last: its count is forgotten
    assert s.drop(1) is False and s.abandoned == [1]  # second drop of 1: abandoned, never handed out again
    assert s.take() == 2 and s.take() == 3
    st = s.state()
    assert st["abandoned"] == [1] and st["drops"] == {} and st["redrops"] == 1  # 1's second drop
    r = PromptStream.from_state({**st, "drops": {"3": 1}}, max_drops=2)
    assert r.drop(3) is False and r.abandoned == [1, 3] and r.redrops == 2
    unlimited = PromptStream()
    unlimited.take()
    assert all(unlimited.drop(0) and unlimited.take() == 0 for _ in range(10))
    assert unlimited.redrops == 9


def _traj(gid, version):
    return Trajectory(
        episode_id=f"{gid}-0",
        group_id=gid,
        env_id="x",
        prompt_len=1,
        token_ids=[1, 2],
        loss_mask=[0, 1],
        logprobs=[0.0, -0.5],
        turn_ids=[-1, 0],
        versions=[-1, version],
    )


def test_staleness_queue_gives_dropped_positions_back_and_restores_a_snapshot():
    async def main():
        dropped = []
        q = StalenessQueue(1, 1, on_drop=dropped.append)
        for _ in range(2):
            await q.admit()
        await q.put(1, [_traj("g1", 0)], position=11)
        await q.put(0, [_traj("g0", 0)], position=10)
        groups, pos = await q.get_batch_with_positions()
        assert pos == [10] and groups[0][0].group_id == "g0"
        await q.set_version(2)  # g1 (version 0) is now 2 behind with k=1: dropped on the next get
        task = asyncio.create_task(q.get_batch_with_positions())
        await asyncio.sleep(0.05)
        assert dropped == [11] and q.dropped_groups == 1 and not task.done()
        task.cancel()
        # snapshot/restore: the restored group goes first and counts as outstanding
        await q.put(7, [_traj("g7", 2)], position=7)
        snap = q.snapshot()
        assert [p for p, _ in snap["ready"]] == [7] and snap["dropped_groups"] == 1
        r = StalenessQueue(1, 1)
        r.version = 2
        r.restore(snap["ready"], snap["dropped_groups"], snap["untrained_groups"])
        assert r.admitted - r.dropped_groups - r.untrained_groups - r.version * r.B == 1
        assert r.can_admit()  # k=1, B=1: two outstanding allowed
        await r.admit()
        assert not r.can_admit()
        groups, pos = await r.get_batch_with_positions()
        assert pos == [7]

    asyncio.run(main())


def test_rewind_drops_what_came_after_the_checkpoint(tmp_path):
    led = Ledger(tmp_path)
    for s in (1, 2, 3):
        led.append(s, s, [s * 10], [f"g{s}"])
    with open(tmp_path / "ledger.jsonl", "a") as f:
        f.write('{"step": 4, "posi')  # torn by a kill
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in (0, 1, 2, 3)))
    (tmp_path / "trajectories").mkdir()
    for s in (1, 2, 3):
        (tmp_path / "trajectories" / f"step_{s:06d}.jsonl").write_text("")
    rewind(tmp_path, 2)
    assert [r["step"] for r in read_ledger(tmp_path)] == [1, 2]
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert sorted(p.name for p in (tmp_path / "trajectories").iterdir()) == ["step_000001.jsonl", "step_000002.jsonl"]


def test_a_resumed_run_hides_the_tensorboard_steps_after_its_checkpoint(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from agentrl.observe.sinks import make_sinks

    def log(steps, value, resume_step=None):
        sinks, _ = make_sinks(tmp_path, tensorboard=True, wandb_project=None, config={}, resume_step=resume_step)
        for s in steps:
            sinks.write(s, {"train": {"loss": value + s}})
        sinks.close()

    log(range(1, 6), 0.0)  # the interrupted run got to step 5; its checkpoint is step 2
    log(range(3, 5), 100.0, resume_step=2)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 1.0), (2, 2.0), (3, 103.0), (4, 104.0)]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 3, 4]  # JSONL appends; rewind() trims it on resume


def test_fault_point_kills_the_process_at_the_nth_pass():
    code = (
        "from agentrl.common.faults import fault_point\n"
        "for i in range(5):\n    print(i, flush=True)\n    fault_point('x')\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "AGENTRL_FAULT_KILL": "y:1,x:3"},
    )
    assert p.returncode == -signal.SIGKILL and p.stdout.split() == ["0", "1", "2"]
    p = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "AGENTRL_FAULT_KILL": "x:zero"},
    )
    assert p.returncode == 1 and "is not NAME:N" in p.stderr


def test_replay_source_names_what_is_missing(tmp_path):
    from agentrl.batches.replay import ReplaySource

    with pytest.raises(ConfigError, match="not a run directory"):
        ReplaySource(tmp_path, 1)
    (tmp_path / "config.yaml").write_text("logging:\n  trajectories_per_step: 32\n")
    with pytest.raises(ConfigError, match="trajectories_per_step=32"):
        ReplaySource(tmp_path, 1)
    (tmp_path / "config.yaml").write_text("logging:\n  trajectories_per_step: -1\n")
    Ledger(tmp_path).append(1, 1, [0], ["g0"])
    with pytest.raises(ConfigError, match=r"step\(s\) \[1, 2\]"):
        ReplaySource(tmp_path, 2)


# -- in process: drops, requeues and a resume from a middle checkpoint ------------------------------
_SLOWED: set = set()


class SlowOnceEnv(AgentEnv):
    """One turn, reward for short replies; every 3rd prompt (position = task seed with rollout.seed=0)
    takes 1.5 s on its first attempt only, so at staleness 1 it comes back too stale, is dropped and
    must run again; later attempts are instant."""

    has_eval_split = False  # the eval runs on the same kind of prompts (the env contract's declaration)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = seed
        msgs = [{"role": "user", "content": f"Say something short ({seed})."}]
        return join_messages(msgs), {"messages": msgs, "tools": [], "task": {"id": seed}}

    async def astep(self, action):
        if self.position % 3 == 1 and self.position not in _SLOWED:
            await asyncio.sleep(1.5)
            _SLOWED.add(self.position)  # the whole group slept; the next attempt is fast
        return "", 1.0 - min(len(action), 40) / 40, True, False, {"messages": [], "tool_stats": new_stats()}

    def step(self, action):
        raise AssertionError("astep is used")


_TRAINER_VERSION = [lambda: 0]  # set by the test to read the running trainer's version


class AlwaysSlowEnv(SlowOnceEnv):
    """Position 1 outlasts the staleness bound on every attempt (as a tool that always times out): its
    step returns only after the trainer moved 2 versions past the one it started at, so with
    max_staleness=1 its group is always too stale, however fast or slow the machine is."""

    async def astep(self, action):
        if self.position == 1:
            start = _TRAINER_VERSION[0]()
            while _TRAINER_VERSION[0]() < start + 2:
                await asyncio.sleep(0.01)
        return "", 1.0, True, False, {"messages": [], "tool_stats": new_stats()}


agentrl.register("test/SlowOnce-v0", entry_point=SlowOnceEnv, override=True)
agentrl.register("test/AlwaysSlow-v0", entry_point=AlwaysSlowEnv, override=True)


def test_dropped_and_in_flight_prompts_run_again_exactly_once_after_a_resume(tiny_model_dir, tmp_path):
    from agentrl.config.schema import load_config
    from agentrl.jobs.run import Runner

    out = tmp_path / "run"

    def cfg(steps, *extra):
        return load_config(
            [],
            [
                f"output_dir={out}",
                f"model.path={tiny_model_dir}",
                "env.id=test/SlowOnce-v0",
                "env.kwargs={}",
                "rollout.max_new_tokens=4",
                "rollout.max_turns=1",
                "rollout.score_truncated=true",
                "rollout.group_size=2",
                "train.groups_per_step=2",
                f"train.steps={steps}",
                "train.max_staleness=1",
                "train.checkpoint_every=1",
                "eval.num_tasks=0",
                "trainer.lr=1e-2",
                "trainer.loss_agg=token-mean",
                "logging.tensorboard=false",
                *extra,
            ],
        )

    _SLOWED.clear()
    asyncio.run(Runner(cfg(10), progress=False).run())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("staleness/dropped_groups", 0) for r in rows) >= 1, "the workload should drop a group"
    first = ledger_check(out)
    assert first["duplicates"] == [] and first["lost"] == [], first
    # crash after step 5: later checkpoints never happened; the run resumes from step 5
    ckpts = sorted((out / "checkpoints").iterdir())
    mid = next(
        c
        for c in ckpts[2:-1]
        if json.loads((c / "trainer_state.json").read_text())["extra"]["stream"]["requeued"]
        or (c / "rollouts.jsonl").read_text()
    )
    for c in ckpts:
        if c.name > mid.name:
            shutil.rmtree(c)
    mid_step = int(mid.name[5:])
    state = json.loads((mid / "trainer_state.json").read_text())["extra"]
    kept = [json.loads(line)["position"] for line in (mid / "rollouts.jsonl").read_text().splitlines()]
    asyncio.run(Runner(cfg(10, "train.resume=true"), progress=False).run())
    chk = ledger_check(out)
    assert chk["steps"] == list(range(1, 11)), chk
    assert chk["duplicates"] == [] and chk["lost"] == [], chk
    after = [p for r in read_ledger(out) if r["step"] > mid_step for p in r["positions"]]
    assert set(state["stream"]["requeued"]) | set(kept) <= set(after) | set(chk_outstanding(out)), (state, kept)


def test_a_prompt_always_too_stale_is_abandoned_not_rerun_for_ever(tiny_model_dir, tmp_path, monkeypatch):
    import agentrl.jobs.run.feed as runner_mod  # the producer makes the specs there
    from agentrl.config.schema import load_config
    from agentrl.jobs.run import Runner

    out = tmp_path / "run"
    cfg = load_config(
        [],
        [
            f"output_dir={out}",
            f"model.path={tiny_model_dir}",
            "env.id=test/AlwaysSlow-v0",
            "env.kwargs={}",
            "rollout.max_new_tokens=4",
            "rollout.max_turns=1",
            "rollout.score_truncated=true",
            "rollout.group_size=2",
            "train.groups_per_step=2",
            "train.steps=40",
            "train.max_staleness=1",
            "train.max_prompt_drops=2",
            "eval.num_tasks=0",
            "trainer.lr=1e-2",
            "trainer.loss_agg=token-mean",
            "logging.tensorboard=false",
        ],
    )
    runner = Runner(cfg, progress=False)
    _TRAINER_VERSION[0] = lambda: runner.trainer.version
    attempts = []  # (position, attempt) of every group the producer starts
    real_make_specs = runner_mod.make_specs

    def spy(*args, **kw):
        attempts.append((kw["start"], kw.get("attempt", 0)))
        return real_make_specs(*args, **kw)

    monkeypatch.setattr(runner_mod, "make_specs", spy)
    try:
        asyncio.run(runner.run())
    finally:
        _TRAINER_VERSION[0] = lambda: 0
    assert [a for p, a in attempts if p == 1] == [0, 1], attempts  # the rerun draws new samples
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-2]["staleness/abandoned_prompts"] == 1 and rows[-2]["staleness/dropped_groups"] >= 2
    assert rows[-2]["staleness/rerun_drops"] >= 1
    chk = ledger_check(out)
    assert chk["duplicates"] == [] and chk["lost"] == [] and chk["steps"] == list(range(1, 41)), chk
    assert 1 not in [p for r in read_ledger(out) for p in r["positions"]]
    stream = json.loads((final_checkpoint(out) / "trainer_state.json").read_text())["extra"]["stream"]
    assert stream["abandoned"] == [1]


def chk_outstanding(run_dir):
    last = final_checkpoint(run_dir)
    st = json.loads((last / "trainer_state.json").read_text())["extra"]["stream"]
    return st["requeued"] + [
        json.loads(line)["position"] for line in (last / "rollouts.jsonl").read_text().splitlines()
    ]


# -- crash tests: the real command line, SIGKILLed ----------------------------------------------
@pytest.mark.slow
def test_sigkilled_async_run_trains_every_prompt_exactly_once(tiny_model_dir, tmp_path):
    """Live rollouts at staleness 2 (groups finish out of order, some are dropped and requeued):
    killed KILLS times, half of them inside a checkpoint write, resumed each time."""
    out = tmp_path / "live"
    steps = 6 * KILLS + 4  # a kill may land a few steps past its target: room for every kill
    res = run_with_kills(small_run_cmd(tiny_model_dir, out, steps, "train.max_staleness=2"), out, kills=KILLS, seed=1)
    assert len(res["kills"]) == KILLS, res
    assert {k["at"] for k in res["kills"]} == ({"step", "checkpoint_write"} if KILLS > 1 else {"step"})
    chk = ledger_check(out)
    assert chk["steps"] == list(range(1, steps + 1)), chk
    assert chk["duplicates"] == [] and chk["lost"] == [], chk
    assert chk["trained"] == steps * 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == steps
    # the killed checkpoint writes left no half checkpoint behind as a checkpoint
    for d in (out / "checkpoints").iterdir():
        assert d.name.endswith(".tmp") or (d / "COMPLETE").exists(), d


@pytest.mark.slow
def test_sigkilled_replayed_run_reproduces_the_parameters_bitwise(tiny_model_dir, tmp_path):
    steps = 6 * KILLS + 3
    rec = tmp_path / "recorded"
    subprocess.run(small_run_cmd(tiny_model_dir, rec, steps, "train.max_staleness=1"), check=True, capture_output=True)
    ref = tmp_path / "replay_ref"
    subprocess.run(small_run_cmd(tiny_model_dir, ref, steps, f"train.replay={rec}"), check=True, capture_output=True)
    killed = tmp_path / "replay_killed"
    res = run_with_kills(
        small_run_cmd(tiny_model_dir, killed, steps, f"train.replay={rec}"), killed, kills=KILLS, seed=2
    )
    assert len(res["kills"]) == KILLS, res
    assert same_weights(final_checkpoint(ref), final_checkpoint(killed)) == []
    import torch
    from safetensors.torch import load_file

    start, end = (
        load_file(str(tiny_model_dir / "model.safetensors")),
        load_file(str(final_checkpoint(ref) / "model.safetensors")),
    )
    assert any(not torch.equal(start[k], end[k]) for k in end), "training did not change the weights: nothing compared"
    # replay reproduces the recorded live run itself, too (the trajectories round-trip exactly)
    assert same_weights(final_checkpoint(rec), final_checkpoint(ref)) == []
    assert read_ledger(killed) == read_ledger(rec)
