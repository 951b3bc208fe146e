"""The Docker half of P3 (``bench_sandbox.py`` without ``--no-docker``): the warm pool's acquire + exec vs a
cold ``docker run --rm`` (CLI and SDK), throughput at N concurrent runs, and their rows of the table."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import time

from sandbox_common import sandbox_true, summary, throughput


def docker_run_cold(image: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, "true"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
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
        for _ in range(n):
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
    return {
        "docker_run_cold_cli": summary(cold),
        "cold_sdk": summary(cold_sdk),
        "warm_pool": summary(warm),
        "ratio_median_vs_cli": statistics.median(ratios),
        "ratio_median_vs_sdk": statistics.median(ratios_sdk),
        "target": ">= 30",
    }


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


def docker_rows(out: dict, part: str) -> list[tuple[str, str, str, str, str]]:
    """The table rows of the Docker comparison (``part`` "warm") or of its throughput ("throughput")."""
    if part == "throughput":
        td = out.get("throughput_docker")
        if td is None:
            return []
        result = f"{td['runs_per_s']:.0f} runs/s (pool start {td['pool_start_s']:.0f} s)"
        return [(f"throughput docker @{td['concurrency']}", "", "", result, "")]
    if "docker_skipped" in out:
        return [("docker", "", "", f"skipped: {out['docker_skipped']}", "")]
    d = out.get("docker_warm_vs_cold")
    if d is None:
        return []
    cli, sdk, warm = d["docker_run_cold_cli"], d["cold_sdk"], d["warm_pool"]
    faster = f"{d['ratio_median_vs_cli']:.0f}x faster than CLI cold ({d['ratio_median_vs_sdk']:.0f}x vs SDK cold)"
    return [
        ("docker run --rm (cold, CLI)", f"{cli['p50_ms']:.1f}", f"{cli['p99_ms']:.1f}", "", ""),
        ("cold via SDK (create+start+rm)", f"{sdk['p50_ms']:.1f}", f"{sdk['p99_ms']:.1f}", "", ""),
        ("docker warm pool (acquire+exec)", f"{warm['p50_ms']:.2f}", f"{warm['p99_ms']:.2f}", faster, ">= 30x"),
    ]
