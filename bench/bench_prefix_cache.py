"""LocalEngine's per-session prefix cache: the cost of multi-turn episodes with and without it.

A TextWorld-shaped workload, fixed by seed: --episodes concurrent episodes (a GRPO step's 2 x 4), each
--turns turns long. Every episode starts from a shared --prefix-tokens system prompt (the tool
schemas) plus its own task tokens; each turn samples exactly --new-tokens tokens (eos off), then the
"environment" appends an observation of --obs-min..--obs-max tokens, and the next turn's prompt is
the whole history, as the episode manager sends it (with ``session=`` the episode id). The model is
the built-in model's shape (agentrl.warmstart.default_model.BASE) with random weights: the cost of a
turn depends on the token counts, not on what the tokens say.

Arms: ``on`` (prefix_cache_tokens = --cache-tokens) and ``off`` (0), each a fresh engine over the
same model, run in ABBA order --repeats times. Reported per turn (medians over repeats): tokens
prefilled (computed, not reused) and wall time until every episode's turn is back; overall: the
median of the per-pair ratios of the total wall time, and how far both arms sampled the same tokens
(see :func:`agreement`: equal up to float rounding, which can flip a seeded sample now and then).

    python bench/bench_prefix_cache.py           # 8 episodes x 15 turns, ~1,700-token contexts
    python bench/bench_prefix_cache.py --quick   # smoke run, a few seconds
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

import torch

NO_STOP = (10**9,)  # an id never sampled: every turn yields exactly --new-tokens tokens


def episodes(args) -> tuple[list[list[int]], list[list[list[int]]]]:
    """(first prompt of each episode, the observation of each of its turns), fixed by --seed."""
    g = torch.Generator().manual_seed(args.seed)
    system = torch.randint(10, 2000, (args.prefix_tokens,), generator=g).tolist()
    firsts, obs = [], []
    for _ in range(args.episodes):
        firsts.append(system + torch.randint(10, 2000, (args.task_tokens,), generator=g).tolist())
        lens = torch.randint(args.obs_min, args.obs_max + 1, (args.turns,), generator=g).tolist()
        obs.append([torch.randint(10, 2000, (n,), generator=g).tolist() for n in lens])
    return firsts, obs


async def run_arm(model, args, cache_tokens: int) -> dict:
    """All episodes, turn by turn (every episode's turn t in flight together)."""
    from agentrl.engine.base import SamplingParams
    from agentrl.engine.local.engine import LocalEngine

    firsts, obs = episodes(args)
    eng = LocalEngine(model, max_batch_size=64, max_context=8192, prefix_cache_tokens=cache_tokens, seed=args.seed)
    prompts = [list(p) for p in firsts]
    turns, sampled = [], []
    try:
        for t in range(args.turns):
            before = eng.stats["prefilled_tokens"]
            t0 = time.perf_counter()
            gens = await asyncio.gather(
                *(
                    eng.generate(
                        prompts[e],
                        SamplingParams(
                            max_new_tokens=args.new_tokens, temperature=1.0, seed=1000 * e + t, stop_token_ids=NO_STOP
                        ),
                        session=f"episode-{e}",
                    )
                    for e in range(args.episodes)
                )
            )
            wall = time.perf_counter() - t0
            turns.append(
                {
                    "turn": t,
                    "context": statistics.mean(len(p) for p in prompts),
                    "prefilled": eng.stats["prefilled_tokens"] - before,
                    "reused": sum(g.info["cached_tokens"] for g in gens),
                    "wall_s": wall,
                }
            )
            sampled.append([(g.token_ids, g.logprobs) for g in gens])
            for e, g in enumerate(gens):
                prompts[e] = prompts[e] + g.token_ids + obs[e][t]
    finally:
        await eng.close()
    return {"turns": turns, "sampled": sampled, "stats": dict(eng.stats)}


def agreement(a: list, b: list) -> dict:
    """How far two runs' samples agree. Logprobs differ by float rounding (another summation
    order: cached K/V, or another batch composition, which depends on timing), so a seeded sample
    can flip where its uniform draw falls within that rounding of a CDF boundary; from there the
    episode's history differs, and its later turns are not compared. Reports the turns sampled
    alike, the first flip, and the largest logprob difference over the tokens sampled alike."""
    same_turns, first, lp_diff, flipped = 0, None, 0.0, set()
    for t, (turn_a, turn_b) in enumerate(zip(a, b)):
        for e, ((ids_a, lp_a), (ids_b, lp_b)) in enumerate(zip(turn_a, turn_b)):
            if e in flipped:
                continue
            n = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), len(ids_a))
            lp_diff = max([lp_diff, *(abs(x - y) for x, y in zip(lp_a[:n], lp_b[:n]))])
            same_turns += n == len(ids_a)
            if n < len(ids_a):
                flipped.add(e)
                if first is None:
                    first = {"turn": t, "episode": e, "token": n, "logprobs": [lp_a[n], lp_b[n]]}
    total = sum(len(turn) for turn in a)
    return {
        "turns_sampled_alike": f"{same_turns}/{total}",
        "first_flip": first,
        "max_logprob_diff_while_alike": lp_diff,
    }


def summarize(runs: dict[str, list[dict]], args) -> dict:
    per_turn = []
    for t in range(args.turns):
        row = {"turn": t, "context": runs["off"][0]["turns"][t]["context"]}
        for arm in ("off", "on"):
            row[f"prefilled_{arm}"] = statistics.median(r["turns"][t]["prefilled"] for r in runs[arm])
            row[f"wall_s_{arm}"] = statistics.median(r["turns"][t]["wall_s"] for r in runs[arm])
        per_turn.append(row)
    total = {arm: [sum(x["wall_s"] for x in r["turns"]) for r in runs[arm]] for arm in ("off", "on")}
    ratios = [off / on for off, on in zip(total["off"], total["on"])]
    return {
        "per_turn": per_turn,
        "summary": {
            "wall_s_off_median": statistics.median(total["off"]),
            "wall_s_on_median": statistics.median(total["on"]),
            "speedup_median_of_pair_ratios": statistics.median(ratios),
            "pair_ratios": ratios,
            "prefilled_off": sum(x["prefilled"] for x in runs["off"][0]["turns"]),
            "prefilled_on": sum(x["prefilled"] for x in runs["on"][0]["turns"]),
            "off_vs_on": agreement(runs["off"][0]["sampled"], runs["on"][0]["sampled"]),
            "off_vs_off": agreement(runs["off"][0]["sampled"], runs["off"][1]["sampled"]),
            "cache_stats_on": {k: v for k, v in runs["on"][0]["stats"].items() if k.startswith("prefix_")},
        },
    }


def print_table(result: dict) -> None:
    print(
        f"{'turn':>4} {'context':>8} {'prefill tok off':>16} {'prefill tok on':>15} "
        f"{'wall s off':>11} {'wall s on':>10}"
    )
    for r in result["per_turn"]:
        print(
            f"{r['turn']:>4} {r['context']:>8.0f} {r['prefilled_off']:>16.0f} {r['prefilled_on']:>15.0f} "
            f"{r['wall_s_off']:>11.3f} {r['wall_s_on']:>10.3f}"
        )
    s = result["summary"]
    print(
        f"total: off {s['wall_s_off_median']:.2f} s, on {s['wall_s_on_median']:.2f} s, "
        f"speedup (median of pair ratios) {s['speedup_median_of_pair_ratios']:.2f}x; prefilled tokens "
        f"{s['prefilled_off']} -> {s['prefilled_on']}"
    )
    for pair in ("off_vs_on", "off_vs_off"):
        a = s[pair]
        print(
            f"{pair}: turns sampled alike {a['turns_sampled_alike']}, max logprob difference while alike "
            f"{a['max_logprob_diff_while_alike']:.1e}, first flip {a['first_flip']}"
        )


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=15)
    ap.add_argument("--prefix-tokens", type=int, default=1100, help="shared system prompt (tool schemas)")
    ap.add_argument("--task-tokens", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=24, help="sampled tokens per turn")
    ap.add_argument("--obs-min", type=int, default=10)
    ap.add_argument("--obs-max", type=int, default=40)
    ap.add_argument("--cache-tokens", type=int, default=32768, help="the 'on' arm's prefix_cache_tokens")
    ap.add_argument("--repeats", type=int, default=2, help="ABBA pairs")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="small smoke run (a few seconds)")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/prefix_cache[-quick].json)")
    args = ap.parse_args(argv)
    if args.quick:
        args.episodes, args.turns, args.prefix_tokens, args.task_tokens, args.repeats = 2, 3, 100, 20, 1
    out = Path(args.out or Path(__file__).parent / "results" / f"prefix_cache{'-quick' if args.quick else ''}.json")
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from agentrl.warmstart.default_model import BASE
    from agentrl.warmstart.tiny_model import build_model

    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(Path(tmp) / "m", **{**BASE, "max_position_embeddings": 8192})
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for _ in range(args.repeats):
        for arm in ("off", "on", "on", "off"):
            runs[arm].append(asyncio.run(run_arm(model, args, args.cache_tokens if arm == "on" else 0)))
    result = summarize(runs, args)
    print_table(result)
    result.update(
        {
            "command": " ".join(["python bench/bench_prefix_cache.py", *(sys.argv[1:] if argv is None else argv)]),
            "machine": {"platform": platform.platform(), "threads": args.threads, "torch": torch.__version__},
            "workload": {k: v for k, v in vars(args).items() if k not in ("out", "quick")} | {"model": BASE},
        }
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
