"""P4: LocalEngine (continuous batching) vs HF ``model.generate`` static batching, tokens/s.

One long-tail request set, fixed by seed: prompt lengths uniform in [--prompt-min, --prompt-max],
requested completion lengths lognormal with CV = --cv (mean --mean-new, capped at --max-new).
Stopping on eos is off in both systems, so each request yields exactly its requested tokens and
the workload is the same for both. Both sample at temperature 1 from the full softmax.

A: every request is submitted at once to a LocalEngine with max_batch_size = --batch-size.
B: the requests, in the same order, are cut into static batches of --batch-size, left-padded;
   each batch runs ``generate`` until its longest request (the tokens past a request's own length
   are wasted and not counted).
Useful tokens/s = sum of requested tokens / wall time. A and B are interleaved (ABBA...) and the
reported speedup is the median of the per-pair ratios (GUIDE section 4).

    python bench/bench_engine.py            # default, ~3-5 min on 2 cores
    python bench/bench_engine.py --quick    # smoke run, ~20 s
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def workload(args) -> list[tuple[list[int], int]]:
    g = torch.Generator().manual_seed(args.seed)
    sigma = math.sqrt(math.log(1 + args.cv**2))
    mu = math.log(args.mean_new) - sigma**2 / 2
    reqs = []
    for _ in range(args.requests):
        plen = int(torch.randint(args.prompt_min, args.prompt_max + 1, (1,), generator=g))
        prompt = torch.randint(10, 2000, (plen,), generator=g).tolist()
        n = math.exp(mu + sigma * float(torch.randn(1, generator=g)))
        reqs.append((prompt, max(1, min(args.max_new, round(n)))))
    return reqs


def run_engine(engine, reqs) -> dict:
    from agentrl.engine.base import SamplingParams

    async def go():
        return await asyncio.gather(
            *(engine.generate(p, SamplingParams(max_new_tokens=n, temperature=1.0)) for p, n in reqs)
        )

    steps0 = engine.stats["steps"]
    t = time.perf_counter()
    outs = asyncio.run(go())
    wall = time.perf_counter() - t
    got = sum(len(o.token_ids) for o in outs)
    assert got == sum(n for _, n in reqs), "engine stopped early: the workload would differ"
    return {"wall_s": wall, "tokens": got, "steps": engine.stats["steps"] - steps0}


def run_static(model, reqs, batch_size: int, pad_id: int) -> dict:
    from transformers import GenerationConfig

    useful = computed = 0
    t = time.perf_counter()
    for i in range(0, len(reqs), batch_size):
        batch = reqs[i : i + batch_size]
        p = max(len(pr) for pr, _ in batch)
        ids = torch.full((len(batch), p), pad_id, dtype=torch.long)
        mask = torch.zeros(len(batch), p, dtype=torch.long)
        for j, (pr, _) in enumerate(batch):
            ids[j, p - len(pr) :] = torch.tensor(pr)
            mask[j, p - len(pr) :] = 1
        longest = max(n for _, n in batch)
        cfg = GenerationConfig(
            max_new_tokens=longest, min_new_tokens=longest, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            eos_token_id=None, pad_token_id=pad_id,
        )
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
        assert out.shape[1] - p == longest
        useful += sum(n for _, n in batch)
        computed += longest * len(batch)
    return {"wall_s": time.perf_counter() - t, "tokens": useful, "computed_tokens": computed}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--prompt-min", type=int, default=16)
    ap.add_argument("--prompt-max", type=int, default=128)
    ap.add_argument("--mean-new", type=float, default=96)
    ap.add_argument("--cv", type=float, default=1.0)
    ap.add_argument("--max-new", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="small smoke run (~20 s)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "engine.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.batch_size, args.mean_new, args.max_new, args.repeats = 24, 8, 32, 128, 2
        args.hidden, args.layers, args.intermediate = 128, 2, 512

    from transformers import AutoModelForCausalLM

    from agentrl.engine.local import LocalEngine
    from agentrl.tiny_model import build_model

    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(Path(tmp) / "m", hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                           intermediate_size=args.intermediate, max_position_embeddings=1024)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    pad_id = model.config.pad_token_id
    reqs = workload(args)
    lens = [n for _, n in reqs]
    # eos_token_ids=(): never stop early, so both systems produce exactly the requested tokens.
    engine = LocalEngine(model, max_batch_size=args.batch_size, eos_token_ids=())
    warm = reqs[: args.batch_size // 2]
    run_engine(engine, [(p, 4) for p, _ in warm])
    run_static(model, [(p, 4) for p, _ in warm], args.batch_size, pad_id)

    pairs = []
    for rep in range(args.repeats):
        order = ("engine", "static") if rep % 2 == 0 else ("static", "engine")
        res = {}
        for name in order:
            res[name] = run_engine(engine, reqs) if name == "engine" else run_static(model, reqs, args.batch_size, pad_id)
            res[name]["tok_s"] = res[name]["tokens"] / res[name]["wall_s"]
        res["ratio"] = res["engine"]["tok_s"] / res["static"]["tok_s"]
        pairs.append(res)
        print(f"rep {rep}: engine {res['engine']['tok_s']:8.1f} tok/s  static {res['static']['tok_s']:8.1f} tok/s"
              f"  ratio {res['ratio']:.2f}", flush=True)
    asyncio.run(engine.close())

    med = lambda key: statistics.median(p[key]["tok_s"] for p in pairs)  # noqa: E731
    result = {
        "benchmark": "P4 local engine vs HF generate static batching",
        "command": " ".join(["python bench/bench_engine.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": {"platform": platform.platform(), "cpus": torch.get_num_threads(), "torch": torch.__version__},
        "workload": {
            "requests": args.requests, "batch_size": args.batch_size, "prompt_len": [args.prompt_min, args.prompt_max],
            "new_tokens": {"mean": statistics.mean(lens), "cv": statistics.pstdev(lens) / statistics.mean(lens),
                           "max": max(lens), "total": sum(lens)},
            "model": {"hidden": args.hidden, "layers": args.layers, "heads": args.heads,
                      "intermediate": args.intermediate},
            "seed": args.seed,
        },
        "engine_tok_s_median": med("engine"),
        "static_tok_s_median": med("static"),
        "static_useful_fraction": pairs[0]["static"]["tokens"] / pairs[0]["static"]["computed_tokens"],
        "speedup_median_of_pair_ratios": statistics.median(p["ratio"] for p in pairs),
        "pairs": pairs,
    }
    print()
    print(f"{'system':<28}{'tok/s (median)':>16}")
    print(f"{'LocalEngine (continuous)':<28}{result['engine_tok_s_median']:>16.1f}")
    print(f"{'HF generate (static)':<28}{result['static_tok_s_median']:>16.1f}")
    print(f"speedup (median of {len(pairs)} pair ratios): {result['speedup_median_of_pair_ratios']:.2f}x;"
          f" static batching computes {1 / result['static_useful_fraction']:.2f}x the useful tokens")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
