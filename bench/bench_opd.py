"""On-policy distillation vs SFT-only vs GRPO-only at equal wall time (issue #34's demonstration).

A student that shares the teacher's tokenizer is trained by each arm for the same wall time, per seed:

* ``sft``:  ``agentrl sft --model STUDENT`` (oracle tool-use demonstrations of code_exec); its step
  count is calibrated to the budget (two short runs give seconds per step and start-up time);
* ``grpo``: ``agentrl run --algo grpo --model STUDENT``;
* ``opd``:  ``agentrl run --algo opd --model STUDENT --set algo.teacher=TEACHER``;
* ``mix`` (not run unless named): grpo with ``algo.opd_coef`` (``--opd-coef``) and the teacher.

The run arms get a large ``train.steps`` and a SIGTERM at the budget: the run stops gracefully (the
step in flight is dropped or finished, a checkpoint written), and the newest checkpoint is the
arm's model. Every model (the student before, each arm's after) is measured by one probe, ``agentrl
run --algo opd --model M --steps 1 --set trainer.lr=0 --set algo.teacher=TEACHER``: its held-out
evals (before and after a step at lr 0, so the same weights: their mean) give the solve rate, its
``opd/reverse_kl`` the per-token reverse KL of M to the teacher on M's own samples.

Defaults: the teacher is the built-in model (the SFT warm start; built and cached on first use), the
student a smaller random Qwen3 (``--student-size``) given the teacher's tokenizer. ``--teacher`` /
``--student`` take any model reference (local HF directory, GGUF file, Hub id); the runs check at
start that the two share a tokenizer. Prints per arm the solve rate and reverse KL before -> after
(mean and spread over seeds) and the wall time each arm used, and writes ``bench/results/opd.json``
(``--out`` moves it).

    python bench/bench_opd.py --budget-s 900 --seeds 0 1 2          # the comparison, ~2.5 h on 2 cores
    python bench/bench_opd.py --arms opd mix --budget-s 300 --set rollout.group_size=8
    python bench/bench_opd.py --quick      # smoke: random tiny teacher and student, 20 s arms, 8 eval tasks

Run it on a quiet machine: the arms are compared by wall time, so other load moves the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ARMS = ("sft", "grpo", "opd", "mix")
#: Every run and probe: the env, quiet, no TensorBoard.
COMMON = ["logging.tensorboard=false"]
#: The learning rate of every arm for the built (random) student: the commands' defaults for a
#: ``--model`` (1e-6 / 5e-5) are meant for pretrained models and would barely move it.
BUILT_STUDENT_LR = 1e-3
#: ``--quick``: the same commands on a tiny workload.
QUICK_SETS = ["rollout.group_size=2", "train.groups_per_step=1", "rollout.max_new_tokens=24", "rollout.max_turns=2"]


def agentrl(args: list[str], env: dict, timeout_s: float | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """``python -m agentrl ARGS``; SIGTERM after ``timeout_s`` (a graceful stop for `agentrl run`)."""
    cmd = [sys.executable, "-m", "agentrl", *args]
    print(f"  $ {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ok = {0}
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        ok.add(128 + signal.SIGTERM)  # `agentrl run` stopped gracefully by SIGTERM, checkpointed, exits 143
        out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode not in ok:
        sys.exit(f"failed (exit {proc.returncode}): {' '.join(cmd)}\n{out[-2000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), wall


def seed_sets(seed: int) -> list[str]:
    """The overrides of one seed: task order and sampling, the trainer's RNGs, the SFT data."""
    return [f"rollout.seed={seed}", f"trainer.seed={seed}", f"sft.seed={seed}"]


def _sets(sets: list[str]) -> list[str]:
    return [a for s in [*COMMON, *sets] for a in ("--set", s)]


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def probe(model: str, teacher: str, run_dir: Path, a: argparse.Namespace, env: dict) -> dict:
    """Held-out solve rate and reverse KL to the teacher of ``model`` (see the module docstring)."""
    args = ["run", "--env", a.env, "--algo", "opd", "--model", model, "--steps", "1", "-q", "-o", str(run_dir)]
    sets = [f"algo.teacher={teacher}", "trainer.lr=0", "train.max_staleness=0", f"eval.num_tasks={a.eval_tasks}"]
    # the probe's own settings come last: a shared --set (a learning rate) must not make it train
    agentrl(args + _sets([*a.sets, *sets, f"train.groups_per_step={a.probe_groups}"]), env)
    rows = _rows(run_dir)
    evals = [r["eval/solve_rate"] for r in rows if "eval/solve_rate" in r]
    kl = [r["opd/reverse_kl"] for r in rows if "opd/reverse_kl" in r]
    return {"solve_rate": statistics.fmean(evals) if evals else None, "reverse_kl": kl[0] if kl else None}


def run_arm(arm: str, student: str, teacher: str, out: Path, a: argparse.Namespace, env: dict) -> dict:
    """One arm trained for ``a.budget_s`` from ``student``; returns its model directory and wall time."""
    if arm == "sft":
        steps = sft_steps(student, out, a, env)
        _, wall = agentrl(["sft", "--model", student, "--steps", str(steps), "-q", "-o", str(out)] + _sets(a.sets), env)
        return {"model": str(out), "wall_s": wall, "steps": steps}
    algo = "grpo" if arm in ("grpo", "mix") else "opd"
    extra = {"grpo": [], "opd": [f"algo.teacher={teacher}"]}.get(arm)
    if extra is None:  # mix
        extra = [f"algo.teacher={teacher}", f"algo.opd_coef={a.opd_coef}"]
    args = ["run", "--env", a.env, "--algo", algo, "--model", student, "-q", "-o", str(out)]
    sets = [*extra, "train.steps=100000", "eval.num_tasks=0", "train.checkpoint_every=0"]
    _, wall = agentrl(args + _sets(sets + a.sets), env, timeout_s=a.budget_s)
    from agentrl.trainer.integrity import pick_resume

    ckpt = pick_resume(out / "checkpoints")
    if ckpt is None:
        sys.exit(f"{arm}: no checkpoint in {out}: the budget ended before the run could save one")
    return {"model": str(ckpt), "wall_s": wall, "steps": int(ckpt.name.rsplit("_", 1)[-1])}


def sft_steps(student: str, out: Path, a: argparse.Namespace, env: dict) -> int:
    """SFT steps that fill the budget: runs of ``c`` and ``2c`` steps give seconds per step and the
    start-up time (``steps = (budget - start-up) / per step``); ``c`` grows 4x until the two runs
    differ by at least 2 s (below that, start-up noise would be read as the steps' cost)."""
    c = a.sft_calib_steps
    while True:
        walls = []
        for n in (c, 2 * c):
            args = ["sft", "--model", student, "--steps", str(n), "-q", "-o", str(out / f"calib{n}")]
            walls.append(agentrl(args + _sets(a.sets), env)[1])
        if walls[1] - walls[0] >= 2.0 or 2 * c >= a.budget_s * 100:
            break
        c *= 4
    per_step = max((walls[1] - walls[0]) / c, 1e-3)
    return max(1, int((a.budget_s - (walls[0] - c * per_step)) / per_step))


def make_student(teacher_dir: Path, out: Path, size: int, seed: int) -> Path:
    """A random 1-layer model of the teacher's architecture with hidden size ``size``, carrying the
    teacher's tokenizer, chat template and vocabulary size."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(teacher_dir)
    cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers = size, 2 * size, 1
    cfg.num_attention_heads = cfg.num_key_value_heads = 2
    if getattr(cfg, "head_dim", None):
        cfg.head_dim = size // 2
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:1]
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(teacher_dir).save_pretrained(out)
    return out


def models(a: argparse.Namespace, root: Path) -> tuple[str, str]:
    """(teacher, student) references; built here when not given."""
    from agentrl.warmstart.default_model import default_model_path
    from agentrl.warmstart.tiny_model import build_model

    if a.teacher:
        teacher = a.teacher
    elif a.quick:
        teacher = str(build_model(root / "teacher", hidden_size=64, num_layers=2, seed=1))
    else:
        teacher = str(default_model_path())
    if a.student:
        return teacher, a.student
    if not Path(teacher).is_dir():
        sys.exit("--teacher is not a local directory: give --student too (a model with the teacher's tokenizer)")
    return teacher, str(make_student(Path(teacher), root / "student", a.student_size, seed=0))


def summarise(results: list[dict], arms: list[str]) -> list[dict]:
    """Per arm over seeds: solve rate and reverse KL before -> after (mean, stdev), wall s, steps."""

    def stat(xs):
        xs = [x for x in xs if x is not None]
        return (statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0) if xs else (None, None)

    table = []
    for arm in arms:
        per = [(r["start"], r["arms"][arm]) for r in results if arm in r["arms"]]
        table.append(
            {
                "arm": arm,
                "seeds": len(per),
                "solve_start": stat([s["solve_rate"] for s, _ in per]),
                "solve_end": stat([e["solve_rate"] for _, e in per]),
                "kl_start": stat([s["reverse_kl"] for s, _ in per]),
                "kl_end": stat([e["reverse_kl"] for _, e in per]),
                "wall_s": stat([e["wall_s"] for _, e in per])[0],
                "steps": stat([e["steps"] for _, e in per])[0],
            }
        )
    return table


def _ms(v: tuple) -> str:
    return "-" if v[0] is None else f"{v[0]:.3f}±{v[1]:.3f}"


def report(table: list[dict]) -> None:
    print(
        f"\n{'arm':<6} {'seeds':>5} {'solve start':>13} {'solve end':>13} {'rev KL start':>13} "
        f"{'rev KL end':>13} {'wall s':>7} {'steps':>6}"
    )
    for r in table:
        print(
            f"{r['arm']:<6} {r['seeds']:>5} {_ms(r['solve_start']):>13} {_ms(r['solve_end']):>13} "
            f"{_ms(r['kl_start']):>13} {_ms(r['kl_end']):>13} {r['wall_s'] or 0:>7.0f} {r['steps'] or 0:>6.0f}"
        )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=["sft", "grpo", "opd"], help="arms to run")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="one comparison per seed")
    ap.add_argument("--budget-s", type=float, default=900.0, help="wall seconds of each arm (whole process)")
    ap.add_argument("--teacher", default=None, help="teacher model reference (default: the built-in model)")
    ap.add_argument("--student", default=None, help="student model reference (default: built, teacher's tokenizer)")
    ap.add_argument("--student-size", type=int, default=64, help="hidden size of the built student")
    ap.add_argument("--env", default="code_exec", help="env id of every run and probe")
    ap.add_argument("--opd-coef", type=float, default=0.5, help="the mix arm's algo.opd_coef")
    ap.add_argument(
        "--lr",
        type=float,
        default=None,
        help=f"trainer.lr and sft.lr of every arm (default: {BUILT_STUDENT_LR} for the built student, else the "
        "commands' own: 1e-6 for `agentrl run --model`, 5e-5 for `agentrl sft --model`)",
    )
    ap.add_argument("--eval-tasks", type=int, default=200, help="held-out tasks per probe eval")
    ap.add_argument("--probe-groups", type=int, default=8, help="groups whose tokens a probe's reverse KL averages")
    ap.add_argument("--sft-calib-steps", type=int, default=10, help="steps of the first SFT calibration run")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="config override for every command")
    ap.add_argument("--runs-dir", default=None, help="run directories go here (default: a temp dir)")
    ap.add_argument("--quick", action="store_true", help="smoke: tiny models, 1 seed, 20 s arms, 8 eval tasks")
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/opd[-quick].json)")
    a = ap.parse_args(argv)
    if a.quick:
        a.seeds, a.budget_s, a.eval_tasks, a.probe_groups, a.sft_calib_steps = [0], 20.0, 8, 1, 2
        a.sets = QUICK_SETS + a.sets
    if a.budget_s <= 0:
        ap.error(f"--budget-s must be > 0, got {a.budget_s}")
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    out = Path(a.out or RESULTS / f"opd{'-quick' if a.quick else ''}.json")
    root = Path(a.runs_dir or tempfile.mkdtemp(prefix="agentrl-opd-"))
    env = dict(os.environ)
    teacher, student = models(a, root)
    print(f"teacher {teacher}\nstudent {student}\nruns in {root}", flush=True)
    results = []
    lr = a.lr if a.lr is not None else (None if a.student else BUILT_STUDENT_LR)
    shared = [*a.sets, *([f"trainer.lr={lr}", f"sft.lr={lr}"] if lr is not None else [])]
    print(f"learning rate of every arm: {'the commands own' if lr is None else lr}", flush=True)
    for seed in a.seeds:
        a.sets = [*shared, *seed_sets(seed)]
        print(f"\nseed {seed}: probing the student", flush=True)
        start = probe(student, teacher, root / f"s{seed}-probe-start", a, env)
        arms = {}
        for arm in a.arms:
            print(f"seed {seed}: arm {arm} ({a.budget_s:.0f} s)", flush=True)
            trained = run_arm(arm, student, teacher, root / f"s{seed}-{arm}", a, env)
            arms[arm] = {**trained, **probe(trained["model"], teacher, root / f"s{seed}-{arm}-probe", a, env)}
        results.append({"seed": seed, "start": start, "arms": arms})
    table = summarise(results, a.arms)
    report(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"teacher": teacher, "student": student, "table": table, "runs": results}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
