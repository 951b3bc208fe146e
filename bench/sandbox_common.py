"""What the P3 sandbox bench scripts share: percentiles, a timed exec of ``true``, throughput at N concurrent runs."""

from __future__ import annotations

import asyncio
import statistics
import time


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def summary(xs: list[float]) -> dict:
    return {
        "n": len(xs),
        "p50_ms": pct(xs, 50) * 1e3,
        "p99_ms": pct(xs, 99) * 1e3,
        "mean_ms": statistics.mean(xs) * 1e3,
    }


async def sandbox_true(sb) -> float:
    t0 = time.perf_counter()
    r = await sb.run(["true"], timeout_s=30)
    took = time.perf_counter() - t0
    assert r.ok, r
    return took


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
