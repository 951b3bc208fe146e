"""Graceful stop: ``Runner.request_stop`` and SIGTERM checkpoint the run and exit (143 for SIGTERM), the resume
is exactly once, and no SGLang server a run launched outlives it, whatever signal ends the run."""

import asyncio
import json
import shutil
import signal
import subprocess

import components
import pytest

from agentrl.jobs.crash_harness import final_checkpoint, ledger_check, small_run_cmd


def _small_run(out, model_dir, *extra: str) -> list[str]:
    """--set values of a small in-process run: 1-turn concise episodes, 2 groups of 2 per step, no eval."""
    return [
        f"output_dir={out}",
        f"model.path={model_dir}",
        "env.id=concise",
        "env.kwargs={n_turns: 1}",
        "rollout.max_new_tokens=4",
        "rollout.max_turns=1",
        "rollout.score_truncated=true",
        "rollout.group_size=2",
        "train.groups_per_step=2",
        "eval.num_tasks=0",
        "logging.tensorboard=false",
        *extra,
    ]


def test_request_stop_checkpoints_and_the_resume_is_exactly_once(tiny_model_dir, tmp_path):
    from agentrl.config.schema import load_config
    from agentrl.jobs.run import Runner

    out = tmp_path / "run"
    sets = _small_run(out, tiny_model_dir, "train.steps=6", "train.max_staleness=2", "trainer.lr=1e-2")
    sets.append("trainer.loss_agg=token-mean")
    runner = Runner(load_config([], sets), progress=False)

    async def main():
        task = asyncio.create_task(runner.run())
        while runner.step < 2:
            await asyncio.sleep(0.01)
        runner.request_stop("test")
        return await task

    summary = asyncio.run(main())
    assert summary["stopped"]["reason"] == "test" and 2 <= summary["steps"] < 6
    assert (out / "checkpoints" / f"step_{summary['steps']:06d}" / "COMPLETE").exists()
    summary2 = asyncio.run(Runner(load_config([], sets + ["train.resume=true"]), progress=False).run())
    assert summary2["steps"] == 6 and "stopped" not in summary2
    chk = ledger_check(out)
    assert chk["steps"] == list(range(1, 7)) and chk["duplicates"] == [] and chk["lost"] == [], chk


def test_a_stop_mid_step_interrupts_training_and_keeps_the_batch(tiny_model_dir, tmp_path):
    """A stop while the trainer works on step 3 does not wait for the step: the train step gives up
    at its next micro-batch, nothing is trained, and the checkpoint keeps step 3's batch, which the
    resumed run trains as its step 3 (exactly once, no episode generated twice for it)."""
    import threading

    from agentrl.config.schema import load_config
    from agentrl.jobs.run import Runner

    out = tmp_path / "run"
    # a sample per micro-batch: 4 per step
    sets = _small_run(out, tiny_model_dir, "train.steps=5", "train.max_staleness=0", "trainer.micro_batch_tokens=64")
    runner = Runner(load_config([], sets), progress=False)
    waiting = threading.Event()

    async def main():
        task = asyncio.create_task(runner.run())
        while getattr(runner, "trainer", None) is None:
            await asyncio.sleep(0.01)
        real = runner.trainer.train_step

        def held(samples, interrupt):  # step 3 waits in the trainer's thread until the stop reaches it
            if runner.step == 2:
                waiting.set()
                assert interrupt.wait(120), "the stop never reached the train step"
            return real(samples, interrupt)

        runner.trainer.train_step = held
        while not waiting.is_set() and not task.done():
            await asyncio.sleep(0.01)
        runner.request_stop("test")
        return await task

    summary = asyncio.run(main())
    assert summary["stopped"] == {"step": 2, "reason": "test"}
    ckpt = out / "checkpoints" / "step_000002"
    kept = [json.loads(x)["position"] for x in (ckpt / "rollouts.jsonl").read_text().splitlines()]
    assert len(kept) >= 2, kept  # the interrupted batch (and anything finished beside it)
    summary2 = asyncio.run(Runner(load_config([], sets + ["train.resume=true"]), progress=False).run())
    assert summary2["steps"] == 5 and "stopped" not in summary2
    from agentrl.batches.ledger import read_ledger

    step3 = next(r for r in read_ledger(out) if r["step"] == 3)
    assert step3["positions"] == kept[:2], (step3, kept)
    chk = ledger_check(out)
    assert chk["steps"] == list(range(1, 6)) and chk["duplicates"] == [] and chk["lost"] == [], chk


def _sigterm_when(proc, run_dir, step, timeout_s=300, sig=signal.SIGTERM):
    import time

    from agentrl.jobs.crash_harness import _last_step

    deadline = time.monotonic() + timeout_s
    while _last_step(run_dir) < step and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be stopped"
    proc.send_signal(sig)
    return proc.wait(timeout=timeout_s)


@pytest.mark.slow
def test_sigterm_stops_agentrl_run_with_a_checkpoint_and_exit_143(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    cmd = small_run_cmd(tiny_model_dir, out, 40, "train.checkpoint_every=0", "train.max_staleness=1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rc = _sigterm_when(proc, out, 2)
    log = proc.stdout.read()
    assert rc == 143, log[-2000:]
    assert "continue with --resume" in log
    summary = json.loads((out / "summary.json").read_text())
    step = summary["stopped"]["step"]
    assert summary["stopped"]["reason"] == "SIGTERM" and (final_checkpoint(out).name == f"step_{step:06d}")
    subprocess.run(
        small_run_cmd(tiny_model_dir, out, step + 2, "train.checkpoint_every=0") + ["--resume"],
        check=True,
        capture_output=True,
    )
    chk = ledger_check(out)
    assert chk["steps"] == list(range(1, step + 3)) and chk["duplicates"] == [] and chk["lost"] == [], chk


@pytest.mark.sglang
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_no_launched_sglang_server_outlives_its_run(sglang_model_dir, tmp_path, sig):
    """A run that launched its SGLang server (in a session of its own) and gets SIGTERM checkpoints
    and stops it; SIGKILLed, nothing runs in the run, and the server's watchdog (agentrl.common.reaper)
    must kill it."""
    import time

    from agentrl.engine.sglang.server import unavailable_reason

    if unavailable_reason():
        components.unavailable("sglang", unavailable_reason())
    model = tmp_path / "model"
    shutil.copytree(sglang_model_dir, model)  # a path no other test's server has on its command line

    def servers():
        p = subprocess.run(
            ["pgrep", "-f", f"sglang.launch_server --model-path {model}"], capture_output=True, text=True
        )
        return {int(x) for x in p.stdout.split()}

    out = tmp_path / "run"
    cmd = small_run_cmd(
        model, out, 40, "engine.kind=sglang", "train.checkpoint_every=0", "engine.max_total_tokens=4096"
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        rc = _sigterm_when(proc, out, 1, timeout_s=600, sig=sig)
        log = proc.stdout.read()
        assert rc == (143 if sig == signal.SIGTERM else -signal.SIGKILL), log[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 30
    while servers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not servers(), f"the launched SGLang server outlived the run ({sig.name})"
    if sig == signal.SIGTERM:
        assert (final_checkpoint(out) / "COMPLETE").exists()
