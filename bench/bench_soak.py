"""Soak: N mixed episodes (ordinary and hostile tool code) through the real EpisodeManager against
the docker and the local sandbox; then 0 leaked containers, processes, file descriptors, and a
bounded memory curve (issue 6, deliver 4).

Real pieces: ``EpisodeManager``, ``CodeExecEnv`` (python + bash tools, one-shot runs and, for every
4th episode, a sandbox session), the sandbox backends, the Qwen2.5 chat template on the built-in
tokenizer. Scripted piece: the policy (``FakeEngine``), which picks a program mix per episode from a
hash of the task prompt: ordinary code (most episodes) and the sandbox suite's hostile programs (fork
bombs, memory bombs, busy loops, 1 GB of output, ``kill -9 -1``, fd exhaustion, orphans, disk
filling, segfaults, fake passes...), plus malformed calls, direct answers and over-long turns.

Reported per backend: episodes/s, outcome counts, the tool result status per program kind (and
how many fell outside the statuses that kind may have), and the leak check: our labelled docker
containers, processes of the sandbox uids and children of this process, sandbox work dirs and
mounts (``host_snapshot`` of tests/host_state.py), this process's open fds
(``/proc/self/fd``, before the sandbox exists vs after it is closed), and RSS sampled every
``--sample-every`` episodes with the slope of its second half (MB per 1k episodes) and the peak.

    python bench/bench_soak.py --episodes 10000            # 10k episodes: 5k on docker, 5k on local
    python bench/bench_soak.py --episodes 300 --backends local
    python bench/bench_soak.py --quick                     # smoke run: 48 episodes per backend

Skips a backend (saying why) where it cannot run; hostile kinds a backend cannot contain (see the
hostile suite: fork bombs and ``kill -9 -1`` on the local backend without a dedicated uid) are left
out of its mix, and the report says which.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(_TESTS))

import leak_probe  # noqa: E402  (tests/leak_probe.py: fds and RSS of this process)
from host_state import host_snapshot  # noqa: E402  (the host-state probe the hostile suite uses)

from agentrl.config.schema import RolloutConfig  # noqa: E402
from agentrl.engine.fake import FakeEngine  # noqa: E402
from agentrl.episodes.manager import EpisodeManager, EpisodeSpec  # noqa: E402
from agentrl.jobs.rollout import tune_gc  # noqa: E402

CODE_TIMEOUT_S = 5.0  # CodeExecEnv's default; the hostile suite gives memory/disk cases 10 s

# kind -> (weight, [(tool, code), ...] run one per turn before the final answer, needs, allowed statuses)
# ``needs``: a containment fact of the backend (``facts`` below) without which the kind is not run.
KINDS: dict[str, tuple[int, list[tuple[str, str]], str | None, set[str]]] = {
    "ordinary": (
        40,
        [("python", "import math\nprint(math.factorial(10) % 997, sum(i * i for i in range(100)))")],
        None,
        {"ok"},
    ),
    "ordinary_multi": (
        10,
        [
            ("python", "open('x.txt', 'w').write('41')\nprint('saved')"),
            ("bash", "echo $((6 * 7)); ls | head -3"),
            (
                "python",
                "print(int(open('x.txt').read()) + 1 if __import__('os').path.exists('x.txt') else 'fresh dir')",
            ),
        ],
        None,
        {"ok"},
    ),
    "direct": (4, [], None, set()),
    "malformed": (
        4,
        [("raw", '<tool_call>\n{"name": "python", "arguments": {"code": \n</tool_call>')],
        None,
        {"model_error"},
    ),
    "too_long": (2, [("long", "")], None, set()),
    "fork_bomb": (
        2,
        [("python", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")],
        "pids",
        {"timeout"},
    ),
    "bash_fork_bomb": (2, [("bash", ":(){ :|:& };:")], "pids", {"ok", "exit_nonzero", "timeout"}),
    "busy_loop": (2, [("python", "while True: pass")], None, {"timeout"}),
    "sleep": (1, [("python", "import time\ntime.sleep(1000)")], None, {"timeout"}),
    "memory_bomb": (3, [("python", "x = bytearray(10 * 1024**3)")], None, {"oom"}),
    "memory_gradual": (2, [("python", "a = []\nwhile True: a.append(bytearray(50 * 2**20))")], None, {"oom"}),
    "huge_output": (
        3,
        [("python", "import sys\nb = b'x' * (1 << 20)\nfor _ in range(1024): sys.stdout.buffer.write(b)")],
        None,
        {"output_limit"},
    ),
    "kill_all": (3, [("bash", "kill -9 -1; echo survived")], "kill_all", {"ok", "killed", "exit_nonzero"}),
    "kill_parent": (
        2,
        [
            (
                "python",
                "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\n"
                "except OSError as e:\n    print('denied', e)\nprint('alive')",
            )
        ],
        None,
        {"ok"},
    ),
    "fd_exhaustion": (3, [("python", "fs = []\nwhile True: fs.append(open('/dev/null'))")], None, {"exit_nonzero"}),
    "orphans": (
        3,
        [
            ("bash", "setsid sleep 1000 & nohup sleep 1000 >/dev/null 2>&1 & disown; echo started"),
            (
                "python",
                "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                "        time.sleep(1000)\n    os._exit(0)\nprint('daemon started')",
            ),
        ],
        None,
        {"ok"},
    ),
    "fill_disk": (
        2,
        [("python", "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * (16 << 20)); i += 1")],
        None,
        {"exit_nonzero"},
    ),
    "segfault": (2, [("python", "import ctypes\nctypes.string_at(0)")], None, {"killed"}),
    "garbage_output": (
        2,
        [("python", r"import sys; sys.stdout.buffer.write(b'a\xff\xfe\x00b\x1b[2J\r\n')")],
        None,
        {"ok"},
    ),
    "exit_zero": (2, [("python", "import os\nos._exit(0)")], None, {"ok"}),
    "network": (
        2,
        [
            (
                "python",
                "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\n"
                "    print('REACHED')\nexcept OSError as e:\n    print('blocked', e)",
            )
        ],
        None,
        {"ok"},
    ),
}
ANSWER = "The answer is \\boxed{42}."
_MARKS = [
    ("TimeoutError: the program did not finish", "timeout"),
    ("[output limit exceeded", "output_limit"),
    ("MemoryError: the program ran out of memory", "oom"),
    ("[the program was killed by signal", "killed"),
    ("[the sandbox reported an error", "error"),
    ("[exit code ", "exit_nonzero"),
]


def facts(sb) -> dict[str, bool]:
    """What the backend contains (the hostile suite's ``facts``; docker contains everything)."""
    d = sb.describe() if hasattr(sb, "describe") else {}
    return {"pids": d.get("pids_enforced", True), "kill_all": d.get("bwrap", False) or d.get("dedicated_uid", True)}


def tool_status(msg: dict) -> str:
    """The sandbox status a tool message shows (``tools.format_exec_result``'s status lines);
    ``model_error`` for the answer to a call that named no tool (malformed)."""
    if "name" not in msg:
        return "model_error"
    content = msg["content"]
    for mark, status in _MARKS:
        if mark in content:
            return status
    return "ok"


class Policy:
    """The scripted model: a program kind per task prompt (hash of the user message), one call per
    turn, then the final answer. Stateless, so it holds nothing per episode."""

    def __init__(self, tok, kinds: list[str], max_new_tokens: int) -> None:
        self.im_start = tok.convert_tokens_to_ids("<|im_start|>")
        end = tok.convert_tokens_to_ids("<|im_end|>")
        self.cycle = [k for k in kinds for _ in range(KINDS[k][0])]
        enc = lambda text: tok.encode(text, add_special_tokens=False) + [end]  # noqa: E731
        self.turns: dict[str, list[list[int]]] = {}
        for k in kinds:
            ids = []
            for tool, code in KINDS[k][1]:
                if tool == "raw":
                    ids.append(enc(code))
                elif tool == "long":  # no stop id within max_new_tokens: truncated_length
                    ids.append(tok.encode("blah " * max_new_tokens, add_special_tokens=False)[: max_new_tokens + 8])
                else:
                    arg = "code" if tool == "python" else "command"
                    ids.append(
                        enc(f"<tool_call>\n{json.dumps({'name': tool, 'arguments': {arg: code}})}\n</tool_call>")
                    )
            self.turns[k] = ids + [enc(ANSWER)]

    def kind_of(self, ids) -> str:
        starts = [i for i, t in enumerate(ids) if t == self.im_start][:3]
        key = tuple(ids[starts[1] : starts[2]]) if len(starts) == 3 else tuple(ids)
        return self.cycle[hash(key) % len(self.cycle)]

    def __call__(self, prompt_ids, params, ctx) -> list[int]:
        n_starts = sum(1 for t in prompt_ids if t == self.im_start)
        turn = max(0, (n_starts - 3) // 2)
        script = self.turns[self.kind_of(prompt_ids)]
        return script[min(turn, len(script) - 1)]


def _slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of (episodes, MB) in MB per 1k episodes."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return 1000 * sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


def _leaks(before: dict, backend: str, wait_s: float = 10.0) -> dict:
    """What differs from ``before`` once killed processes have been reaped (polls up to ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        after = host_snapshot(backend)
        diff = {
            k: {"before": before[k], "after": after[k]} for k in before if k != "tmp_used_mb" and before[k] != after[k]
        }
        tmp_mb = after["tmp_used_mb"] - before["tmp_used_mb"]
        if (not diff and abs(tmp_mb) < 256) or time.monotonic() > deadline:
            return {"diff": diff, "tmp_used_mb_delta": tmp_mb}
        time.sleep(0.2)


def unavailable(name: str) -> str | None:
    """Why backend ``name`` cannot run here (None: it can)."""
    from agentrl.sandbox import docker_unavailable_reason

    if name == "docker":
        reason = docker_unavailable_reason()
        if reason is not None:
            return f"docker backend unavailable: {reason}"
    return None


def make_backend(name: str, concurrency: int):
    from agentrl.sandbox import Limits, make_sandbox

    # the hostile suite's Limits, with a lower memory ceiling so memory bombs end quickly
    return make_sandbox(name, limits=Limits(memory_mb=256), max_concurrency=concurrency)


async def _run(sb, tok, episodes: int, kinds: list[str], concurrency: int, sample_every: int, on_sample=None) -> dict:
    from agentrl.envs.code_exec import CodeExecEnv

    cfg = RolloutConfig(
        max_turns=6,
        max_new_tokens=384,
        max_context=8192,
        max_concurrency=concurrency,
        turn_timeout_s=60.0,
        episode_timeout_s=300.0,
        temperature=1.0,
    )
    policy = Policy(tok, kinds, cfg.max_new_tokens)
    made = [0]

    def make_env():
        made[0] += 1
        return CodeExecEnv(
            sandbox=sb,
            tools=("python", "bash"),
            code_timeout_s=CODE_TIMEOUT_S,
            session=made[0] % 4 == 0,
            tool_timeout_s=30.0,
        )

    mgr = EpisodeManager(FakeEngine(policy), make_env, tok, cfg, env_id="code_exec")
    outcomes: Counter = Counter()
    by_kind: dict[str, Counter] = defaultdict(Counter)
    unexpected: list[dict] = []
    infra: list[dict] = []  # episodes that did not end trainable, with why (the first 50)
    samples: list[dict] = []
    done = 0
    t0 = time.perf_counter()
    async for traj in mgr.stream(EpisodeSpec(f"soak-{i}", 0, task_seed=i) for i in range(episodes)):
        done += 1
        outcomes[traj.outcome.value] += 1
        kind = policy.kind_of(traj.token_ids[: traj.prompt_len])
        statuses = [tool_status(m) for m in traj.messages if m["role"] == "tool"]
        by_kind[kind]["episodes"] += 1
        for s in statuses:
            by_kind[kind][s] += 1
        # a timeout is always a containment (the deadline is the backstop; a loaded machine can
        # push an OOM or a slow program past it): counted per kind, not "unexpected"
        allowed = KINDS[kind][3] | {"timeout"} | ({"ok", "exit_nonzero"} if len(KINDS[kind][1]) > 1 else set())
        if not traj.trainable and len(infra) < 50:
            infra.append({"kind": kind, "outcome": traj.outcome.value, "detail": traj.outcome_detail[:500]})
        if traj.outcome.value not in ("ok", "truncated_length") or any(s not in allowed for s in statuses):
            if len(unexpected) < 20:
                unexpected.append(
                    {
                        "kind": kind,
                        "outcome": traj.outcome.value,
                        "statuses": statuses,
                        "detail": traj.outcome_detail[:300],
                    }
                )
            by_kind[kind]["unexpected"] += 1
        if done % sample_every == 0 or done == episodes:
            s = {
                "episodes": done,
                "rss_mb": round(leak_probe.rss_mb(), 1),
                "fds": len(os.listdir("/proc/self/fd")),
                "elapsed_s": round(time.perf_counter() - t0, 1),
            }
            samples.append(s)
            if on_sample:
                on_sample(s)
    wall = time.perf_counter() - t0
    return {
        "episodes": done,
        "wall_s": wall,
        "episodes_per_s": done / wall,
        "outcomes": dict(outcomes),
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "unexpected": unexpected,
        "infra": infra,
        "unexpected_count": sum(v.get("unexpected", 0) for v in by_kind.values()),
        "samples": samples,
    }


def soak(backend: str, episodes: int, *, concurrency: int = 16, sample_every: int = 100, verbose: bool = False) -> dict:
    """Run the soak on one backend; the report dict (see the module docstring). ``skipped`` says why
    when the backend cannot run here."""
    from agentrl.warmstart.tiny_model import build_tokenizer

    why = unavailable(backend)
    if why is not None:  # before the host snapshot, which asks the docker daemon too
        return {"backend": backend, "skipped": why}
    tok = build_tokenizer()
    tune_gc()  # as in `agentrl run` / `agentrl rollout`
    gc.collect()
    fds_before, snap_before = leak_probe.fds(), host_snapshot(backend)
    sb = make_backend(backend, min(concurrency, 8))
    f = facts(sb)
    kinds = [k for k, (_, _, need, _) in KINDS.items() if need is None or f[need]]
    left_out = sorted(set(KINDS) - set(kinds))

    async def main(sb) -> dict:
        try:
            return await _run(
                sb,
                tok,
                episodes,
                kinds,
                concurrency,
                sample_every,
                on_sample=(lambda s: print(f"  [{backend}] {s}", flush=True)) if verbose else None,
            )
        finally:
            await sb.aclose()

    report = asyncio.run(main(sb))
    del sb  # the leak check below runs with the sandbox object gone
    gc.collect()
    leaks = _leaks(snap_before, backend)
    fds_after = leak_probe.fds()
    leaked_fds = leak_probe.new_fds(fds_before, fds_after)  # the local backend's uid-block lock is kept by design
    pts = [(s["episodes"], s["rss_mb"]) for s in report["samples"]]
    half = [p for p in pts if p[0] > episodes / 2] or pts
    report.update(
        {
            "backend": backend,
            "kinds_left_out": left_out,
            "leaks": leaks,
            "leaked_containers": len(leaks["diff"].get("containers", {}).get("after", [])),
            "leaked_processes": len(
                set(leaks["diff"].get("sandbox_uid_procs", {}).get("after", []))
                | set(leaks["diff"].get("our_children", {}).get("after", []))
            ),
            "leaked_fds": leaked_fds,
            "fds_before": len(fds_before),
            "fds_after": len(fds_after),
            "rss_first_mb": pts[0][1] if pts else None,
            "rss_last_mb": pts[-1][1] if pts else None,
            "rss_peak_mb": round(leak_probe.rss_mb("VmHWM"), 1),
            "rss_slope_mb_per_1k_second_half": round(_slope(half), 3),
        }
    )
    return report


def _print(r: dict) -> None:
    if r.get("skipped"):
        print(f"\n== {r['backend']}: SKIPPED ({r['skipped']})")
        return
    print(
        f"\n== {r['backend']}: {r['episodes']} episodes in {r['wall_s']:.1f} s = {r['episodes_per_s']:.2f} episodes/s"
    )
    print("outcomes:", ", ".join(f"{k}={v}" for k, v in sorted(r["outcomes"].items())))
    print(f"{'kind':16} {'episodes':>8}  tool statuses")
    for k, c in r["by_kind"].items():
        rest = ", ".join(f"{s}={n}" for s, n in sorted(c.items()) if s != "episodes")
        print(f"{k:16} {c['episodes']:>8}  {rest}")
    if r["kinds_left_out"]:
        print("left out (not contained by this backend here):", ", ".join(r["kinds_left_out"]))
    print(f"unexpected episodes: {r['unexpected_count']}", *(f"\n  {u}" for u in r["unexpected"][:5]))
    for u in r["infra"][:5]:
        print("  not trainable:", u)
    print(
        f"leaks: containers={r['leaked_containers']} processes={r['leaked_processes']} "
        f"fds={len(r['leaked_fds'])} (fds {r['fds_before']} -> {r['fds_after']}) other={r['leaks']}"
    )
    print(
        f"RSS: first {r['rss_first_mb']} MB, last {r['rss_last_mb']} MB, peak {r['rss_peak_mb']} MB, "
        f"slope over the second half {r['rss_slope_mb_per_1k_second_half']} MB per 1k episodes"
    )
    print(
        "RSS curve (episodes: MB):",
        " ".join(f"{s['episodes']}:{s['rss_mb']}" for s in r["samples"][:: max(1, len(r["samples"]) // 20)]),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=10_000, help="episodes in all, split evenly over the backends")
    ap.add_argument("--backends", default="docker,local", help="comma-separated: docker, local")
    ap.add_argument("--concurrency", type=int, default=16, help="episodes in flight")
    ap.add_argument("--sample-every", type=int, default=0, help="episodes between RSS samples (0: episodes/50)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 48 episodes per backend, 8 in flight")
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/soak[-quick].json)")
    args = ap.parse_args()
    if args.quick:
        args.episodes, args.concurrency = 48 * len(args.backends.split(",")), 8
    args.out = args.out or str(
        Path(__file__).resolve().parent / "results" / f"soak{'-quick' if args.quick else ''}.json"
    )
    backends = [b.strip() for b in args.backends.split(",")]
    per_backend = args.episodes // len(backends)
    every = args.sample_every or max(1, per_backend // 50)
    print(
        f"soak: {args.episodes} episodes, {per_backend} per backend, {args.concurrency} in flight, machine: "
        f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    reports = []
    for b in backends:
        r = soak(b, per_backend, concurrency=args.concurrency, sample_every=every, verbose=True)
        _print(r)
        reports.append(r)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"args": vars(args), "load_start": os.getloadavg(), "reports": reports}, indent=1, default=str)
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
