"""P3: sandbox exec latency and throughput (GUIDE §4).

Measures, with the trivial command ``true`` (no interpreter start-up to hide the sandbox's own cost):

1. local backend (``make_sandbox("local")``) vs a bare ``asyncio.create_subprocess_exec``: p50/p99
   of each and the median of pair ratios (A and B interleaved, one pair at a time). Target <= 1.5x.
2. Docker warm pool (``DockerSandbox.run``: acquire an idle container + one run + reset) vs a
   cold ``docker run --rm --network none IMAGE true`` (the CLI, as a user would). Target >= 30x.
   Also reported: cold via the SDK (create + start + wait + remove, no CLI start-up).
3. Throughput at 64 concurrent runs (runs/s), local and docker (64 warm containers; starting them
   is timed separately and not counted).

Shared machines are noisy, so the ratios are medians of interleaved pairs measured in one run.

    python bench/bench_sandbox.py             # full
    python bench/bench_sandbox.py --quick     # fewer samples
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from agentrl.sandbox import make_sandbox

ROOT = Path(__file__).resolve().parent.parent


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def summary(xs: list[float]) -> dict:
    return {"n": len(xs), "p50_ms": pct(xs, 50) * 1e3, "p99_ms": pct(xs, 99) * 1e3, "mean_ms": statistics.mean(xs) * 1e3}


async def bare_true() -> float:
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec("true", stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    await proc.communicate()
    return time.perf_counter() - t0


async def sandbox_true(sb) -> float:
    t0 = time.perf_counter()
    r = await sb.run(["true"], timeout_s=30)
    took = time.perf_counter() - t0
    assert r.ok, r
    return took


async def local_vs_bare(n: int) -> dict:
    sb = make_sandbox("local")
    a, b, ratios = [], [], []
    try:
        for _ in range(5):  # warm-up: imports, first bwrap start
            await bare_true()
            await sandbox_true(sb)
        for i in range(n):
            if i % 2:  # alternate the order inside a pair too
                tb, ta = await sandbox_true(sb), await bare_true()
            else:
                ta, tb = await bare_true(), await sandbox_true(sb)
            a.append(ta)
            b.append(tb)
            ratios.append(tb / ta)
        describe = sb.describe() if hasattr(sb, "describe") else {}
    finally:
        await sb.aclose()
    return {"bare_asyncio": summary(a), "local": summary(b), "ratio_median": statistics.median(ratios),
            "local_describe": {k: v for k, v in describe.items() if isinstance(v, (bool, int, float, str))},
            "target": "<= 1.5"}


def docker_run_cold(image: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(["docker", "run", "--rm", "--network", "none", image, "true"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def sdk_cold(client, image: str) -> float:
    t0 = time.perf_counter()
    c = client.containers.run(image, ["true"], detach=True, network_mode="none")
    c.wait()
    c.remove(force=True)
    return time.perf_counter() - t0


async def docker_warm_vs_cold(n: int) -> dict:
    import docker

    from agentrl.sandbox.docker import DockerSandbox

    sb = DockerSandbox(pool_size=1, max_concurrency=1)
    client = docker.from_env()
    image = sb.image
    warm, cold, cold_sdk, ratios, ratios_sdk = [], [], [], [], []
    try:
        await sb.start()
        for _ in range(5):
            await sandbox_true(sb)
        for i in range(n):
            tc = await asyncio.to_thread(docker_run_cold, image)
            tw = await sandbox_true(sb)
            ts = await asyncio.to_thread(sdk_cold, client, image)
            tw2 = await sandbox_true(sb)
            cold.append(tc)
            cold_sdk.append(ts)
            warm += [tw, tw2]
            ratios.append(tc / tw)
            ratios_sdk.append(ts / tw2)
    finally:
        await sb.aclose()
    return {"docker_run_cold_cli": summary(cold), "cold_sdk": summary(cold_sdk), "warm_pool": summary(warm),
            "ratio_median_vs_cli": statistics.median(ratios), "ratio_median_vs_sdk": statistics.median(ratios_sdk),
            "target": ">= 30"}


async def throughput(sb, concurrency: int, total: int) -> dict:
    done = 0

    async def worker(k: int) -> None:
        nonlocal done
        for _ in range(k):
            r = await sb.run(["true"], timeout_s=60)
            assert r.ok, r
            done += 1

    per = total // concurrency
    t0 = time.perf_counter()
    await asyncio.gather(*[worker(per) for _ in range(concurrency)])
    wall = time.perf_counter() - t0
    return {"concurrency": concurrency, "runs": done, "wall_s": wall, "runs_per_s": done / wall}


async def throughput_local(concurrency: int, total: int) -> dict:
    sb = make_sandbox("local", max_concurrency=concurrency)
    try:
        await throughput(sb, concurrency, concurrency)  # warm-up
        return await throughput(sb, concurrency, total)
    finally:
        await sb.aclose()


async def throughput_docker(concurrency: int, total: int) -> dict:
    from agentrl.sandbox.docker import DockerSandbox

    sb = DockerSandbox(pool_size=concurrency, max_concurrency=concurrency)
    try:
        t0 = time.perf_counter()
        await sb.start()
        start_s = time.perf_counter() - t0
        await throughput(sb, concurrency, concurrency)  # every container used once
        out = await throughput(sb, concurrency, total)
        out["pool_start_s"] = start_s
        return out
    finally:
        await sb.aclose()


def machine() -> dict:
    info = {"python": platform.python_version(), "kernel": platform.release(), "cpus": os.cpu_count(),
            "loadavg_at_start": os.getloadavg()}
    try:
        info["docker"] = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                                        text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["docker"] = None
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--no-docker", action="store_true", help="local backend only")
    ap.add_argument("--out", default=str(ROOT / "bench/results/sandbox.json"))
    args = ap.parse_args()
    n_pairs, n_cold, total = (40, 10, 640) if args.quick else (200, 40, 2560)
    out = {"machine": machine(), "quick": args.quick, "command": "python " + " ".join(sys.argv)}
    out["local_vs_bare"] = asyncio.run(local_vs_bare(n_pairs))
    out["throughput_local"] = asyncio.run(throughput_local(args.concurrency, total))
    if not args.no_docker:
        from agentrl.sandbox.docker import unavailable_reason

        reason = unavailable_reason()
        if reason is None:
            out["docker_warm_vs_cold"] = asyncio.run(docker_warm_vs_cold(n_cold))
            out["throughput_docker"] = asyncio.run(throughput_docker(args.concurrency, total))
        else:
            out["docker_skipped"] = reason
    out["machine"]["loadavg_at_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(table(out))
    print(f"wrote {args.out}")


def table(out: dict) -> str:
    lv = out["local_vs_bare"]
    rows = [("exec `true`", "p50 ms", "p99 ms", "ratio (median of pairs)", "target"),
            ("bare asyncio subprocess", f"{lv['bare_asyncio']['p50_ms']:.2f}", f"{lv['bare_asyncio']['p99_ms']:.2f}", "", ""),
            ("local backend", f"{lv['local']['p50_ms']:.2f}", f"{lv['local']['p99_ms']:.2f}",
             f"{lv['ratio_median']:.2f}x slower", "<= 1.5x")]
    if "docker_warm_vs_cold" in out:
        d = out["docker_warm_vs_cold"]
        rows += [("docker run --rm (cold, CLI)", f"{d['docker_run_cold_cli']['p50_ms']:.1f}",
                  f"{d['docker_run_cold_cli']['p99_ms']:.1f}", "", ""),
                 ("cold via SDK (create+start+rm)", f"{d['cold_sdk']['p50_ms']:.1f}", f"{d['cold_sdk']['p99_ms']:.1f}", "", ""),
                 ("docker warm pool (acquire+exec)", f"{d['warm_pool']['p50_ms']:.2f}", f"{d['warm_pool']['p99_ms']:.2f}",
                  f"{d['ratio_median_vs_cli']:.0f}x faster than CLI cold ({d['ratio_median_vs_sdk']:.0f}x vs SDK cold)",
                  ">= 30x")]
    tl = out["throughput_local"]
    rows.append((f"throughput local @{tl['concurrency']}", "", "", f"{tl['runs_per_s']:.0f} runs/s", ""))
    if "throughput_docker" in out:
        td = out["throughput_docker"]
        rows.append((f"throughput docker @{td['concurrency']}", "", "",
                     f"{td['runs_per_s']:.0f} runs/s (pool start {td['pool_start_s']:.0f} s)", ""))
    if "docker_skipped" in out:
        rows.append(("docker", "", "", f"skipped: {out['docker_skipped']}", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    m = out["machine"]
    lines.append(f"machine: {m['cpus']} CPUs, kernel {m['kernel']}, docker {m['docker']}, "
                 f"load {m['loadavg_at_start'][0]:.1f} -> {m['loadavg_at_end'][0]:.1f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
