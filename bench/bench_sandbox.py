"""P3: sandbox exec latency and throughput.

Per isolation mode of the local backend (``bwrap``: bubblewrap's view, as root built by the
executor; ``no-bwrap``: as root without it, i.e. a dedicated uid and our own pid/network/mount
namespaces; ``not-root``: the bench re-runs itself in a user namespace as uid 1000, rlimits only),
each against a bare ``asyncio.create_subprocess_exec`` measured interleaved in the same run
(median of pair ratios; ``--reps`` blocks of pairs, each block's median reported for the spread;
the load average at each block's start and end). Calls are ``--gap-ms`` apart (a tool call per
turn, not a burst: the executor prepares the next jail in such a pause; back-to-back calls take
cold jails, see ``true_back_to_back``), and the CPU time of each side per call is measured too
(this process, its children, and the executor with everything it reaped):

1. exec of ``true`` (no interpreter start-up to hide the sandbox's own cost). Target <= 1.5x.
2. a ``python`` tool call (``agentrl.tools.python``, the warm executor's fork) of ``pass`` vs a bare
   ``python3 -c pass``. Target: p50 <= the bare one.
3. 256 concurrent ``python`` tool calls of a small program (the default run's kind) through the
   process-wide default sandbox (its default concurrency), while two torch threads do matmuls in
   this process: p50/p99 of a call (queue included) and timeouts. Target: p99 <= 2 s, 0 timeouts.

Then, unless ``--no-docker``: the Docker warm pool (acquire + exec) vs a cold ``docker run --rm``
(target >= 30x) and throughput at 64 concurrent runs, local and docker.

    python bench/bench_sandbox.py             # full
    python bench/bench_sandbox.py --quick     # fewer samples, throughput at 16 concurrent runs (~30 s)
    python bench/bench_sandbox.py --modes no-bwrap,not-root --no-docker
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandbox_common import sandbox_true, summary, throughput
from sandbox_docker import docker_rows

from agentrl.sandbox import make_sandbox
from agentrl.tools.python import make_python_tool

ROOT = Path(__file__).resolve().parent.parent


async def bare_true() -> float:
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        "true", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    await proc.communicate()
    return time.perf_counter() - t0


async def bare_python() -> float:
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "pass",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    await proc.communicate()
    return time.perf_counter() - t0


def tool_call(sb, code: str = "pass"):
    tool = make_python_tool(sb, timeout_s=5)

    async def call() -> float:
        t0 = time.perf_counter()
        out = await tool.fn(code=code)
        took = time.perf_counter() - t0
        assert "Error" not in out and "exit code" not in out, out
        return took

    return call


def cpu_s(executor_pid: int | None) -> float:
    """CPU seconds of this process and its reaped children, plus the executor's and what it reaped."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    if executor_pid is not None:
        try:
            fields = Path(f"/proc/{executor_pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime
        except OSError:
            pass
    return total


async def pairs(bare, ours, n: int, gap_s: float, reps: int = 1) -> dict:
    """``reps`` blocks of ``n`` interleaved pairs (order alternating, ``gap_s`` between calls);
    p50/p99 of each side over all pairs, the median of ours/bare over all pairs and per block, the
    load average around each block, and each side's CPU ms per call."""
    from agentrl.sandbox.local.client import executor

    a, b, ratios, blocks = [], [], [], []
    for _ in range(5):  # warm-up: imports, the executor, the first jails
        await bare()
        await asyncio.sleep(gap_s)
        await ours()
        await asyncio.sleep(gap_s)
    cpu = {"bare": 0.0, "ours": 0.0}
    for _ in range(reps):
        load0, block = os.getloadavg()[0], []
        for i in range(n):
            took = {}
            for side in ("ours", "bare") if i % 2 else ("bare", "ours"):
                c0 = cpu_s(executor().pid)
                took[side] = await (ours() if side == "ours" else bare())
                await asyncio.sleep(gap_s)  # the executor's refill happens here: count it with ours
                cpu[side] += cpu_s(executor().pid) - c0
            a.append(took["bare"])
            b.append(took["ours"])
            ratios.append(took["ours"] / took["bare"])
            block.append(ratios[-1])
        blocks.append({"ratio_median": statistics.median(block), "load": [load0, os.getloadavg()[0]]})
    return {
        "bare": summary(a),
        "ours": summary(b),
        "ratio_median": statistics.median(ratios),
        "blocks": blocks,
        "cpu_ms_per_call": {k: v / (n * reps) * 1e3 for k, v in cpu.items()},
        "gap_ms": gap_s * 1e3,
    }


async def back_to_back(sb, n: int) -> dict:
    """``true`` run after ``true`` with no pause: the executor has no idle moment to prepare a
    jail, so each takes a cold one (forked and set up for it)."""
    took = [await sandbox_true(sb) for _ in range(n)]
    return summary(took)


async def loaded_burst(sb, calls: int = 256) -> dict:
    """``calls`` concurrent python tool calls while two torch threads multiply matrices here."""
    import threading

    import torch

    stop = threading.Event()

    def busy() -> None:
        torch.set_num_threads(2)
        a = torch.randn(512, 512)
        while not stop.is_set():
            a @ a

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    code = "print(sum(x for x in range(1, 591) if x % 7 == 0 or x % 8 == 0))"
    expected = str(sum(x for x in range(1, 591) if x % 7 == 0 or x % 8 == 0))  # a timeout or error is wrong
    tool = make_python_tool(sb, timeout_s=5)

    async def one() -> tuple[float, bool]:
        t0 = time.perf_counter()
        out = await tool.fn(code=code)
        return time.perf_counter() - t0, out.strip() != expected

    try:
        await asyncio.sleep(0.5)
        t0 = time.perf_counter()
        got = await asyncio.gather(*[one() for _ in range(calls)])
        wall = time.perf_counter() - t0
    finally:
        stop.set()
        t.join()
    lat = [x for x, _ in got]
    return {
        "calls": calls,
        "wall_s": wall,
        **summary(lat),
        "timeouts_or_wrong": sum(bad for _, bad in got),
        "max_concurrency": sb.max_concurrency,
    }


async def mode_bench(mode: str, n: int, gap_s: float, reps: int) -> dict:
    bwrap = {"bwrap": True, "no-bwrap": False, "not-root": False}[mode]
    sb = make_sandbox("local", bwrap=bwrap)
    try:
        out = {
            "describe": {k: v for k, v in sb.describe().items() if isinstance(v, (bool, int, float, str))},
            "true": await pairs(bare_true, lambda: sandbox_true(sb), n, gap_s, reps),
            "true_back_to_back": await back_to_back(sb, max(20, n // 4)),
            "python_tool": await pairs(bare_python, tool_call(sb), n, gap_s),
        }
    finally:
        await sb.aclose()
    burst = make_sandbox("local", bwrap=bwrap)  # the default options: what a run's shared sandbox has
    try:
        out["burst_256_loaded"] = await loaded_burst(burst)
    finally:
        await burst.aclose()
    return out


def run_mode(mode: str, n: int, gap_s: float, reps: int) -> dict:
    if mode == "bwrap":
        from agentrl.sandbox.local import bwrap_unavailable_reason

        if bwrap_unavailable_reason() is not None:
            return {"skipped": bwrap_unavailable_reason()}
    if mode == "not-root" and os.geteuid() == 0:  # re-run this mode as uid 1000 in a user namespace
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [
                "unshare",
                "--user",
                "--map-user=1000",
                "--map-group=1000",
                sys.executable,
                __file__,
                "--child-mode",
                mode,
                "--pairs",
                str(n),
                "--gap-ms",
                str(gap_s * 1e3),
                "--reps",
                str(reps),
                "--out",
                f.name,
            ]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                return {"skipped": f"not-root mode failed: {r.stderr.strip()[-500:]}"}
            return json.loads(Path(f.name).read_text())
    return asyncio.run(mode_bench(mode, n, gap_s, reps))


async def throughput_local(concurrency: int, total: int) -> dict:
    sb = make_sandbox("local", max_concurrency=concurrency)
    try:
        await throughput(sb, concurrency, concurrency)  # warm-up
        return await throughput(sb, concurrency, total)
    finally:
        await sb.aclose()


def machine() -> dict:
    info = {
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
    }
    try:
        info["docker"] = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["docker"] = None
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="40 pairs, 10 cold docker runs, throughput at 16 (not 64)")
    ap.add_argument(
        "--concurrency", type=int, default=None, help="throughput concurrency (default 64; 16 with --quick)"
    )
    ap.add_argument("--no-docker", action="store_true", help="local backend only")
    ap.add_argument("--modes", default="bwrap,no-bwrap,not-root", help="local isolation modes to measure")
    ap.add_argument("--pairs", type=int, default=None, help="interleaved pairs per comparison (per block)")
    ap.add_argument("--reps", type=int, default=3, help="blocks of pairs for exec of true (the spread)")
    ap.add_argument("--gap-ms", type=float, default=30.0, help="pause between calls (a tool call per turn)")
    ap.add_argument("--child-mode", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/sandbox[-quick].json)")
    args = ap.parse_args()
    n_pairs, n_cold, total = (40, 10, 640) if args.quick else (100, 40, 2560)
    n_pairs = args.pairs or n_pairs
    args.concurrency = args.concurrency or (16 if args.quick else 64)
    args.out = args.out or str(ROOT / "bench" / "results" / f"sandbox{'-quick' if args.quick else ''}.json")
    if args.child_mode:
        result = asyncio.run(mode_bench(args.child_mode, n_pairs, args.gap_ms / 1e3, args.reps))
        Path(args.out).write_text(json.dumps(result))
        return
    out = {"machine": machine(), "quick": args.quick, "command": "python " + " ".join(sys.argv)}
    out["modes"] = {m: run_mode(m, n_pairs, args.gap_ms / 1e3, args.reps) for m in args.modes.split(",") if m}
    out["throughput_local"] = asyncio.run(throughput_local(args.concurrency, total))
    if not args.no_docker:
        from agentrl.sandbox.docker import unavailable_reason

        reason = unavailable_reason()
        if reason is None:
            from sandbox_docker import docker_warm_vs_cold, throughput_docker

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
    rows = [("what", "p50 ms", "p99 ms", "ratio (median of pairs) / result", "target")]
    for mode, m in out["modes"].items():
        if "skipped" in m:
            rows.append((f"[{mode}]", "", "", f"skipped: {m['skipped'][:80]}", ""))
            continue
        for key, bare, target in (
            ("true", "bare asyncio exec of true", "<= 1.5x"),
            ("python_tool", "bare python3 -c pass", "<= 1.0x"),
        ):
            r = m[key]
            spread = [blk["ratio_median"] for blk in r.get("blocks", [])]
            cpu = r["cpu_ms_per_call"]
            rows += [
                (
                    f"[{mode}] {bare}",
                    f"{r['bare']['p50_ms']:.2f}",
                    f"{r['bare']['p99_ms']:.2f}",
                    f"CPU {cpu['bare']:.2f} ms/call",
                    "",
                ),
                (
                    f"[{mode}] local {'exec of true' if key == 'true' else 'python tool call'}",
                    f"{r['ours']['p50_ms']:.2f}",
                    f"{r['ours']['p99_ms']:.2f}",
                    f"{r['ratio_median']:.2f}x"
                    + (f" (blocks {min(spread):.2f}-{max(spread):.2f}x)" if len(spread) > 1 else "")
                    + f", CPU {cpu['ours']:.2f} ms/call",
                    target,
                ),
            ]
            if key == "true":
                loads = [x for blk in r["blocks"] for x in blk["load"]]
                t = m["true_back_to_back"]
                rows.append(
                    (
                        f"[{mode}] local exec of true, back to back",
                        f"{t['p50_ms']:.2f}",
                        f"{t['p99_ms']:.2f}",
                        f"gap {r['gap_ms']:.0f} ms above; load {min(loads):.1f}-{max(loads):.1f}",
                        "",
                    )
                )
        b = m["burst_256_loaded"]
        rows.append(
            (
                f"[{mode}] 256 python calls, 2 torch threads busy",
                f"{b['p50_ms']:.0f}",
                f"{b['p99_ms']:.0f}",
                f"{b['timeouts_or_wrong']} timeouts/wrong, wall {b['wall_s']:.2f} s",
                "p99 <= 2000, 0",
            )
        )
    rows += docker_rows(out, "warm")
    tl = out["throughput_local"]
    rows.append((f"throughput local @{tl['concurrency']}", "", "", f"{tl['runs_per_s']:.0f} runs/s", ""))
    rows += docker_rows(out, "throughput")
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    m = out["machine"]
    lines.append(
        f"machine: {m['cpus']} CPUs, kernel {m['kernel']}, docker {m['docker']}, "
        f"load {m['loadavg_at_start'][0]:.1f} -> {m['loadavg_at_end'][0]:.1f}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
