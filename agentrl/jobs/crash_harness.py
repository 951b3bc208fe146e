"""Crash-test a training run: ``agentrl run`` under repeated SIGKILLs until it finishes, then check
that the resume was exactly once.

Owns ``run_with_kills`` — start the command, SIGKILL it at a random point, start it again with
``--resume``, until it exits 0 — and the checks over what the run left: ``ledger_check`` (every
prompt position below the stream's counter trained by exactly one surviving step, or still kept /
requeued by the final checkpoint; none twice, none lost) and ``same_weights`` (two checkpoints'
parameters and optimizer state equal bitwise). Kill points alternate between a random step (wait
until ``metrics.jsonl`` shows a step 2-4 past the last checkpoint, then up to 0.3 s more) and the
inside of a checkpoint write (``AGENTRL_FAULT_KILL=checkpoint_write:N``, ``agentrl.common.faults``).
Every kill leaves at least one new checkpoint behind, so the run always progresses.

Used by ``tests/jobs/test_resume.py`` (a few kills) and ``bench/bench_faults.py`` (20), both on
``small_run_cmd`` (a seconds-per-step run on a tiny model). A run under test must checkpoint every
step (``train.checkpoint_every=1``) and have ``output_dir`` set.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from agentrl.batches.ledger import read_ledger


def small_run_cmd(model_dir: str | Path, out: str | Path, steps: int, *sets: str) -> list[str]:
    """``python -m agentrl run`` on ``concise`` (one turn), 3 groups x 4 samples per step, a checkpoint
    every step, every trajectory logged (so ``train.replay`` can replay it), no eval; ``sets`` are
    extra ``--set`` overrides."""
    import sys

    base = [
        f"model.path={model_dir}",
        "env.kwargs={n_turns: 1}",
        "eval.num_tasks=0",
        "logging.tensorboard=false",
        "rollout.max_new_tokens=6",
        "rollout.max_turns=1",
        "rollout.score_truncated=true",
        "rollout.group_size=4",
        "train.groups_per_step=3",
        "train.checkpoint_every=1",
        "trainer.lr=1e-2",
        "trainer.loss_agg=token-mean",
        "logging.trajectories_per_step=-1",
        *sets,
    ]
    cmd = [
        sys.executable,
        "-m",
        "agentrl",
        "run",
        "--env",
        "concise",
        "--algo",
        "grpo",
        "-q",
        "--out",
        str(out),
        "--steps",
        str(steps),
    ]
    for s in base:
        cmd += ["--set", s]
    return cmd


def final_checkpoint(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{_last_checkpoint(Path(run_dir)):06d}"


def _last_step(run_dir: Path) -> int:
    f = run_dir / "metrics.jsonl"
    if not f.exists():
        return -1
    last = -1
    for line in f.read_text(encoding="utf-8").splitlines():
        try:
            last = max(last, int(json.loads(line).get("step", -1)))
        except (json.JSONDecodeError, ValueError):
            pass
    return last


def _last_checkpoint(run_dir: Path) -> int:
    steps = [
        int(p.parent.name[5:]) for p in (run_dir / "checkpoints").glob("step_*/COMPLETE") if p.parent.name[5:].isdigit()
    ]
    return max(steps, default=0)


def run_with_kills(
    cmd: list[str], run_dir: str | Path, *, kills: int, seed: int = 0, timeout_s: float = 900.0, env: dict | None = None
) -> dict[str, Any]:
    """Run ``cmd`` (an ``agentrl run ...`` argv writing to ``run_dir``), SIGKILLing it ``kills``
    times; returns ``{"kills": [...], "attempts": n, "wall_s": s}``. Raises RuntimeError with the
    output tail if an attempt fails on its own or the whole thing exceeds ``timeout_s``."""
    run_dir, rng = Path(run_dir), random.Random(seed)
    done: list[dict] = []
    t0, attempts = time.monotonic(), 0
    while True:
        attempts += 1
        argv = cmd + (["--resume"] if attempts > 1 else [])
        penv = dict(os.environ if env is None else env)
        penv.pop("AGENTRL_FAULT_KILL", None)
        plan: dict[str, Any] = {}
        if len(done) < kills:
            if len(done) % 2:
                plan = {"at": "checkpoint_write", "n": rng.randint(2, 3)}
                penv["AGENTRL_FAULT_KILL"] = f"checkpoint_write:{plan['n']}"
            else:
                plan = {
                    "at": "step",
                    "target": _last_checkpoint(run_dir) + rng.randint(2, 4),
                    "delay_s": round(rng.uniform(0, 0.3), 3),
                }
        start_ckpt = _last_checkpoint(run_dir)
        log = run_dir.parent / f"{run_dir.name}.attempt{attempts}.log"
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=penv, start_new_session=True)
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout_s:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    raise RuntimeError(f"crash harness: over {timeout_s} s after {attempts} attempts; log {log}")
                if plan.get("at") == "step" and _last_step(run_dir) >= plan["target"]:
                    time.sleep(plan["delay_s"])
                    os.killpg(proc.pid, signal.SIGKILL)
                time.sleep(0.05)
        rc = proc.returncode
        if rc == -signal.SIGKILL and plan:
            done.append(
                {
                    **plan,
                    "attempt": attempts,
                    "checkpoint_before": start_ckpt,
                    "checkpoint_after": _last_checkpoint(run_dir),
                }
            )
            continue
        if rc != 0:
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"crash harness: attempt {attempts} exited {rc} (plan {plan}); log tail:\n{tail}")
        return {"kills": done, "attempts": attempts, "wall_s": time.monotonic() - t0}


def ledger_check(run_dir: str | Path) -> dict[str, Any]:
    """Exactly-once over a finished run: ``{"trained": n, "duplicates": [...], "lost": [...],
    "outstanding": n, "next": n}`` (abandoned prompts count as outstanding: accounted for, never
    trained); ``duplicates`` and ``lost`` must both be empty."""
    run_dir = Path(run_dir)
    rows = read_ledger(run_dir)
    steps = [r["step"] for r in rows]
    trained = [p for r in rows for p in r["positions"]]
    last = final_checkpoint(run_dir)
    extra = json.loads((last / "trainer_state.json").read_text())["extra"]
    stream = extra["stream"]
    kept = []
    if (last / "rollouts.jsonl").exists():
        kept = [json.loads(line)["position"] for line in (last / "rollouts.jsonl").read_text().splitlines()]
    outstanding = list(stream["requeued"]) + kept + list(stream.get("abandoned", ()))
    seen: dict[int, int] = {}
    for p in trained + outstanding:
        seen[p] = seen.get(p, 0) + 1
    return {
        "steps": steps,
        "trained": len(trained),
        "outstanding": len(outstanding),
        "next": stream["next"],
        "duplicates": sorted(p for p, n in seen.items() if n > 1),
        "lost": sorted(set(range(stream["next"])) - set(seen)),
    }


def same_weights(ckpt_a: str | Path, ckpt_b: str | Path) -> list[str]:
    """Names of the tensors (model and optimizer state) that differ bitwise between two checkpoints."""
    import torch
    from safetensors.torch import load_file

    a, b = Path(ckpt_a), Path(ckpt_b)
    diff = []
    ma, mb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    for k in sorted(set(ma) | set(mb)):
        if k not in ma or k not in mb or not torch.equal(ma[k], mb[k]):
            diff.append(f"model:{k}")
    oa = torch.load(a / "optimizer.pt", weights_only=False)
    ob = torch.load(b / "optimizer.pt", weights_only=False)

    def walk(x, y, path):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y)):
                diff.append(f"optimizer:{path}")
        elif isinstance(x, dict) and isinstance(y, dict):
            for k in set(x) | set(y):
                walk(x.get(k), y.get(k), f"{path}/{k}")
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) and len(x) == len(y):
            for i, (u, v) in enumerate(zip(x, y)):
                walk(u, v, f"{path}/{i}")
        elif x != y:
            diff.append(f"optimizer:{path}")

    walk(oa, ob, "")
    return diff
