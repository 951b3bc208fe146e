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
reported speedup is the median of the per-pair ratios.

    python bench/bench_engine.py            # default, ~3-5 min on 2 cores
    python bench/bench_engine.py --quick    # smoke run, ~20 s

``--engine sglang``: the same request set (same prompts, same requested lengths, same model) on
SGLangEngine, driving a real SGLang server launched on the model (CPU flags from the launcher,
``--max-running-requests`` = --batch-size, ``--dtype`` = --sglang-dtype), interleaved with the
LocalEngine (max_batch_size = --batch-size) and compared by the median of pair ratios. SGLang always
stops on the model's eos id, so a request may end a little early (p ~ 1/vocab per token on this
random model): tokens/s counts the tokens actually generated and the early stops are reported.
Informative only (issue 5): SGLang is not built for CPUs.

    python bench/bench_engine.py --engine sglang [--quick]

``--engine narrow``: the LocalEngine with bfloat16 linear layers under the float32 model
(``engine.linear_dtype: bfloat16``) vs the LocalEngine in float32, the same request set, interleaved.

    python bench/bench_engine.py --engine narrow --model SmolLM2-135M-Instruct.Q4_1.gguf --requests 64 \
        --prompt-min 200 --prompt-max 400 --mean-new 150 --cv 0.5 --max-new 300 --repeats 2
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
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


async def generate_all(engine, reqs, exact: bool = True) -> dict:
    """Submit every request at once; wall time until the last one is back."""
    from agentrl.engine.base import SamplingParams

    stats = getattr(engine, "stats", {})
    steps0 = stats.get("steps")
    t = time.perf_counter()
    outs = await asyncio.gather(
        *(engine.generate(p, SamplingParams(max_new_tokens=n, temperature=1.0)) for p, n in reqs)
    )
    wall = time.perf_counter() - t
    got = sum(len(o.token_ids) for o in outs)
    if exact:
        assert got == sum(n for _, n in reqs), "engine stopped early: the workload would differ"
    res = {"wall_s": wall, "tokens": got, "early_stops": sum(len(o.token_ids) < n for o, (_, n) in zip(outs, reqs))}
    if steps0 is not None:
        res["steps"] = stats["steps"] - steps0
    return res


def run_engine(engine, reqs) -> dict:
    return asyncio.run(generate_all(engine, reqs))


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
            max_new_tokens=longest,
            min_new_tokens=longest,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            eos_token_id=None,
            pad_token_id=pad_id,
        )
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
        assert out.shape[1] - p == longest
        useful += sum(n for _, n in batch)
        computed += longest * len(batch)
    return {"wall_s": time.perf_counter() - t, "tokens": useful, "computed_tokens": computed}


def interleave(systems: dict[str, Callable[[], dict]], repeats: int) -> list[dict]:
    """Two systems run alternately (AB, BA, ...), each run's ``tok_s`` added; ``ratio`` = first / second."""
    (a, _), (b, _) = systems.items()
    pairs = []
    for rep in range(repeats):
        res: dict = {}
        for name in (a, b) if rep % 2 == 0 else (b, a):
            res[name] = systems[name]()
            res[name]["tok_s"] = res[name]["tokens"] / res[name]["wall_s"]
        res["ratio"] = res[a]["tok_s"] / res[b]["tok_s"]
        pairs.append(res)
        line = f"rep {rep}: {a} {res[a]['tok_s']:8.1f} tok/s  {b} {res[b]['tok_s']:8.1f} tok/s"
        print(f"{line}  ratio {res['ratio']:.2f}", flush=True)
    return pairs


def bench_static(args, model, reqs) -> dict:
    """P4: LocalEngine vs HF generate static batching, interleaved."""
    from agentrl.engine.local.engine import LocalEngine

    pad_id = model.config.pad_token_id
    # eos_token_ids=(): never stop early, so both systems produce exactly the requested tokens.
    engine = LocalEngine(model, max_batch_size=args.batch_size, eos_token_ids=())
    warm = reqs[: args.batch_size // 2]
    run_engine(engine, [(p, 4) for p, _ in warm])
    run_static(model, [(p, 4) for p, _ in warm], args.batch_size, pad_id)

    static = functools.partial(run_static, model, reqs, args.batch_size, pad_id)
    pairs = interleave({"engine": functools.partial(run_engine, engine, reqs), "static": static}, args.repeats)
    asyncio.run(engine.close())

    med = lambda key: statistics.median(p[key]["tok_s"] for p in pairs)  # noqa: E731
    result = {
        "benchmark": "P4 local engine vs HF generate static batching",
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
    print(
        f"speedup (median of {len(pairs)} pair ratios): {result['speedup_median_of_pair_ratios']:.2f}x;"
        f" static batching computes {1 / result['static_useful_fraction']:.2f}x the useful tokens"
    )
    return result


def bench_narrow(args, path: Path, model, reqs) -> dict:
    """LocalEngine with bfloat16 linear layers vs the same engine in float32, interleaved (ABBA)."""
    from transformers import AutoModelForCausalLM

    from agentrl.engine.local.engine import LocalEngine

    copy = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()  # narrowed in place
    engines = {
        "bf16_linears": LocalEngine(copy, max_batch_size=args.batch_size, eos_token_ids=(), linear_dtype="bfloat16"),
        "float32": LocalEngine(model, max_batch_size=args.batch_size, eos_token_ids=()),
    }
    for eng in engines.values():
        run_engine(eng, [(p, 4) for p, _ in reqs[: args.batch_size // 2]])
    pairs = interleave({name: functools.partial(run_engine, eng, reqs) for name, eng in engines.items()}, args.repeats)
    for eng in engines.values():
        asyncio.run(eng.close())
    result = {
        "benchmark": "LocalEngine: bfloat16 linear layers vs float32",
        "bf16_linears_tok_s_median": statistics.median(p["bf16_linears"]["tok_s"] for p in pairs),
        "float32_tok_s_median": statistics.median(p["float32"]["tok_s"] for p in pairs),
        "speedup_median_of_pair_ratios": statistics.median(p["ratio"] for p in pairs),
        "pairs": pairs,
    }
    print(
        f"bf16 linears / float32 (median of {len(pairs)} pair ratios): {result['speedup_median_of_pair_ratios']:.2f}x"
    )
    return result


def bench_sglang(args, path: Path, model, reqs) -> dict:
    """SGLangEngine (a real server on ``path``) vs LocalEngine on the same requests, interleaved."""
    from agentrl.engine.local.engine import LocalEngine
    from agentrl.engine.sglang.engine import SGLangEngine

    t = time.perf_counter()
    # the launcher's CPU flags include --sleep-on-idle (an idle scheduler would busy-poll a core)
    sglang = SGLangEngine.launch(path, max_running_requests=args.batch_size, dtype=args.sglang_dtype)
    print(
        f"SGLang server ready in {time.perf_counter() - t:.1f} s ({sglang.urls[0]}, dtype {args.sglang_dtype})",
        flush=True,
    )
    local = LocalEngine(model, max_batch_size=args.batch_size, eos_token_ids=())
    engines = {"sglang": sglang, "local": local}

    async def go() -> list[dict]:
        try:
            warm = [(p, 4) for p, _ in reqs[: args.batch_size // 2]]
            for eng in engines.values():
                await generate_all(eng, warm, exact=False)
            pairs = []
            for rep in range(args.repeats):
                res = {}
                for name in ("sglang", "local") if rep % 2 == 0 else ("local", "sglang"):
                    res[name] = await generate_all(engines[name], reqs, exact=name == "local")
                    res[name]["tok_s"] = res[name]["tokens"] / res[name]["wall_s"]
                res["ratio"] = res["sglang"]["tok_s"] / res["local"]["tok_s"]
                pairs.append(res)
                print(
                    f"rep {rep}: sglang {res['sglang']['tok_s']:8.1f} tok/s  local {res['local']['tok_s']:8.1f} tok/s"
                    f"  ratio {res['ratio']:.2f}  (sglang early stops: {res['sglang']['early_stops']})",
                    flush=True,
                )
            return pairs
        finally:
            for eng in engines.values():
                await eng.close()

    pairs = asyncio.run(go())
    med = lambda key: statistics.median(p[key]["tok_s"] for p in pairs)  # noqa: E731
    result = {
        "benchmark": "SGLangEngine vs LocalEngine on one workload (informative, issue 5)",
        "sglang_dtype": args.sglang_dtype,
        "sglang_tok_s_median": med("sglang"),
        "local_tok_s_median": med("local"),
        "sglang_over_local_median_of_pair_ratios": statistics.median(p["ratio"] for p in pairs),
        "pairs": pairs,
    }
    print()
    print(f"{'system':<32}{'tok/s (median)':>16}")
    print(f"{'SGLangEngine (' + args.sglang_dtype + ')':<32}{result['sglang_tok_s_median']:>16.1f}")
    print(f"{'LocalEngine (float32)':<32}{result['local_tok_s_median']:>16.1f}")
    print(
        f"SGLang / local (median of {len(pairs)} pair ratios): {result['sglang_over_local_median_of_pair_ratios']:.2f}x"
    )
    return result


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--engine",
        choices=("local", "sglang", "narrow"),
        default="local",
        help="local: LocalEngine vs HF static batching (P4); sglang: SGLangEngine vs LocalEngine; narrow: "
        "LocalEngine with bfloat16 linear layers vs in float32",
    )
    ap.add_argument(
        "--sglang-dtype",
        default="float32",
        help="SGLang --dtype (float32 = the local engine's precision; SGLang's own default, auto, "
        "serves this float32 checkpoint in float16)",
    )
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--prompt-min", type=int, default=16)
    ap.add_argument("--prompt-max", type=int, default=128)
    ap.add_argument("--mean-new", type=float, default=96)
    ap.add_argument("--cv", type=float, default=1.0)
    ap.add_argument("--max-new", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--model",
        default=None,
        help="a real model instead of the built-in shape (HF dir, GGUF file or Hub id, as --model of agentrl "
        "run); --hidden/--layers/--heads/--intermediate are then ignored",
    )
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="small smoke run (~20 s; with sglang plus its start)")
    ap.add_argument(
        "--out", default=None, help="JSON path (default bench/results/engine[-quick].json, engine-sglang[-quick].json)"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.batch_size, args.mean_new, args.max_new, args.repeats = 24, 8, 32, 128, 2
        args.hidden, args.layers, args.intermediate = 128, 2, 512
    stem = {"local": "engine", "sglang": "engine-sglang", "narrow": "engine-narrow"}[args.engine]
    name = stem + ("-quick" if args.quick else "") + ".json"
    out = Path(args.out or Path(__file__).parent / "results" / name)

    from transformers import AutoModelForCausalLM

    from agentrl.warmstart.tiny_model import build_model

    torch.manual_seed(args.seed)
    reqs = workload(args)
    lens = [n for _, n in reqs]
    with tempfile.TemporaryDirectory() as tmp:  # kept while an SGLang server may read it
        if args.model:
            from agentrl.models.hub import resolve_model

            path = resolve_model(args.model, what="--model")
        else:
            path = build_model(
                Path(tmp) / "m",
                hidden_size=args.hidden,
                num_layers=args.layers,
                num_heads=args.heads,
                intermediate_size=args.intermediate,
                max_position_embeddings=1024,
            )
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        if args.engine == "local":
            result = bench_static(args, model, reqs)
        elif args.engine == "narrow":
            result = bench_narrow(args, path, model, reqs)
        else:
            result = bench_sglang(args, path, model, reqs)
    result.update(
        {
            "command": " ".join(["python bench/bench_engine.py", *(sys.argv[1:] if argv is None else argv)]),
            "machine": {"platform": platform.platform(), "cpus": torch.get_num_threads(), "torch": torch.__version__},
            "workload": {
                "requests": args.requests,
                "batch_size": args.batch_size,
                "prompt_len": [args.prompt_min, args.prompt_max],
                "new_tokens": {
                    "mean": statistics.mean(lens),
                    "cv": statistics.pstdev(lens) / statistics.mean(lens),
                    "max": max(lens),
                    "total": sum(lens),
                },
                "model": {"path": str(path)}
                if args.model
                else {
                    "hidden": args.hidden,
                    "layers": args.layers,
                    "heads": args.heads,
                    "intermediate": args.intermediate,
                },
                "seed": args.seed,
            },
        }
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
