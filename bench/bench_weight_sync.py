"""P6: weight sync time per path (agentrl.weights), on this machine.

For each model (the built-in tiny shape, and a bigger one: --big-hidden x --big-layers), the same
perturbed state dict (fp32, fixed by seed) is pushed --repeats times through every path:

- inprocess: LocalEngine.update_weights (in-place copy into the local engine's model);
- disk: safetensors to a fresh dir + ``/update_weights_from_disk`` on a live SGLang server;
- tensor: ``/update_weights_from_tensor`` (CPU: tensors pickled in-band, base64 in the body);
- distributed: ``/update_weights_from_distributed``, one flattened bucket per --bucket-mb, broadcast
  over a gloo process group (NCCL needs GPUs).

The SGLang paths share one server per model and are interleaved round by round (disk, tensor,
distributed, disk, ...), so machine noise hits them alike; each push's wall time includes pausing
and resuming generation and the cache flush. Reported: median seconds per push, MB/s of fp32 weight
bytes, and the median of each phase (write/serialize, load, connect). Every push is checked: after
it, the server reports the pushed version. Prints a table; writes --out (JSON).

    python bench/bench_weight_sync.py            # tiny + 1024x8 models, ~5 min on 2 busy cores
    python bench/bench_weight_sync.py --quick    # tiny model only, 2 repeats
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.weights.disk import DiskSync
from agentrl.weights.distributed import DistributedSync
from agentrl.weights.inprocess import InProcessSync
from agentrl.weights.tensor import TensorSync

SGLANG_PATHS = ("disk", "tensor", "distributed")


def perturbed(model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(seed)
    return {
        k: v + 0.01 * torch.randn(v.shape, generator=g, dtype=v.dtype)
        for k, v in load_file(str(model_dir / "model.safetensors")).items()
    }


async def bench_inprocess(model_dir: Path, state: dict, repeats: int) -> list[float]:
    from agentrl.engine.local.engine import LocalEngine

    eng = LocalEngine.from_pretrained(str(model_dir))
    await eng.start()
    sync = InProcessSync(eng)
    try:
        return [(await sync.push(state, v + 1)).seconds for v in range(repeats)]
    finally:
        await eng.close()


async def bench_sglang(model_dir: Path, state: dict, repeats: int, bucket_bytes: int, tmp: Path) -> dict:
    import httpx

    from agentrl.engine.sglang.engine import SGLangEngine

    eng = SGLangEngine.launch(str(model_dir), max_total_tokens=4096)
    syncs = {
        "disk": DiskSync(eng, tmp / "weights", model_path=model_dir),
        "tensor": TensorSync(eng, bucket_bytes=bucket_bytes),
        "distributed": DistributedSync(eng, backend="gloo", bucket_bytes=bucket_bytes, timeout_s=600),
    }
    out: dict = {p: {"seconds": [], "phases": []} for p in SGLANG_PATHS}
    version = 0
    try:
        await eng.start()
        async with httpx.AsyncClient(timeout=120) as client:
            for _ in range(repeats):
                for path in SGLANG_PATHS:
                    version += 1
                    stats = await syncs[path].push(state, version)
                    r = (
                        await client.post(
                            eng.urls[0] + "/generate",
                            json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}},
                        )
                    ).json()
                    if r["meta_info"]["weight_version"] != str(version):
                        raise RuntimeError(
                            f"{path}: server serves {r['meta_info']['weight_version']}, pushed {version}"
                        )
                    out[path]["seconds"].append(stats.seconds)
                    out[path]["phases"].append(stats.phases)
                    out[path]["bytes"] = stats.bytes
    finally:
        for s in syncs.values():
            await s.close()
        await eng.close()
    return out


def summarize(name: str, params: int, nbytes: int, inproc: list[float], sg: dict) -> list[dict]:
    rows = [
        {
            "model": name,
            "params": params,
            "path": "inprocess",
            "median_s": statistics.median(inproc),
            "runs_s": inproc,
            "MB_per_s": nbytes / 1e6 / statistics.median(inproc),
            "phases": {},
        }
    ]
    for path in SGLANG_PATHS:
        secs = sg[path]["seconds"]
        keys = sorted({k for p in sg[path]["phases"] for k in p})
        phases = {k: statistics.median(p.get(k, 0.0) for p in sg[path]["phases"]) for k in keys}
        rows.append(
            {
                "model": name,
                "params": params,
                "path": path,
                "median_s": statistics.median(secs),
                "runs_s": secs,
                "MB_per_s": nbytes / 1e6 / statistics.median(secs),
                "phases": phases,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--big-hidden", type=int, default=1024)
    ap.add_argument("--big-layers", type=int, default=8)
    ap.add_argument("--bucket-mb", type=int, default=512)
    ap.add_argument("--quick", action="store_true", help="tiny model only, 2 repeats")
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/weight_sync[-quick].json)")
    args = ap.parse_args()
    if args.quick:
        args.repeats = 2
    args.out = args.out or str(Path(__file__).parent / "results" / f"weight_sync{'-quick' if args.quick else ''}.json")

    from agentrl.engine.sglang.server import unavailable_reason
    from agentrl.warmstart.default_model import BASE
    from agentrl.warmstart.tiny_model import build_model

    reason = unavailable_reason()
    if reason:
        sys.exit(f"SGLang cannot run here: {reason}")
    models = [("tiny", BASE)]
    if not args.quick:
        h = args.big_hidden
        models.append(
            (
                f"{h}x{args.big_layers}",
                dict(
                    hidden_size=h,
                    num_layers=args.big_layers,
                    num_heads=h // 64,
                    intermediate_size=4 * h,
                    vocab_size=2048,
                    arch="qwen3",
                    seed=0,
                ),
            )
        )
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-weight-sync-") as tmp:
        for name, shape in models:
            model_dir = build_model(Path(tmp) / name, **shape)
            state = perturbed(model_dir, seed=0)
            params = sum(t.numel() for t in state.values())
            nbytes = sum(t.numel() * t.element_size() for t in state.values())
            print(f"[{name}] {params / 1e6:.1f}M params, {nbytes / 1e6:.0f} MB fp32", flush=True)
            inproc = asyncio.run(bench_inprocess(model_dir, state, args.repeats))
            sg = asyncio.run(
                bench_sglang(model_dir, state, args.repeats, args.bucket_mb << 20, Path(tmp) / f"{name}-w")
            )
            rows += summarize(name, params, nbytes, inproc, sg)

    print(
        f"\nP6 weight sync ({platform.node()}, {torch.get_num_threads()} threads, repeats={args.repeats}; "
        "SGLang on CPU serves fp16)"
    )
    print(f"{'model':>10} {'params':>8} {'path':>12} {'median s':>9} {'MB/s':>8}  phases (median s)")
    for r in rows:
        ph = " ".join(f"{k}={v:.3f}" for k, v in r["phases"].items())
        size = f"{r['params'] / 1e6:>7.1f}M"
        print(f"{r['model']:>10} {size} {r['path']:>12} {r['median_s']:>9.3f} {r['MB_per_s']:>8.0f}  {ph}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "time": time.strftime("%Y-%m-%d %H:%M"),
                "repeats": args.repeats,
                "rows": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
