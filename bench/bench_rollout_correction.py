"""Rollout corrections at staleness 2 on the default task: tis / icepop / mis / seq_reject / none (issue #34).

Each arm is the default run (``agentrl run --env code_exec --algo grpo``: the built-in model after its
SFT warm start, the embedded recipe) made asynchronous and decoupled, identical in every arm but
``trainer.rollout_correction``::

    train.max_staleness=2          # a trained token may be 2 policy versions old
    trainer.old_logprobs=current   # pi_old = the trainer's policy at the step's start, so the ratio
                                   # rho = pi_old / pi_engine the corrections look at carries the staleness
                                   # (with the default 'behaviour', rho is 1 and no mask can act)
    env.kwargs.sandbox_backend=local   # the tool calls in the local sandbox, as in BENCHMARKS.md's P7 runs
                                       # (no Docker), whatever this machine's "auto" finds

and per arm (``ARMS``; the bands are each mode's defaults, see ``agentrl config --docs``):

* ``tis``: ``rollout_correction=tis`` with ``tis_cap=2`` (P1's decoupled correction; the default
  ``tis`` with no cap is ``none``);
* ``icepop``: token mask outside [0.5, 5]; ``mis``: token mask above 3; ``seq_reject``: a whole
  episode masked when the geometric mean of its ratios leaves [0.99, 1.01];
* ``none``: no correction.

Recorded per step from each run's ``metrics.jsonl``: the rollout reward and solve rate, the masked
fraction of loss tokens (``train/rollout_masked_frac``; the masks only), the TIS weight, the policy's
entropy (a collapse into long random answers shows there first), the trainer-vs-engine mismatch
(``train/mismatch/*``) and the trained samples' staleness; per eval the held-out solve rate with its
episode count (the denominator: every task) and infrastructure failures beside. Prints a table per
arm (and seed) and writes ``bench/results/rollout_correction.json`` (``--out`` moves it).

    python bench/bench_rollout_correction.py                       # 5 arms x 60 steps, seed 0
    python bench/bench_rollout_correction.py --steps 40 --eval-every 40 --set train.groups_per_step=8 \
        --seeds 0 1 2                                              # BENCHMARKS.md's figures
    python bench/bench_rollout_correction.py --arms tis icepop --seeds 0 1 --steps 120
    python bench/bench_rollout_correction.py --from-runs DIR       # summarise DIR's finished runs (same --steps)
    python bench/bench_rollout_correction.py --quick   # smoke: 2 arms, 2 steps, random tiny model

One arm at the defaults (60 steps of the full batch, the recipe's cosine lr schedule over 60 steps instead of
120, 500-task evals at steps 0, 30, 60) takes ~8-10 minutes on a loaded 2-core machine (40 steps took 6);
40 steps of a quarter batch take 1-2 minutes, up to 7 when the policy collapses into long answers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench_learning import QUICK_SETS, run_one

RESULTS = Path(__file__).resolve().parent / "results"
#: Every arm: asynchronous (staleness 2) with the ratio against the trainer's own start-of-step policy.
COMMON = [
    "train.max_staleness=2",
    "trainer.old_logprobs=current",
    "env.kwargs.sandbox_backend=local",
    "logging.tensorboard=false",
]
ARMS = {
    "tis": ["trainer.rollout_correction=tis", "trainer.tis_cap=2"],
    "icepop": ["trainer.rollout_correction=icepop"],
    "mis": ["trainer.rollout_correction=mis"],
    "seq_reject": ["trainer.rollout_correction=seq_reject"],
    "none": ["trainer.rollout_correction=none"],
}
#: Per-step metrics kept from ``metrics.jsonl`` (short name: metric name).
STEP_METRICS = {
    "reward": "rollout/reward_mean",
    "solve": "rollout/solve_rate",
    "infra_failures": "rollout/infra_failures",
    "masked_frac": "train/rollout_masked_frac",
    "tis_weight": "train/tis_weight",
    "entropy": "train/entropy",
    "ratio_mean": "train/mismatch/ratio_mean",
    "mismatch_kl_k3": "train/mismatch/kl_k3",
    "abs_logp_diff_max": "train/mismatch/abs_diff_max",
    "staleness_mean": "staleness/staleness_mean",
    "dropped_groups": "staleness/dropped_groups",
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="corrections to run")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0], help="rollout.seed = trainer.seed, one run each")
    ap.add_argument("--steps", type=int, default=60, help="train.steps of every arm (the lr schedule follows)")
    ap.add_argument("--eval-tasks", type=int, default=500, help="eval.num_tasks (held-out tasks per evaluation)")
    ap.add_argument("--eval-every", type=int, default=30, help="eval.every (and always at the start and end)")
    ap.add_argument("--last", type=int, default=10, help="steps in the 'first' / 'last' reward means")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="config override for every arm")
    ap.add_argument("--runs-dir", default=None, help="run directories go here (default: a temp dir)")
    ap.add_argument("--from-runs", default=None, help="summarise the finished runs ARM-sSEED in this directory")
    ap.add_argument("--quick", action="store_true", help="smoke run: tis and icepop, 2 steps, a random tiny model")
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/rollout_correction[-quick].json)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.last < 1:
        ap.error(f"--steps {args.steps} and --last {args.last} must be >= 1")
    if args.quick:
        args.arms, args.seeds, args.last = ["tis", "icepop"], [0], 1
        args.steps, args.eval_tasks, args.eval_every = 2, 4, 2
    return args


def arm_sets(arm: str, seed: int, args: argparse.Namespace) -> list[str]:
    """The overrides of one run: the shared async settings, the arm's correction, the seed, the length."""
    length = [f"train.steps={args.steps}", f"eval.num_tasks={args.eval_tasks}", f"eval.every={args.eval_every}"]
    return COMMON + ARMS[arm] + [f"rollout.seed={seed}", f"trainer.seed={seed}"] + length + args.sets


def read_run(run_dir: Path) -> dict:
    """Per-step metrics (``STEP_METRICS``; None where a step did not log one), every eval of a run, and
    its own wall time (``summary.json``'s ``wall_s``: the run loop with its evals)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = run_dir / "summary.json"
    steps = [r for r in rows if "rollout/reward_mean" in r]
    per_step = {"step": [r["step"] for r in steps]}
    per_step |= {short: [r.get(name) for r in steps] for short, name in STEP_METRICS.items()}
    evals = [
        {
            "step": r["step"],
            "solve_rate": r["eval/solve_rate"],
            "episodes": r.get("eval/episodes"),
            "infra_failures": r.get("eval/infra_failures"),
        }
        for r in rows
        if "eval/solve_rate" in r
    ]
    run_s = json.loads(summary.read_text()).get("wall_s") if summary.exists() else None
    return {"per_step": per_step, "evals": evals, "run_s": run_s}


def finished(run_dir: Path, steps: int) -> bool:
    """Whether ``run_dir`` holds a run that ended after ``steps`` steps (its ``summary.json`` says so)."""
    summary = run_dir / "summary.json"
    return summary.exists() and json.loads(summary.read_text()).get("steps") == steps


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _max(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return max(xs) if xs else None


def summarise(per_step: dict, evals: list[dict], last: int) -> dict:
    """The figures BENCHMARKS.md quotes: reward first / last ``last`` steps and over all, masked
    fraction mean / max over steps, held-out start -> end with denominators and infra failures."""
    reward, masked = per_step["reward"], per_step["masked_frac"]
    start, end = (evals[0], evals[-1]) if evals else (None, None)
    return {
        "steps": len(reward),
        "reward_first": _mean(reward[:last]),
        "reward_last": _mean(reward[-last:]),
        "reward_mean": _mean(reward),
        "solve_last": _mean(per_step["solve"][-last:]),
        "masked_frac_mean": _mean(masked),
        "masked_frac_max": _max(masked),
        "masked_steps": sum(1 for m in masked if m),
        "tis_weight_mean": _mean(per_step["tis_weight"]),
        "entropy_max": _max(per_step["entropy"]),
        "mismatch_kl_k3_mean": _mean(per_step["mismatch_kl_k3"]),
        "staleness_mean": _mean(per_step["staleness_mean"]),
        "dropped_groups": _max(per_step["dropped_groups"]),
        "rollout_infra_failures": sum(x or 0 for x in per_step["infra_failures"]),
        "eval_start": start,
        "eval_end": end,
    }


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _eval(e: dict | None) -> str:
    return "-" if e is None else f"{e['solve_rate']:.3f} ({e['episodes']}, {e['infra_failures']} inf)"


def report(runs: list[dict], last: int) -> None:
    print(
        f"\n{'arm':<11} {'seed':>4} {'steps':>5} {f'reward first{last}':>14} {f'reward last{last}':>13} "
        f"{'reward mean':>11} {'masked mean':>11} {'masked max':>10} {'held-out start':>20} {'held-out end':>20} "
        f"{'run s':>7}"
    )
    for r in runs:
        s = r["summary"]
        print(
            f"{r['arm']:<11} {r['seed']:>4} {s['steps']:>5} {_f(s['reward_first']):>14} {_f(s['reward_last']):>13} "
            f"{_f(s['reward_mean']):>11} {_f(s['masked_frac_mean'], '.5f'):>11} {_f(s['masked_frac_max'], '.5f'):>10} "
            f"{_eval(s['eval_start']):>20} {_eval(s['eval_end']):>20} {_f(r.get('run_s'), '.0f'):>7}"
        )
    print("\n(held-out: solve rate (episodes, infrastructure failures); masked: share of loss tokens, per step)")
    for r in runs:
        curve = "  ".join(f"{e['step']}:{e['solve_rate']:.3f}" for e in r["evals"])
        s = r["summary"]
        print(
            f"{r['arm']} s{r['seed']}: held-out {curve}; staleness mean {_f(s['staleness_mean'], '.2f')}, "
            f"dropped groups {s['dropped_groups']}, peak entropy {_f(s['entropy_max'], '.2f')}, "
            f"steps with a mask > 0: {s['masked_steps']}, "
            f"mismatch kl_k3 mean {_f(s['mismatch_kl_k3_mean'], '.2e')}, rollout infra failures "
            f"{s['rollout_infra_failures']}"
        )


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    out = Path(args.out or RESULTS / f"rollout_correction{'-quick' if args.quick else ''}.json")
    runs = []
    if args.from_runs:
        root = Path(args.from_runs)
        for arm in args.arms:
            for seed in args.seeds:
                run_dir = root / f"{arm}-s{seed}"
                if finished(run_dir, args.steps):
                    runs.append({"arm": arm, "seed": seed, "run_dir": str(run_dir), "wall_s": None})
                else:
                    print(f"{run_dir}: not a finished run of {args.steps} steps, left out")
    else:
        out_root = Path(args.runs_dir or tempfile.mkdtemp(prefix="agentrl-rc-"))
        sets_extra: list[str] = []
        if args.quick:
            from agentrl.warmstart.tiny_model import build_model

            sets_extra = QUICK_SETS + [f"model.path={build_model(out_root / 'model')}"]
        for seed in args.seeds:  # arms interleaved within a seed: drift of the machine's load hits every arm alike
            for arm in args.arms:
                name = f"{arm}-s{seed}"
                res = run_one(name, "grpo", sets_extra + arm_sets(arm, seed, args), out_root, dict(os.environ))
                runs.append({"arm": arm, "seed": seed, "run_dir": res["run_dir"], "wall_s": res["wall_s"]})
    for r in runs:
        r |= read_run(Path(r["run_dir"]))
        r["summary"] = summarise(r["per_step"], r["evals"], args.last)
    report(runs, args.last)
    if args.quick and not args.runs_dir and not args.from_runs:  # a smoke run's directories are not worth keeping
        shutil.rmtree(Path(runs[0]["run_dir"]).parent, ignore_errors=True)
    workload = {k: v for k, v in vars(args).items() if k not in ("out", "from_runs", "runs_dir")}
    result = {"workload": workload | {"common": COMMON, "arm_sets": {a: ARMS[a] for a in args.arms}}, "runs": runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    sys.exit(main())
