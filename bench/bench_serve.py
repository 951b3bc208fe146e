"""`agentrl serve` (local backend): what the OpenAI HTTP layer costs, and how long a --follow swap takes.

Workload (fixed by ``--seed``): ``--concurrency`` greedy ``/v1/completions`` requests at once, each
a random ``--prompt-len``-token prompt and ``--max-tokens`` new tokens, on a tiny random Qwen3
(built locally). Each round runs the same requests twice on the same LocalEngine, interleaved:
through HTTP (stdlib server + JSON, one client thread per request) and directly with
``engine.generate`` on the server's event loop. Reported: wall time of each, the median over rounds
of the per-round ratio http/direct, and that both produced the same tokens (greedy). Then the
swap: ``--swaps`` times a new checkpoint is read from disk and loaded (what ``--follow`` does).

    python bench/bench_serve.py [--concurrency 16] [--rounds 5] [--out out.json]
    python bench/bench_serve.py --quick     # smoke run: 4 requests, 2 rounds, 2 swaps (~10 s)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--swaps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 requests of 16 + 8 tokens, 2 rounds, 2 swaps")
    ap.add_argument(
        "--out", "--json", dest="out", default=None, help="JSON path (default: bench/results/serve[-quick].json)"
    )
    args = ap.parse_args()
    if args.quick:
        args.concurrency, args.prompt_len, args.max_tokens, args.rounds, args.swaps = 4, 16, 8, 2, 2
    out = Path(args.out or Path(__file__).resolve().parent / "results" / f"serve{'-quick' if args.quick else ''}.json")

    from agentrl.engine.base import SamplingParams
    from agentrl.jobs.serve import LocalServer, resolve_target
    from agentrl.trainer.checkpoint import read_hf
    from agentrl.warmstart.tiny_model import build_model

    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    model_dir = build_model(tmp / "model")
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(5, 2000) for _ in range(args.prompt_len)] for _ in range(args.concurrency)]
    server = LocalServer(
        resolve_target(model_dir), port=0, name="bench", max_batch_size=max(32, args.concurrency)
    ).start()
    client = httpx.Client(timeout=600)
    pool = ThreadPoolExecutor(args.concurrency)

    def http_round() -> tuple[float, list[list[int]]]:
        def one(p):
            r = client.post(
                f"{server.url}/v1/completions",
                json={"model": "bench", "prompt": p, "max_tokens": args.max_tokens, "temperature": 0},
            )
            r.raise_for_status()
            return r.json()["choices"][0]["agentrl"]["token_ids"]

        t0 = time.perf_counter()
        out = list(pool.map(one, prompts))
        return time.perf_counter() - t0, out

    def direct_round() -> tuple[float, list[list[int]]]:
        sp = SamplingParams(max_new_tokens=args.max_tokens, temperature=0)

        async def run():
            return await asyncio.gather(*(server.engine.generate(p, sp) for p in prompts))

        t0 = time.perf_counter()
        gens = server._call(run())
        return time.perf_counter() - t0, [g.token_ids for g in gens]

    http_round(), direct_round()  # warm-up
    rows = []
    for i in range(args.rounds):
        order = [http_round, direct_round] if i % 2 == 0 else [direct_round, http_round]
        res = {f.__name__: f() for f in order}
        (th, ids_h), (td, ids_d) = res["http_round"], res["direct_round"]
        rows.append(
            {
                "http_s": th,
                "direct_s": td,
                "ratio": th / td,
                "same_tokens": ids_h == ids_d,
                "tokens": sum(len(t) for t in ids_h),
            }
        )

    swap_s = []
    ckpt = tmp / "ckpt"
    server.engine.model.save_pretrained(str(ckpt))
    for v in range(1, args.swaps + 1):
        t0 = time.perf_counter()
        state = read_hf(ckpt, server.engine.model)
        server._call(server.engine.update_weights(state, v))
        swap_s.append(time.perf_counter() - t0)
    server.stop()
    pool.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)

    print(f"{'round':>5} {'http s':>8} {'direct s':>9} {'ratio':>6} {'tokens':>7} same")
    for i, r in enumerate(rows):
        print(f"{i:>5} {r['http_s']:8.3f} {r['direct_s']:9.3f} {r['ratio']:6.3f} {r['tokens']:7d} {r['same_tokens']}")
    summary = {
        "concurrency": args.concurrency,
        "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens,
        "median_ratio_http_over_direct": statistics.median(r["ratio"] for r in rows),
        "http_tokens_per_s_median": statistics.median(r["tokens"] / r["http_s"] for r in rows),
        "swap_s_median": statistics.median(swap_s),
        "swap_s_max": max(swap_s),
        "all_same_tokens": all(r["same_tokens"] for r in rows),
        "rounds": rows,
    }
    print(
        f"median http/direct wall ratio {summary['median_ratio_http_over_direct']:.3f}; "
        f"{summary['http_tokens_per_s_median']:.0f} tok/s through HTTP; swap (read + load) median "
        f"{summary['swap_s_median'] * 1000:.0f} ms, max {summary['swap_s_max'] * 1000:.0f} ms; "
        f"same tokens: {summary['all_same_tokens']}"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
