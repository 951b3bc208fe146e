"""``agentrl run`` with ``engine.kind=sglang``: in-process vs ``distributed: ray`` (engine actors
owning the SGLang servers, rollout workers talking HTTP straight to them).

Same config on both sides (the built-in tiny model shape, single-turn episodes, disk weight sync
after every step, staleness 0). ``--rounds`` rounds, each running both sides once, the order
flipping every round (shared machines are noisy). Reported per side: wall seconds of
the whole run (startup of the server(s) and, for ray, of Ray and its actors included), the median
``time/step_s`` over steps 2.. (step 1 includes warm-up) and the median ``time/weight_sync_s``;
and the median of the per-round ratios ray/in-process. Prints a table; writes --out (JSON).

    python bench/bench_ray_sglang.py                     # ~5 min on 2 busy cores
    python bench/bench_ray_sglang.py --rounds 3 --steps 6
    python bench/bench_ray_sglang.py --quick             # smoke run: 1 round x 2 steps (~2-3 min: 2 server starts)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ray import CountEnv  # noqa: F401  (registers bench/RayCount-v0)

SIDES = ("inprocess", "ray")


def one_run(side: str, model: str, out: Path, steps: int, num_cpus: int) -> dict:
    from agentrl.config.schema import load_config
    from agentrl.jobs.run import Runner

    cfg = load_config(
        [],
        [
            f"output_dir={out}",
            f"model.path={model}",
            "env.id=bench/RayCount-v0",
            "env.kwargs={}",
            "rollout.max_new_tokens=16",
            "rollout.max_turns=1",
            "rollout.score_truncated=true",
            "rollout.group_size=8",
            "train.groups_per_step=4",
            f"train.steps={steps}",
            "train.max_staleness=0",
            "eval.num_tasks=0",
            "trainer.lr=1e-3",
            "trainer.loss_agg=token-mean",
            "logging.tensorboard=false",
            "engine.kind=sglang",
            "engine.max_total_tokens=8192",
            f"distributed={'ray' if side == 'ray' else 'local'}",
            f"ray.num_cpus={num_cpus}",
        ],
    )
    t0 = time.perf_counter()
    asyncio.run(Runner(cfg, progress=False).run())
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows if "time/step_s" in r]
    return {
        "wall_s": wall,
        "step_s_median": statistics.median(r["time/step_s"] for r in steps_rows[1:]),
        "sync_s_median": statistics.median(r["time/weight_sync_s"] for r in steps_rows),
        "infra_failures": sum(r.get("rollout/infra_failures", 0) for r in steps_rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/ray_sglang[-quick].json)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round of 2 steps per side")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps = 1, 2
    args.out = args.out or str(Path(__file__).parent / "results" / f"ray_sglang{'-quick' if args.quick else ''}.json")
    if args.steps < 2:
        ap.error(f"--steps must be >= 2 (step 1 is warm-up), got {args.steps}")

    from agentrl.engine.sglang.server import unavailable_reason
    from agentrl.warmstart.default_model import BASE
    from agentrl.warmstart.tiny_model import build_model

    reason = unavailable_reason()
    if reason:
        sys.exit(f"SGLang cannot run here: {reason}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-sglang-"))
    model = str(build_model(tmp / "model", **BASE))
    runs: dict[str, list[dict]] = {s: [] for s in SIDES}
    for r in range(args.rounds):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            res = one_run(side, model, tmp / f"{side}-{r}", args.steps, args.num_cpus)
            print(f"round {r} {side}: {res}", flush=True)
            runs[side].append(res)

    def med(side: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[side])

    table = {}
    for key in ("wall_s", "step_s_median", "sync_s_median"):
        ratios = [b[key] / a[key] for a, b in zip(runs["inprocess"], runs["ray"])]
        table[key] = {"inprocess": med("inprocess", key), "ray": med("ray", key), "ratio": statistics.median(ratios)}
    print(f"\n{'metric':<15} {'in-process':>11} {'ray':>9} {'ray/inproc':>11}")
    for key, t in table.items():
        print(f"{key:<15} {t['inprocess']:>11.3f} {t['ray']:>9.3f} {t['ratio']:>11.2f}")
    print(f"{args.rounds} interleaved rounds x {args.steps} steps, 4 groups x 8 episodes/step")
    res = {
        "table": table,
        "runs": runs,
        "rounds": args.rounds,
        "steps": args.steps,
        "machine": platform.platform(),
        "cpus": args.num_cpus,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
