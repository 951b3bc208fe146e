"""P7: learning. Held-out solve rate before/after the default run, per algorithm, and reward at staleness k.

Runs the real command line (``agentrl run --env code_exec --algo A``, the embedded defaults plus any
``--set``), each in its own run directory, timing the whole
process (model build and SFT warm start included when the cache is cold), then prints per run: the
held-out eval curve (solve rate and tool-use rate at every evaluation), the rollout reward of the
first and last 10 steps, wall time, and the SFT-stage time if it ran, then one table row per run.
Writes ``bench/results/learning.json`` and ``bench/results/learning.png`` (eval curves of every run;
``--out`` moves both).

    python bench/bench_learning.py                                  # grpo and ppo on the defaults
    python bench/bench_learning.py --cold                           # time a fresh cache (build + SFT)
    python bench/bench_learning.py --algos grpo --staleness 0 2 --set train.steps=60
    python bench/bench_learning.py --from-runs runs/code_exec-grpo   # summarise finished runs only
    python bench/bench_learning.py --quick   # smoke run: grpo, 2 steps on a random tiny model, 4 eval tasks (~1 min)

One run of the default is ~12 minutes on 2 CPU cores; the numbers move by a few points between
runs (500 held-out tasks: a standard error of ~2 points at 75%).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


#: ``--quick``: the same command on a tiny workload. The model is a random tiny Qwen3 built in the
#: run directory (seconds) instead of the built-in one, whose first build runs the SFT warm start.
QUICK_SETS = [
    "train.steps=2",
    "train.groups_per_step=1",
    "rollout.group_size=2",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=24",
    "eval.num_tasks=4",
    "logging.tensorboard=false",
]


def run_one(name: str, algo: str, sets: list[str], out_root: Path, env: dict) -> dict:
    run_dir = out_root / name
    cmd = [
        sys.executable,
        "-m",
        "agentrl",
        "run",
        "--env",
        "code_exec",
        "--algo",
        algo,
        "-q",
        "--set",
        f"output_dir={run_dir}",
    ]
    for s in sets:
        cmd += ["--set", s]
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"[{name}] failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    sft = re.search(r"warm start done in (\d+) s", proc.stderr)
    return summarise(name, run_dir, wall_s=wall, sft_s=float(sft.group(1)) if sft else None)


def summarise(name: str, run_dir: Path, wall_s: float | None = None, sft_s: float | None = None) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [(r["step"], r["eval/solve_rate"], r.get("eval/tool_use_rate")) for r in rows if "eval/solve_rate" in r]
    rewards = [r["rollout/reward_mean"] for r in rows if "rollout/reward_mean" in r]
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    return {
        "name": name,
        "run_dir": str(run_dir),
        "evals": evals,
        "reward_first10": _mean(rewards[:10]),
        "reward_last10": _mean(rewards[-10:]),
        "steps": len(rewards),
        "wall_s": wall_s,
        "run_s": summary.get("wall_s"),
        "sft_s": sft_s,
    }


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def report(results: list[dict]) -> None:
    for r in results:
        if not r["evals"]:
            print(f"\n{r['name']}: no evaluation in {r['run_dir']} (eval.num_tasks=0?)")
            continue
        curve = "  ".join(f"{s}:{v:.3f}" for s, v, _ in r["evals"])
        start, end = r["evals"][0], r["evals"][-1]
        print(f"\n{r['name']}: held-out solve rate  {curve}")
        print(
            f"  start {start[1]:.3f} -> end {end[1]:.3f} ({100 * (end[1] - start[1]):+.1f} points); "
            f"tool use {_f(start[2], '.2f')} -> {_f(end[2], '.2f')}; rollout reward first/last 10 steps "
            f"{_f(r['reward_first10'])} -> {_f(r['reward_last10'])}"
        )
        timing = [f"{k} {r[k]:.0f} s" for k in ("wall_s", "run_s", "sft_s") if r.get(k) is not None]
        print(f"  steps {r['steps']}; " + ", ".join(timing))
    print(
        f"\n{'run':<16} {'steps':>5} {'solve start':>11} {'solve end':>9} {'reward first10':>14} "
        f"{'reward last10':>13} {'wall s':>7}"
    )
    for r in results:
        start, end = (r["evals"][0][1], r["evals"][-1][1]) if r["evals"] else (None, None)
        print(
            f"{r['name']:<16} {r['steps']:>5} {_f(start):>11} {_f(end):>9} {_f(r['reward_first10']):>14} "
            f"{_f(r['reward_last10']):>13} {_f(r['wall_s'], '.0f'):>7}"
        )


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        ax.plot([s for s, _, _ in r["evals"]], [v for _, v, _ in r["evals"]], marker="o", label=r["name"])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("held-out solve rate")
    ax.set_title("agentrl run --env code_exec (built-in model after SFT warm start)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--algos",
        nargs="*",
        default=["grpo", "ppo"],
        help="algorithms run on the defaults (none: only --staleness runs)",
    )
    ap.add_argument("--staleness", nargs="*", type=int, default=[], help="extra grpo runs at these max_staleness")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="config override for every run")
    ap.add_argument("--cold", action="store_true", help="fresh AGENTRL_CACHE: the first run builds and warm-starts")
    ap.add_argument("--runs-dir", default=None, help="run directories go here (default: a temp dir)")
    ap.add_argument("--from-runs", nargs="+", default=None, help="only summarise these finished run dirs")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: grpo only, 2 steps of 1 x 2 episodes on a random tiny model, 4 eval tasks",
    )
    ap.add_argument(
        "--out", default=None, help="JSON path, the PNG beside it (default: bench/results/learning[-quick].json)"
    )
    args = ap.parse_args()
    out = Path(args.out or RESULTS / f"learning{'-quick' if args.quick else ''}.json")
    if args.from_runs:
        results = [summarise(Path(d).name, Path(d)) for d in args.from_runs]
    else:
        env = dict(os.environ)
        if args.cold:
            env["AGENTRL_CACHE"] = tempfile.mkdtemp(prefix="agentrl-cache-")
        out_root = Path(args.runs_dir or tempfile.mkdtemp(prefix="agentrl-p7-"))
        if args.quick:
            from agentrl.warmstart.tiny_model import build_model

            args.algos, args.staleness = ["grpo"], []
            args.sets = QUICK_SETS + [f"model.path={build_model(out_root / 'model')}"] + args.sets
        plan = [(a, a, []) for a in args.algos]
        plan += [(f"grpo-stale{k}", "grpo", [f"train.max_staleness={k}"]) for k in args.staleness]
        results = [run_one(name, algo, extra + args.sets, out_root, env) for name, algo, extra in plan]
        if args.quick and not args.runs_dir:  # a smoke run's directories are not worth keeping
            shutil.rmtree(out_root, ignore_errors=True)
    report(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    plot(results, out.with_suffix(".png"))
    print(f"\nwrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
