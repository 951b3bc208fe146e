"""P5: trainer tokens/s, packed micro-batches vs the padded baseline, on the same long-tail batch.

One batch of multi-turn-shaped sequences, fixed by seed: total length lognormal with CV = --cv
(mean --mean-len, clipped to [--min-len, --micro-batch-tokens]); each is a prompt (mask 0) then
assistant turns (mask 1) separated by tool outputs (mask 0). Every arm runs the *same* Trainer
(same weights, same loss: ppo_clip, token-mean) doing one full optimizer step over the batch with
micro-batches of at most --micro-batch-tokens token slots:

A  pack:        first-fit-decreasing packing into [1, T] rows, varlen attention (no padding)
B  pad:         the batch in its given order cut into [b, T_max] rows with b * T_max <= budget
C  pad-sorted:  the same padded layout over the batch sorted longest-first (a stronger baseline)

tokens/s counts real (non-padding) tokens only, per wall second and per CPU second of this process
(the second is much steadier on a shared, oversubscribed machine). Arms are interleaved (ABC, CBA,
...) after one warm-up step each; the headline is the median over repeats of the per-repeat ratio
A/B (shared machines are noisy).

    python bench/bench_trainer.py --threads 1   # default workload (~5-10 min on 2 busy cores)
    python bench/bench_trainer.py --quick       # smoke run (~1 min)
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ARMS = ("pack", "pad", "pad-sorted")


def workload(args):
    from agentrl.trainer import TrainSample

    rng = random.Random(args.seed)
    sigma = math.sqrt(math.log(1 + args.cv**2))
    mu = math.log(args.mean_len) - sigma**2 / 2
    samples = []
    for _ in range(args.sequences):
        n = max(args.min_len, min(args.micro_batch_tokens, round(rng.lognormvariate(mu, sigma))))
        prompt = min(n - 1, rng.randint(16, 64))
        mask = [0] * prompt
        turn = 1
        while len(mask) < n:  # assistant turn, then a tool output, ...
            seg = min(n - len(mask), rng.randint(8, 96) if turn else rng.randint(4, 48))
            mask += [turn] * seg
            turn = 1 - turn
        ids = [rng.randrange(10, 2000) for _ in range(n)]
        samples.append(
            TrainSample(
                token_ids=ids,
                loss_mask=mask,
                behaviour_logprobs=[-7.0 * m for m in mask],
                advantages=[rng.choice([-1.0, 1.0]) * m for m in mask],
            )
        )
    return samples


def step(trainer, arm: str, samples, by_len) -> dict:
    trainer.cfg.batching = "pack" if arm == "pack" else "pad"
    cpu = time.process_time()
    m = trainer.train_step(by_len if arm == "pad-sorted" else samples)
    cpu = time.process_time() - cpu
    # CPU seconds are reported beside wall time: on a shared, oversubscribed machine they are far
    # less noisy (wall time also counts the time other tenants hold the cores).
    return {
        "tok_s": m["tokens_per_s"],
        "tok_cpu_s": m["tokens"] / cpu,
        "wall_s": m["step_time_s"],
        "cpu_s": cpu,
        "tokens": m["tokens"],
        "micro_batches": m["micro_batches"],
        "padding_frac": m["padding_frac"],
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=128)
    ap.add_argument("--mean-len", type=float, default=256)
    ap.add_argument("--cv", type=float, default=1.0)
    ap.add_argument("--min-len", type=int, default=24)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    ap.add_argument("--quick", action="store_true", help="small smoke run (~30 s)")
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/trainer[-quick].json)")
    args = ap.parse_args(argv)
    if args.quick:
        args.sequences, args.mean_len, args.micro_batch_tokens, args.repeats = 48, 128, 2048, 2
        args.hidden, args.layers, args.heads, args.intermediate = 128, 2, 2, 512
    args.out = args.out or str(Path(__file__).parent / "results" / f"trainer{'-quick' if args.quick else ''}.json")
    warnings.filterwarnings("ignore")

    from transformers.utils import logging as hf_logging

    from agentrl.trainer import Trainer, TrainerConfig
    from agentrl.warmstart.tiny_model import build_model

    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    samples = workload(args)
    by_len = sorted(samples, key=lambda s: -len(s.token_ids))
    lens = [len(s.token_ids) for s in samples]
    cfg = TrainerConfig(lr=1e-6, micro_batch_tokens=args.micro_batch_tokens, device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(
            Path(tmp) / "m",
            hidden_size=args.hidden,
            num_layers=args.layers,
            num_heads=args.heads,
            intermediate_size=args.intermediate,
            max_position_embeddings=args.micro_batch_tokens,
        )
        trainer = Trainer(str(path), cfg)
    try:
        warm = samples[: max(2, len(samples) // 8)]
        for arm in ARMS:
            step(trainer, arm, warm, sorted(warm, key=lambda s: -len(s.token_ids)))
        reps = []
        for rep in range(args.repeats):
            res = {}
            for arm in ARMS if rep % 2 == 0 else ARMS[::-1]:
                res[arm] = step(trainer, arm, samples, by_len)
            for key, base in (("pad", "pad"), ("pad_sorted", "pad-sorted")):
                res[f"ratio_{key}"] = res["pack"]["tok_s"] / res[base]["tok_s"]
                res[f"cpu_ratio_{key}"] = res["pack"]["tok_cpu_s"] / res[base]["tok_cpu_s"]
            reps.append(res)
            print(
                f"rep {rep}: "
                + "  ".join(f"{a} {res[a]['tok_s']:7.1f} tok/s ({res[a]['tok_cpu_s']:7.1f}/cpu-s)" for a in ARMS)
                + f"  pack/pad {res['ratio_pad']:.2f} (cpu {res['cpu_ratio_pad']:.2f})"
                + f"  pack/pad-sorted {res['ratio_pad_sorted']:.2f} (cpu {res['cpu_ratio_pad_sorted']:.2f})",
                flush=True,
            )
    finally:
        trainer.close()

    med = lambda arm, key="tok_s": statistics.median(r[arm][key] for r in reps)  # noqa: E731
    result = {
        "benchmark": "P5 trainer: packed vs padded micro-batches",
        "command": " ".join(["python bench/bench_trainer.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": {"platform": platform.platform(), "threads": torch.get_num_threads(), "torch": torch.__version__},
        "workload": {
            "sequences": args.sequences,
            "micro_batch_tokens": args.micro_batch_tokens,
            "lengths": {
                "mean": statistics.mean(lens),
                "cv": statistics.pstdev(lens) / statistics.mean(lens),
                "max": max(lens),
                "total": sum(lens),
            },
            "loss_tokens": sum(sum(s.loss_mask) for s in samples),
            "model": {
                "hidden": args.hidden,
                "layers": args.layers,
                "heads": args.heads,
                "intermediate": args.intermediate,
                "attn_implementation": cfg.attn_implementation,
            },
            "seed": args.seed,
        },
        "arms": {
            a: {
                "tok_s_median": med(a),
                "tok_per_cpu_s_median": med(a, "tok_cpu_s"),
                "micro_batches": reps[0][a]["micro_batches"],
                "padding_frac": reps[0][a]["padding_frac"],
            }
            for a in ARMS
        },
        "speedup_vs_pad": statistics.median(r["ratio_pad"] for r in reps),
        "speedup_vs_pad_sorted": statistics.median(r["ratio_pad_sorted"] for r in reps),
        "cpu_speedup_vs_pad": statistics.median(r["cpu_ratio_pad"] for r in reps),
        "cpu_speedup_vs_pad_sorted": statistics.median(r["cpu_ratio_pad_sorted"] for r in reps),
        "repeats": reps,
    }
    print()
    print(f"{'arm':<12}{'tok/s (median)':>16}{'tok/cpu-s':>12}{'micro-batches':>15}{'padding':>10}")
    for a in ARMS:
        r = result["arms"][a]
        print(
            f"{a:<12}{r['tok_s_median']:>16.1f}{r['tok_per_cpu_s_median']:>12.1f}{r['micro_batches']:>15.0f}"
            f"{r['padding_frac']:>10.1%}"
        )
    print(
        f"packed vs padded: {result['speedup_vs_pad']:.2f}x wall, {result['cpu_speedup_vs_pad']:.2f}x cpu;"
        f" vs length-sorted padded: {result['speedup_vs_pad_sorted']:.2f}x wall,"
        f" {result['cpu_speedup_vs_pad_sorted']:.2f}x cpu (medians of {len(reps)} interleaved repeats);"
        f" padded computes"
        f" {1 / (1 - result['arms']['pad']['padding_frac']):.2f}x the real tokens"
        f" (sorted: {1 / (1 - result['arms']['pad-sorted']['padding_frac']):.2f}x)"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
