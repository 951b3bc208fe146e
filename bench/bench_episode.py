"""P2: episode-manager throughput with an instant policy and a no-op env.

Measures (1) turns/s per core at several concurrency levels (CPU time of this process, which runs
the whole asyncio loop on one core) and (2) the per-turn cost deep into an episode (turn ~128) vs
early (turn ~8): time between consecutive engine calls of the same episode, median over episodes.
Workload fixed: FakeEngine returns the same 1-tool-call turn (a real suspension point, no delay),
NoopEnv answers "ok". The chat template is Qwen2.5's on the built-in tokenizer.

    python bench/bench_episode.py                # 32, 1k, 16k concurrent; per-turn cost
    python bench/bench_episode.py --quick        # smaller
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from agentrl.config.schema import RolloutConfig
from agentrl.engine.fake import FakeEngine
from agentrl.envs.noop import NoopEnv
from agentrl.episodes.manager import EpisodeManager, EpisodeSpec
from agentrl.jobs.rollout import tune_gc
from agentrl.warmstart.tiny_model import build_tokenizer

TURN_TEXT = '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>'


def _policy(tok):
    ids = tok.encode(TURN_TEXT, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    return lambda prompt, params, ctx: ids


def throughput(tok, concurrency: int, turns_per_episode: int, episodes: int) -> dict:
    engine = FakeEngine(_policy(tok))
    cfg = RolloutConfig(
        max_turns=turns_per_episode + 1, max_concurrency=concurrency, max_context=1 << 20, max_new_tokens=64
    )
    mgr = EpisodeManager(engine, lambda: NoopEnv(n_turns=turns_per_episode), tok, cfg, env_id="noop")
    specs = [EpisodeSpec(f"p{i}", 0, i) for i in range(episodes)]
    c0, w0 = time.process_time(), time.perf_counter()
    trajs = asyncio.run(mgr.collect(specs))
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    turns = sum(t.num_turns for t in trajs)
    assert all(t.outcome.value == "ok" for t in trajs), {t.outcome for t in trajs}
    return {
        "concurrency": concurrency,
        "episodes": episodes,
        "turns": turns,
        "wall_s": wall,
        "cpu_s": cpu,
        "turns_per_s": turns / wall,
        "turns_per_cpu_s": turns / cpu,
    }


def per_turn_cost(tok, concurrency: int, n_turns: int) -> dict:
    base = _policy(tok)
    cfg = RolloutConfig(max_turns=n_turns + 1, max_concurrency=concurrency, max_context=1 << 22, max_new_tokens=64)
    specs = [EpisodeSpec(f"p{i}", 0, i) for i in range(concurrency)]
    by_episode: dict[int, list[float]] = {}

    def policy2(prompt, params, ctx):
        by_episode.setdefault(id(prompt), []).append(time.perf_counter())  # the live id list is per episode
        return base(prompt, params, ctx)

    mgr = EpisodeManager(FakeEngine(policy2), lambda: NoopEnv(n_turns=n_turns), tok, cfg)
    trajs = asyncio.run(mgr.collect(specs))
    lens = [len(t.token_ids) for t in trajs]

    def med_interval(k0: int, k1: int) -> float:
        vals = []
        for ts in by_episode.values():
            vals += [b - a for a, b in zip(ts[k0:k1], ts[k0 + 1 : k1 + 1])]
        return statistics.median(vals) / concurrency  # one turn of each episode happens per interval

    early, late = med_interval(6, 10), med_interval(n_turns - 10, n_turns - 6)
    return {
        "concurrency": concurrency,
        "turns": n_turns,
        "tokens_at_end": statistics.median(lens),
        "us_per_turn_early(turn 6-10)": early * 1e6,
        f"us_per_turn_late(turn {n_turns - 10}-{n_turns - 6})": late * 1e6,
        "late/early": late / early,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 small levels, 40-turn cost probe (~2 s)")
    ap.add_argument("--default-gc", action="store_true", help="keep Python's default GC thresholds")
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/episode[-quick].json)")
    args = ap.parse_args()
    args.out = args.out or str(
        Path(__file__).resolve().parent / "results" / f"episode{'-quick' if args.quick else ''}.json"
    )
    tok = build_tokenizer()
    if not args.default_gc:
        tune_gc()  # as `agentrl rollout` does
    levels = [(32, 8, 256), (1000, 8, 2000), (16000, 8, 16000)]
    if args.quick:
        levels = [(32, 8, 64), (1000, 4, 1000)]
    rows = []
    print(f"{'concurrency':>11} {'turns':>7} {'wall s':>7} {'turns/s':>8} {'turns/cpu-s':>11}")
    for conc, turns, eps in levels:
        r = throughput(tok, conc, turns, eps)
        rows.append(r)
        print(
            f"{conc:>11} {r['turns']:>7} {r['wall_s']:>7.2f} {r['turns_per_s']:>8.0f} {r['turns_per_cpu_s']:>11.0f}",
            flush=True,
        )
    cost = per_turn_cost(tok, 32, 40 if args.quick else 136)
    for k, v in cost.items():
        print(f"  {k}: {v:.3f}" if isinstance(v, float) else f"  {k}: {v}")
    out = {
        "machine": f"{os.cpu_count()} cores, python {sys.version.split()[0]}",
        "gc_tuned": not args.default_gc,
        "throughput": rows,
        "per_turn": cost,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
