"""The main job end to end on a tiny model: the loop learns, logs, checkpoints and resumes."""

import asyncio
import json

import pytest
from reward_curve import rise, step_rewards
from short_run import ShortEnv
from short_run import short_run_cfg as _cfg

import agentrl
from agentrl.config.schema import load_config
from agentrl.jobs.run import Runner


class BrokenSandboxEnv(ShortEnv):
    """ShortEnv whose sandbox fails on every task seed divisible by 4 (an infrastructure failure)."""

    def reset(self, *, seed=None, options=None):
        self.broken = seed % 4 == 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.broken:
            from agentrl.errors import SandboxError

            raise SandboxError("planted sandbox failure")
        return super().step(action)


agentrl.register("test/BrokenSandbox-v0", entry_point=BrokenSandboxEnv, override=True)


def test_grpo_reward_rises_and_run_writes_everything(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    summary = asyncio.run(Runner(_cfg(tiny_model_dir, out, 20), progress=False).run())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = step_rewards(out)
    assert len(rewards) == 20
    first, last = rise(rewards, 4)
    assert last > first + 0.1, f"reward did not rise: {rewards}"
    assert summary["steps"] == 20 and (out / "curves.png").stat().st_size > 1000
    assert (out / "summary.json").exists() and (out / "config.yaml").exists()
    assert all(r.get("staleness/staleness_max", 0) == 0 for r in rows)  # staleness 0 = on-policy
    steps = [r for r in rows if "rollout/sampled_tokens" in r]
    assert all(r["engine/generated_tokens"] > 0 for r in steps)  # the local engine's own counters, per step
    ckpts = sorted((out / "checkpoints").glob("step_*/COMPLETE"))
    assert ckpts, "no complete checkpoint"


def test_resume_continues_step_and_data_position(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    asyncio.run(Runner(_cfg(tiny_model_dir, out, 2, ["eval.num_tasks=0"]), progress=False).run())
    state = json.loads(next((out / "checkpoints").glob("step_000002/trainer_state.json")).read_text())
    assert state["extra"]["step"] == 2 and state["extra"]["data_position"] >= 8
    runner = Runner(_cfg(tiny_model_dir, out, 3, ["eval.num_tasks=0", "train.resume=true"]), progress=False)
    summary = asyncio.run(runner.run())
    assert summary["steps"] == 3
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps.count(3) >= 1 and steps.count(1) == 1  # appended, not rewritten


def test_temperature_mismatch_is_a_config_error(tiny_model_dir, tmp_path):
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match="trainer.temperature"):
        Runner(_cfg(tiny_model_dir, tmp_path, 1, ["rollout.temperature=0.7"]), progress=False)


def test_null_trainer_fields_are_resolved_per_run():
    """trainer.lr / norm_lr_scale / lr_schedule / min_lr_ratio / total_steps / loss_agg null = chosen by
    the run: by model (built-in or --model), the run's steps, and the algo preset's aggregation
    (dr_grpo's constant-length normaliser included); explicit values are kept."""
    from agentrl.config.plan import resolve
    from agentrl.trainer.config import AUTO, TrainerConfig
    from agentrl.warmstart.default_model import BUILTIN_RL

    def trainer(*sets):
        return resolve(load_config([], list(sets))).cfg.trainer

    builtin = trainer("train.steps=50", "trainer.mini_batches=2")
    assert {k: getattr(builtin, k) for k in BUILTIN_RL} == BUILTIN_RL and builtin.lr_schedule == "cosine"
    assert builtin.loss_agg == "seq-mean-token-mean" and builtin.total_steps == 100
    user = trainer("model.path=/m", "algo.name=dr_grpo", "rollout.max_new_tokens=100", "rollout.max_turns=3")
    assert user.lr == AUTO["lr"] and user.loss_agg == "seq-mean-token-sum-norm" and user.loss_norm_len == 300
    assert (user.norm_lr_scale, user.lr_schedule, user.min_lr_ratio, user.total_steps) == (1.0, "constant", 0.0, 120)
    kept = trainer(
        "trainer.lr=3e-5",
        "trainer.loss_agg=token-mean",
        "trainer.total_steps=7",
        "trainer.norm_lr_scale=3",
        "trainer.lr_schedule=constant",
    )
    assert (kept.lr, kept.loss_agg, kept.norm_lr_scale, kept.lr_schedule, kept.total_steps, kept.min_lr_ratio) == (
        3e-5,
        "token-mean",
        3.0,
        "constant",
        7,
        0.1,
    )
    api = TrainerConfig().resolved()
    assert {k: getattr(api, k) for k in AUTO} == AUTO


def test_run_saves_trajectories_with_advantages_and_the_report_reads_them(tiny_model_dir, tmp_path):
    from agentrl.observe.report import load_run, render
    from agentrl.trajectory import read_jsonl

    out = tmp_path / "run"
    asyncio.run(
        Runner(
            _cfg(tiny_model_dir, out, 2, ["eval.num_tasks=0", "logging.trajectories_per_step=5"]), progress=False
        ).run()
    )
    saved = list(read_jsonl(out / "trajectories" / "step_000002.jsonl"))
    assert len(saved) == 5
    for t in saved:
        adv = t.info["advantages"]
        assert len(adv) == len(t.token_ids) and all(a == 0 for a, m in zip(adv, t.loss_mask) if not m)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "rollout/reward_mean" in r]
    assert len(rows) == 2 and all(r["rollout/tokens_per_episode"] > 0 and "rollout/distinct_frac" in r for r in rows)
    assert (
        sum(r.get("rollout/outcome/ok", 0) for r in rows)
        + sum(r.get("rollout/outcome/truncated_length", 0) for r in rows)
        == 2 * 4 * 8
    )
    page = render(load_run(out))
    assert page.count('class="traj"') == 10 and "advantage" in page and "⟨" not in page  # token text decoded


def test_a_monitor_alert_in_pause_on_checkpoints_and_stops(tiny_model_dir, tmp_path, monkeypatch):
    import agentrl.jobs.run.outputs as runner_mod  # the monitors run there
    from agentrl.observe.monitors import Alert

    # fake monitor (the checks themselves are tested in test_monitors.py): fires at step 2
    monkeypatch.setattr(
        runner_mod,
        "new_alerts",
        lambda history, cfg: [Alert(2, "kl_spike", "planted")] if history[-1]["step"] == 2 else [],
    )
    out = tmp_path / "run"
    summary = asyncio.run(
        Runner(_cfg(tiny_model_dir, out, 5, ["eval.num_tasks=0", "monitor.pause_on=[kl_spike]"]), progress=False).run()
    )
    assert summary["steps"] == 2 and summary["paused"]["kind"] == "kl_spike"
    assert (out / "checkpoints" / "step_000002" / "COMPLETE").exists()
    assert json.loads((out / "alerts.jsonl").read_text())["message"] == "planted"


def test_a_lasting_alert_is_shown_once_and_logged_every_step(tiny_model_dir, tmp_path, monkeypatch):
    import agentrl.jobs.run.outputs as runner_mod  # the monitors run there
    from agentrl.observe.monitors import Alert

    firing = {2, 3, 4, 6}  # diversity_collapse on steps 2-4, then again at 6
    monkeypatch.setattr(
        runner_mod,
        "new_alerts",
        lambda history, cfg: (
            [Alert(history[-1]["step"], "diversity_collapse", "low")] if history[-1]["step"] in firing else []
        ),
    )
    r = Runner(_cfg(tiny_model_dir, tmp_path, 7), progress=False)
    notes = []
    display = type("D", (), {"note": lambda self, m: notes.append(m)})()
    for step in range(1, 8):
        r.history.append({"step": step})
        assert r.outputs.monitor(display) is False
    assert [n.split()[2] for n in notes] == ["2", "6"], notes
    assert [json.loads(line)["step"] for line in (tmp_path / "alerts.jsonl").read_text().splitlines()] == [2, 3, 4, 6]


def test_unknown_pause_on_kind_is_a_config_error(tiny_model_dir, tmp_path):
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match="kl_spik"):
        Runner(_cfg(tiny_model_dir, tmp_path / "r", 1, ["monitor.pause_on=[kl_spik]"]), progress=False)


def test_cpu_threads_split_the_cores_for_the_local_engine_and_the_run_restores_them(
    tiny_model_dir, tmp_path, monkeypatch
):
    import torch

    from agentrl.config.plan import resolve
    from agentrl.models.device import Accelerators

    def threads(*sets, cores=2):
        gpu = Accelerators(True, 1, ("stand-in GPU",))  # model.device=cuda resolves without a GPU here
        return resolve(load_config([], list(sets)), cores=cores, found=gpu).cfg.engine.cpu_threads

    cpu = "model.device=cpu"
    assert threads(cpu) == 1 and threads(cpu, cores=16) == 8 and threads(cpu, cores=1) == 1
    assert threads(cpu, "engine.cpu_threads=3") == 3 and threads(cpu, "engine.cpu_threads=0") == 0  # 0: torch's default
    assert threads(cpu, "engine.kind=sglang") == 0 and threads("model.device=cuda") == 0
    # on-policy, the engine and the trainer take turns: each gets every core, unless asked otherwise
    assert (
        threads(cpu, "train.max_staleness=0") == 0
        and threads(cpu, "train.max_staleness=0", "engine.cpu_threads=1") == 1
    )
    calls, real = [], torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), real(n)))
    before = torch.get_num_threads()
    in_setup, real_setup = [], Runner._setup  # setup may build the SFT warm start: it keeps every core
    monkeypatch.setattr(Runner, "_setup", lambda self: (in_setup.append(torch.get_num_threads()), real_setup(self)))
    asyncio.run(Runner(_cfg(tiny_model_dir, tmp_path / "run", 1, ["engine.cpu_threads=1"]), progress=False).run())
    assert in_setup == [before]
    assert calls == ([1, before] if before != 1 else [1]) and torch.get_num_threads() == before


def test_idle_cores_are_lent_to_whichever_of_engine_and_trainer_computes_alone(tiny_model_dir, tmp_path, monkeypatch):
    import os
    import threading

    import torch

    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core here: there is nothing to lend")
    calls, real = [], torch.set_num_threads
    monkeypatch.setattr(
        torch, "set_num_threads", lambda n: (calls.append((threading.current_thread().name, n)), real(n))
    )
    before = torch.get_num_threads()
    sets = ["engine.cpu_threads=1", "engine.lend_idle_cores=true", "train.max_staleness=1"]
    asyncio.run(Runner(_cfg(tiny_model_dir, tmp_path / "run", 2, sets), progress=False).run())
    engine = {n for name, n in calls if name == "agentrl-local-engine"}
    trainer = {n for name, n in calls if name.startswith("asyncio_")}  # train_step's worker thread
    assert cores in engine  # the evaluations: the trainer idle, the engine had every core
    assert trainer and trainer <= {1, cores}
    assert torch.get_num_threads() == before


def test_infra_failures_count_as_unsolved_and_alert(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    summary = asyncio.run(Runner(_cfg(tiny_model_dir, out, 2, ["env.id=test/BrokenSandbox-v0"]), progress=False).run())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    broken_eval = sum((10_000_019 + i) % 4 == 0 for i in range(16))  # the eval's task seeds
    assert broken_eval == 4
    first, final = rows[0], rows[-1]
    assert (first["eval/episodes"], first["eval/infra_failures"], first["eval/infra_failure_rate"]) == (16, 4, 0.25)
    assert first["eval/solve_rate"] <= 12 / 16 and first["eval/outcome/sandbox_error"] == 4
    assert summary["eval_infra_failure_rate_start"] == summary["eval_infra_failure_rate_end"] == 0.25
    assert summary["eval_episodes_start"] == summary["eval_episodes_end"] == 16
    assert summary["eval_infra_failures_start"] == summary["eval_infra_failures_end"] == 4
    assert summary["eval_solve_rate_end"] == final["eval/solve_rate"] <= 0.75
    steps = [r for r in rows if "rollout/episodes" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["rollout/episodes"] == 32 and r["rollout/infra_failures"] == r.get("rollout/outcome/sandbox_error", 0)
        assert r["rollout/infra_failure_rate"] == r["rollout/infra_failures"] / 32
        assert r["rollout/solve_rate"] <= 1 - r["rollout/infra_failure_rate"]
    alerts = [json.loads(line) for line in (out / "alerts.jsonl").read_text().splitlines()]
    infra = [(a["step"], a["message"].split(":")[0]) for a in alerts if a["kind"] == "infra_failures"]
    assert infra[0] == (0, "eval") and infra[-1] == (2, "eval")  # the first and the final eval
    assert len(infra) == len(set(infra))  # the final eval's row does not repeat step 2's alerts
    ro = summary["rollout"]  # every training episode the run generated (a group in flight at the end too)
    assert ro["batched_episodes"] == sum(r["rollout/episodes"] for r in steps) == 64  # the steps' batches
    unbatched = sum(ro["groups_not_batched"].values())
    assert ro["episodes"] >= ro["batched_episodes"] + 8 * unbatched, ro  # groups of 8
    assert ro["infra_failures"] >= sum(r["rollout/infra_failures"] for r in steps) > 0
    assert (
        ro["infra_failure_rate"]
        == ro["infra_failures"] / ro["episodes"]
        == ro["outcomes"]["sandbox_error"] / ro["episodes"]
    )


def test_pause_on_infra_failures_stops_before_training_when_the_first_eval_fails(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    summary = asyncio.run(
        Runner(
            _cfg(tiny_model_dir, out, 3, ["env.id=test/BrokenSandbox-v0", "monitor.pause_on=[infra_failures]"]),
            progress=False,
        ).run()
    )
    assert summary["steps"] == 0 and summary["paused"]["kind"] == "infra_failures"
    assert summary["paused"]["message"].startswith("eval: 4 of 16 episodes (25.0%)")


def test_infra_alerts_of_the_rollouts_and_of_an_eval_are_each_shown(tiny_model_dir, tmp_path, monkeypatch):
    import agentrl.jobs.run.outputs as runner_mod  # the monitors run there
    from agentrl.observe.monitors import Alert

    def fake(history, cfg):
        step = history[-1]["step"]
        return ([Alert(step, "infra_failures", "rollout: x", about="rollout")] if step <= 3 else []) + (
            [Alert(step, "infra_failures", "eval: y", about="eval")] if step == 2 else []
        )

    monkeypatch.setattr(runner_mod, "new_alerts", fake)
    r = Runner(_cfg(tiny_model_dir, tmp_path, 4), progress=False)
    notes = []
    display = type("D", (), {"note": lambda self, m: notes.append(m)})()
    for step in range(1, 5):
        r.history.append({"step": step})
        r.outputs.monitor(display)
    assert [(n.split()[2], n.split()[4]) for n in notes] == [("1", "rollout:"), ("2", "eval:")], notes
    assert notes[0].startswith("[red]infra[/]")


def test_cli_run_summary_shows_infra_failure_rates_beside_solve_rates(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    sets = [
        a
        for kv in [
            "rollout.max_new_tokens=6",
            "rollout.max_turns=1",
            "rollout.score_truncated=true",
            "rollout.group_size=4",
            "train.groups_per_step=2",
            "train.max_staleness=0",
            "eval.num_tasks=8",
            "eval.env_kwargs={}",
            "env.kwargs={}",
            "logging.tensorboard=false",
            "train.checkpoint_every=0",
        ]
        for a in ("--set", kv)
    ]
    res = CliRunner().invoke(
        app,
        [
            "run",
            "--env",
            "test/BrokenSandbox-v0",
            "--model",
            str(tiny_model_dir),
            "--steps",
            "1",
            "-o",
            str(tmp_path / "run"),
            "-q",
            *sets,
        ],
    )
    assert res.exit_code == 0, res.output
    broken = sum((10_000_019 + i) % 4 == 0 for i in range(8))
    assert broken == 2
    lines = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in res.output.splitlines()
        if line.count("│") == 3
    }
    assert lines["eval_infra_failure_rate_start"] == lines["eval_infra_failure_rate_end"] == "0.250"
    assert lines["eval_episodes_start"] == lines["eval_episodes_end"] == "8"  # the rate's denominator beside it
    assert lines["eval_infra_failures_start"] == lines["eval_infra_failures_end"] == "2"
    assert float(lines["eval_solve_rate_end"]) <= 0.75 and "rollout_infra_failure_rate" in lines
