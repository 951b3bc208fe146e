"""Trainer memory, full-parameter vs LoRA, on a Qwen2.5-0.5B-sized model (random init, CPU, no download).

The model is built from its config (hidden 896, intermediate 4864, 24 layers, 14 heads, 2 KV heads,
vocab 151936, tied embeddings: ~494M parameters) with random weights and saved once to a temporary
directory. Each arm then runs in its own process (so its peak RSS is its own): build the agentrl
Trainer (FSDP2 on a 1-process gloo group, fp32 master weights), take one optimizer step on a short
batch, and report

* params MB:   every parameter tensor of the policy (frozen base included)
* grads MB:    every ``.grad`` tensor present when the optimizer steps (measured in a step pre-hook)
* optim MB:    every tensor in the optimizer state after the step (AdamW: exp_avg, exp_avg_sq, step)
* train MB:    params + grads + optim, the trainer's resident training state
* peak RSS MB: the process's peak resident set (ru_maxrss), which adds activations, the allocator's
  slack, the loaded checkpoint and the Python/torch runtime

Arms: ``full`` (every parameter trains) and ``lora`` (trainer.lora.rank = --rank on the attention and
MLP projections, alpha = 2 x rank). No reference model, no critic.

    python bench/bench_lora_memory.py               # the 0.5B-sized model (~10 GB RAM for the full arm)
    python bench/bench_lora_memory.py --quick       # a tiny config, a few seconds per arm
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ARMS = ("full", "lora")
QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=1024,
    tie_word_embeddings=True,
)
MB = 2**20


def build_model_dir(out: Path, model_cfg: dict, seed: int) -> int:
    """A randomly initialised Qwen2 model of ``model_cfg`` saved to ``out``; returns its parameter count."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**model_cfg))
    model.save_pretrained(str(out))
    return sum(p.numel() for p in model.parameters())


def batch(n: int, length: int, vocab: int, seed: int):
    from agentrl.trainer import TrainSample

    rng = random.Random(seed)
    out = []
    for i in range(n):
        mask = [0] * (length // 4) + [1] * (length - length // 4)
        out.append(
            TrainSample(
                token_ids=[rng.randrange(10, vocab) for _ in mask],
                loss_mask=mask,
                behaviour_logprobs=[-10.0 * m for m in mask],
                advantages=[(1.0 if i % 2 else -1.0) * m for m in mask],
            )
        )
    return out


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def run_arm(args) -> dict:
    """One arm in this process: one optimizer step, memory measured from the tensors."""
    from agentrl.trainer import Trainer, TrainerConfig
    from agentrl.trainer.config import LoraConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    lora = LoraConfig(rank=args.rank if args.arm == "lora" else 0, alpha=2.0 * args.rank)
    cfg = TrainerConfig(lr=1e-5, micro_batch_tokens=args.seq_len * args.sequences, lora=lora, device="cpu")
    seen: dict[str, int] = {}
    with Trainer(args.model_dir, cfg) as t:
        params = list(t.model.parameters())

        def pre_step(opt, *_):
            seen["grads"] = tensor_bytes(
                p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in params if p.grad is not None
            )

        t.optimizer.register_step_pre_hook(pre_step)
        vocab = t.model.config.vocab_size
        m = t.train_step(batch(args.sequences, args.seq_len, vocab, args.seed))
        local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
        state = [
            v.to_local() if hasattr(v, "to_local") else v for st in t.optimizer.state.values() for v in st.values()
        ]
        row = {
            "arm": args.arm,
            "rank": lora.rank,
            "params": sum(p.numel() for p in local),
            "trainable": sum(p.numel() for p in params if p.requires_grad),
            "params_mb": tensor_bytes(local) / MB,
            "grads_mb": seen.get("grads", 0) / MB,
            "optim_mb": tensor_bytes(state) / MB,
            "loss": m["loss"],
            "step_time_s": m["step_time_s"],
        }
    row["train_mb"] = row["params_mb"] + row["grads_mb"] + row["optim_mb"]
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank of the lora arm")
    ap.add_argument("--sequences", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    ap.add_argument("--quick", action="store_true", help="a tiny model config (smoke run, seconds)")
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/lora_memory[-quick].json)")
    ap.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # internal: run one arm in this process
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        print("ROW " + json.dumps(run_arm(args)), flush=True)
        return
    model_cfg = TINY if args.quick else QWEN25_05B
    args.out = args.out or str(Path(__file__).parent / "results" / f"lora_memory{'-quick' if args.quick else ''}.json")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        n_params = build_model_dir(Path(tmp), model_cfg, args.seed)
        for arm in ARMS:
            cmd = [
                sys.executable,
                __file__,
                "--arm",
                arm,
                "--model-dir",
                tmp,
                "--rank",
                str(args.rank),
                "--sequences",
                str(args.sequences),
                "--seq-len",
                str(args.seq_len),
                "--seed",
                str(args.seed),
                "--threads",
                str(args.threads),
            ]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode:
                sys.exit(f"arm {arm} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
            rows.append(json.loads(next(line[4:] for line in p.stdout.splitlines() if line.startswith("ROW "))))
    full, lora = rows
    cols = ("arm", "trainable", "params MB", "grads MB", "optim MB", "train MB", "peak RSS MB")
    print(f"{'model':<12}{'Qwen2.5-0.5B-sized' if not args.quick else 'tiny (--quick)'}: {n_params:,} parameters")
    print("".join(f"{c:>14}" for c in cols))
    for r in rows:
        name = r["arm"] + (f" r={r['rank']}" if r["rank"] else "")
        vals = (
            name,
            f"{r['trainable']:,}",
            *(f"{r[k]:.1f}" for k in ("params_mb", "grads_mb", "optim_mb", "train_mb", "peak_rss_mb")),
        )
        print("".join(f"{v:>14}" for v in vals))
    result = {
        "model": {**model_cfg, "params": n_params, "quick": args.quick},
        "arms": rows,
        "ratio_lora_over_full_train_mb": lora["train_mb"] / full["train_mb"],
        "ratio_lora_over_full_peak_rss": lora["peak_rss_mb"] / full["peak_rss_mb"],
        "workload": {
            "sequences": args.sequences,
            "seq_len": args.seq_len,
            "rank": args.rank,
            "alpha": 2.0 * args.rank,
            "threads": args.threads,
            "torch": torch.__version__,
            "machine": platform.machine(),
            "python": platform.python_version(),
        },
    }
    print(
        f"LoRA / full: train state x{result['ratio_lora_over_full_train_mb']:.3f}, "
        f"peak RSS x{result['ratio_lora_over_full_peak_rss']:.3f}"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
