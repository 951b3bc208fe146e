"""Partial rollouts vs drained weight updates (rollout.partial_rollouts) on the local engine.

The same workload runs in both modes: --concurrency turn loops keep the LocalEngine busy, each
turn's length drawn from a lognormal (median --median-tokens, CV about 1, fixed by --seed, capped
at --max-tokens: long-tail turns), while an updater pushes new weights (InProcessSync, the
runner's path) every --interval-s seconds, --updates times, through ``weight_update_gate``:

- partial: the push interrupts the turns in flight; they resume under the new version;
- drained: the push first waits for every turn in flight (new turns are held), then swaps.

Reported per mode: generated tokens/s over the run, fraction of finished turns whose tokens carry
more than one version (``mixed_version_turns``), and the seconds each push waited (drain) and took
in all. Modes are interleaved (partial, drained, partial, ...) for --pairs pairs; the headline is
the median of the per-pair ratios drained/partial of tokens/s. Prints a table; writes --out (JSON).

    python bench/bench_partial_rollouts.py             # 3 pairs, ~2 min on 2 busy cores
    python bench/bench_partial_rollouts.py --quick     # 1 pair, fewer updates
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.engine.base import SamplingParams
from agentrl.engine.local.engine import LocalEngine
from agentrl.weights.drain import weight_update_gate, with_partial_rollouts
from agentrl.weights.inprocess import InProcessSync

NO_STOP = (10**9,)  # no model samples it: every turn runs to its drawn length


def turn_lengths(seed: int, n: int, median: int, cap: int) -> list[int]:
    """Lognormal with sigma = sqrt(ln 2): CV = 1."""
    rng = random.Random(seed)
    sigma = math.sqrt(math.log(2.0))
    return [max(1, min(cap, round(median * math.exp(rng.gauss(0.0, sigma))))) for _ in range(n)]


async def run_mode(model, partial: bool, args, pair: int) -> dict:
    inner = LocalEngine(model, max_batch_size=args.concurrency, seed=pair)
    engine = with_partial_rollouts(inner, partial)
    sync = InProcessSync(inner)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    turns: list[list[int]] = []
    stop = asyncio.Event()

    async def loop(i: int) -> None:
        for j, n in enumerate(turn_lengths(args.seed * 1000 + i, 10_000, args.median_tokens, args.max_tokens)):
            if stop.is_set():
                return
            g = await engine.generate(
                [5 + i % 50, 6, 7], SamplingParams(max_new_tokens=n, stop_token_ids=NO_STOP, seed=i * 100_003 + j)
            )
            turns.append(g.versions)

    pushes = []
    await engine.start()
    t0 = time.perf_counter()
    tok0 = inner.stats["generated_tokens"]
    loops = [asyncio.create_task(loop(i)) for i in range(args.concurrency)]
    try:
        for v in range(1, args.updates + 1):
            await asyncio.sleep(args.interval_s)
            t_push = time.perf_counter()
            async with weight_update_gate(engine) as waited:
                await sync.push(state, v)
            pushes.append({"drain_wait_s": waited, "push_s": time.perf_counter() - t_push})
        wall = time.perf_counter() - t0
        tokens = inner.stats["generated_tokens"] - tok0
    finally:
        stop.set()
        for t in loops:
            t.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await engine.close()
    done = [v for v in turns if v]
    return {
        "mode": "partial" if partial else "drained",
        "pair": pair,
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "turns": len(done),
        "mixed_version_turns": sum(len(set(v)) > 1 for v in done) / max(1, len(done)),
        "drain_wait_s": [p["drain_wait_s"] for p in pushes],
        "push_s": [p["push_s"] for p in pushes],
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--updates", type=int, default=6)
    ap.add_argument("--interval-s", type=float, default=1.5)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--median-tokens", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="1 pair, 3 updates")
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/partial_rollouts[-quick].json)")
    args = ap.parse_args(argv)
    if args.quick:
        args.pairs, args.updates = 1, 3
    args.out = args.out or str(
        Path(__file__).parent / "results" / f"partial_rollouts{'-quick' if args.quick else ''}.json"
    )
    from transformers import AutoModelForCausalLM

    from agentrl.warmstart.tiny_model import build_model

    with tempfile.TemporaryDirectory() as d:
        model_dir = build_model(Path(d) / "m")
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    runs = []
    for pair in range(args.pairs):
        for partial in (True, False):
            r = asyncio.run(run_mode(model, partial, args, pair))
            runs.append(r)
            print(
                f"pair {pair} {r['mode']:8s} {r['tokens_per_s']:8.0f} tok/s  mixed turns {r['mixed_version_turns']:.3f}"
                f"  drain wait median {statistics.median(r['drain_wait_s']):.3f}s",
                flush=True,
            )
    ratios = [d["tokens_per_s"] / p["tokens_per_s"] for p, d in zip(runs[0::2], runs[1::2])]
    summary = {}
    for mode in ("partial", "drained"):
        rs = [r for r in runs if r["mode"] == mode]
        summary[mode] = {
            "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rs),
            "mixed_version_turns_median": statistics.median(r["mixed_version_turns"] for r in rs),
            "drain_wait_s_median": statistics.median(w for r in rs for w in r["drain_wait_s"]),
            "drain_wait_s_max": max(w for r in rs for w in r["drain_wait_s"]),
            "push_s_median": statistics.median(w for r in rs for w in r["push_s"]),
        }
    print("\nmode      tok/s   mixed_version_turns  drain wait med/max (s)  push med (s)")
    for mode, s in summary.items():
        print(
            f"{mode:8s} {s['tokens_per_s_median']:7.0f}   {s['mixed_version_turns_median']:18.3f}"
            f"  {s['drain_wait_s_median']:9.3f} / {s['drain_wait_s_max']:.3f}  {s['push_s_median']:12.3f}"
        )
    print(f"drained/partial tokens/s, median of {len(ratios)} pair ratios: {statistics.median(ratios):.3f}")
    result = {
        "args": vars(args),
        "machine": platform.platform(),
        "cpus": torch.get_num_threads(),
        "summary": summary,
        "ratio_drained_over_partial_tokens_per_s": statistics.median(ratios),
        "pair_ratios": ratios,
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
