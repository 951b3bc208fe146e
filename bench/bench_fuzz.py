"""Fuzz run (issue 20): N hostile model turns through the tool-call parsers, the rule scorers, the
``code_exec`` env step and whole episodes on the FakeEngine.

Each text comes from ``tests/fuzz_texts.hostile_text`` (deep nesting, huge numbers, many tags,
unclosed boxes, surrogates, NUL, ANSI, random unicode, valid calls mixed in) at up to
``--max-chars`` characters (default 16,384: a 4,096-token turn). Per stage it counts crashes (an
exception escaping), wrongly typed outcomes (``fuzz_texts.Wrong``: a malformed call not answered
as one, a model's text ending an episode as an infrastructure failure, invalid UTF-8 written...),
hangs (an input over ``--hang-s``; a SIGALRM interrupts it where Python code is running), and the
slowest single input with its size. The env step runs on the echo sandbox (no programs run);
episodes render and tokenize with the built-in tokenizer and Qwen2.5's chat template, and every
trajectory goes through ``write_jsonl``. Prints a table, writes JSON, exits 1 on any crash, wrong
outcome or hang. ``tests/tools/test_fuzz.py`` is the short CI version (hypothesis, fixed budget).

    python bench/bench_fuzz.py                      # 100,000 texts
    python bench/bench_fuzz.py --n 5000 --episode-every 4
    python bench/bench_fuzz.py --quick              # smoke run: 200 texts, every 4th as an episode (~3 s)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fuzz_texts import (  # noqa: E402
    MAX_CHARS,
    ScriptedPolicy,
    Wrong,
    check_env_step,
    check_episode,
    check_parsers,
    check_scorers,
    episode_manager,
    hostile_text,
    make_env,
)

from agentrl.jobs.rollout import tune_gc  # noqa: E402
from agentrl.trajectory import valid_text  # noqa: E402
from agentrl.warmstart.tiny_model import build_tokenizer  # noqa: E402

STAGES = ("parser", "scorer", "env_step", "episode")


class GcClock:
    """CPU time this thread spent in the cyclic GC: a pause lands on whichever input allocated last,
    so it is reported apart from the input's own cost."""

    def __init__(self) -> None:
        self.total_s, self._start = 0.0, 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.thread_time()
        else:
            self.total_s += time.thread_time() - self._start


GC = GcClock()


class Hang(Exception):
    """Raised by SIGALRM inside an input that ran past --hang-s."""


def _on_alarm(signum, frame):
    raise Hang()


class Stage:
    """Counts and the slowest input of one stage."""

    def __init__(self, name: str) -> None:
        self.name, self.n, self.total_s = name, 0, 0.0
        self.bad = {"crash": 0, "wrong": 0, "hang": 0}
        # CPU time of this thread: what an input costs, without the preemption of a shared machine
        self.slowest_s, self.slowest_chars, self.slowest_head = 0.0, 0, ""
        self.slowest_wall_s = 0.0
        self.gc_s = self.gc_max_s = 0.0
        self.times: list[float] = []
        self.examples: list[dict] = []

    def run(self, fn, text: str, hang_s: float, setup=None) -> None:
        """Time ``fn(text)`` (``setup(text)`` runs first, untimed)."""
        if setup is not None:
            setup(text)
        signal.setitimer(signal.ITIMER_REAL, hang_s)
        t0, c0, g0 = time.perf_counter(), time.thread_time(), GC.total_s
        kind, detail = None, ""
        try:
            fn(text)
        except Hang:
            kind = "hang"
        except Wrong as e:
            kind, detail = "wrong", str(e)
        except Exception as e:  # the thing we count
            kind, detail = "crash", f"{type(e).__name__}: {e}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        wall, gc_s = time.perf_counter() - t0, GC.total_s - g0
        dt = time.thread_time() - c0 - gc_s
        self.gc_max_s, self.gc_s = max(self.gc_max_s, gc_s), self.gc_s + gc_s
        if kind is None and wall > hang_s:  # finished, but inside C code the alarm could not interrupt
            kind = "hang"
        self.n += 1
        self.total_s += dt
        self.times.append(dt)
        self.slowest_wall_s = max(self.slowest_wall_s, wall)
        if dt > self.slowest_s:
            self.slowest_s, self.slowest_chars, self.slowest_head = dt, len(text), text[:60]
        if kind:
            self.bad[kind] += 1
            if len(self.examples) < 10:
                self.examples.append(
                    {
                        "kind": kind,
                        "detail": detail[:500],
                        "chars": len(text),
                        "wall_s": wall,
                        "text": valid_text(text[:4000]),
                    }
                )

    def summary(self) -> dict:
        ts = sorted(self.times) or [0.0]
        return {
            "inputs": self.n,
            "inputs_per_s": self.n / self.total_s if self.total_s else 0.0,
            "crashes": self.bad["crash"],
            "wrong": self.bad["wrong"],
            "hangs": self.bad["hang"],
            "p50_ms": ts[len(ts) // 2] * 1e3,
            "p99_ms": ts[min(len(ts) - 1, int(len(ts) * 0.99))] * 1e3,
            "slowest_ms": self.slowest_s * 1e3,
            "slowest_chars": self.slowest_chars,
            "slowest_wall_ms": self.slowest_wall_s * 1e3,
            "gc_total_s": self.gc_s,
            "gc_max_ms": self.gc_max_s * 1e3,
            "slowest_head": valid_text(self.slowest_head),
            "examples": self.examples,
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000, help="texts to generate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-chars", type=int, default=MAX_CHARS, help="longest text (default: a 4,096-token turn)")
    ap.add_argument("--episode-every", type=int, default=1, help="run every k-th text as a whole episode too")
    ap.add_argument("--max-new-tokens", type=int, default=4096, help="episodes' turn limit")
    ap.add_argument(
        "--hang-s",
        type=float,
        default=None,
        help="an input slower than this is a hang (default 1 s; 10 s with --quick)",
    )
    ap.add_argument(
        "--warmup",
        type=int,
        default=50,
        help="texts run first and not counted (the tokenizer's and renderer's first calls)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 200 texts, 5 warm-up, every 4th an episode; a hang is 10 s (a loaded CI "
        "machine preempts for longer than 1 s)",
    )
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/fuzz[-quick].json)")
    args = ap.parse_args()
    if args.quick:
        args.n, args.warmup, args.episode_every = 200, 5, 4
    if args.hang_s is None:
        args.hang_s = 10.0 if args.quick else 1.0
    args.out = args.out or str(
        Path(__file__).resolve().parent / "results" / f"fuzz{'-quick' if args.quick else ''}.json"
    )

    signal.signal(signal.SIGALRM, _on_alarm)
    rng = random.Random(args.seed)
    stages = {s: Stage(s) for s in STAGES}
    loop = asyncio.new_event_loop()
    envs = {p: make_env(p) for p in ("hermes", "python_block")}
    tok = build_tokenizer()
    policy = ScriptedPolicy(tok, args.max_new_tokens)
    mgr = episode_manager(tok, policy)
    tmp = tempfile.TemporaryDirectory()
    out_jsonl = Path(tmp.name) / "episodes.jsonl"
    tune_gc()  # as `agentrl rollout` and `agentrl run` do; after setup, so what it built is frozen

    def env_step(text: str, k: int) -> None:
        loop.run_until_complete(check_env_step(envs["hermes" if k % 2 == 0 else "python_block"], text, seed=k))

    def sample(text: str) -> None:
        # engines sample tokens, so an episode's text is valid unicode: lone surrogates come only as
        # escapes. Tokenizing it is the fake engine's work, untimed.
        policy.start([valid_text(text)])
        out_jsonl.unlink(missing_ok=True)

    def episode(k: int) -> None:
        loop.run_until_complete(check_episode(mgr, k, out_jsonl))

    def one(k: int, counted: dict[str, Stage]) -> None:
        text = hostile_text(rng, rng.choice((args.max_chars, args.max_chars, args.max_chars // 4, 1024, 64)))
        counted["parser"].run(check_parsers, text, args.hang_s)
        counted["scorer"].run(check_scorers, text, args.hang_s)
        counted["env_step"].run(lambda t: env_step(t, k), text, args.hang_s)
        if k % args.episode_every == 0:
            counted["episode"].run(lambda t: episode(k), text, args.hang_s, setup=sample)

    warm = {s: Stage(s) for s in STAGES}
    for k in range(args.warmup):
        one(args.n + k, warm)  # seeds past the counted ones
    t_start = time.perf_counter()
    for k in range(args.n):
        one(k, stages)
        if (k + 1) % max(1, args.n // 10) == 0:
            print(f"  {k + 1:>7} texts  {time.perf_counter() - t_start:7.1f} s", flush=True)
    wall = time.perf_counter() - t_start
    warm_bad = sum(sum(st.bad.values()) for st in warm.values())
    for env in envs.values():
        env.close()
    loop.close()
    tmp.cleanup()

    rows = {s: st.summary() for s, st in stages.items()}
    print(f"\n{args.n} texts of up to {args.max_chars} chars (seed {args.seed}), {wall:.1f} s wall")
    print(
        "per-input CPU time without GC pauses (inputs/s = inputs per CPU second); 'gc max' is the longest GC "
        "pause inside one input, 'wall' the slowest wall time (preemption and GC included)"
    )
    print(
        f"{'stage':<9} {'inputs':>8} {'inputs/s':>9} {'crashes':>8} {'wrong':>6} {'hangs':>6} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'slowest ms':>10} {'its chars':>9} {'gc max':>7} {'wall ms':>8}  "
        f"slowest input starts"
    )
    for s, r in rows.items():
        print(
            f"{s:<9} {r['inputs']:>8} {r['inputs_per_s']:>9.0f} {r['crashes']:>8} {r['wrong']:>6} {r['hangs']:>6} "
            f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['slowest_ms']:>10.2f} {r['slowest_chars']:>9} "
            f"{r['gc_max_ms']:>7.1f} {r['slowest_wall_ms']:>8.1f}  {r['slowest_head'][:40]!r}"
        )
    bad = sum(r["crashes"] + r["wrong"] + r["hangs"] for r in rows.values()) + warm_bad
    if warm_bad:
        print(f"warm-up texts: {warm_bad} crashes + wrong outcomes + hangs (counted as failures)")
    for s, r in rows.items():
        for ex in r["examples"][:3]:
            print(f"  {s} {ex['kind']}: {ex['detail'][:200]} ({ex['chars']} chars: {ex['text'][:80]!r})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"args": vars(args), "wall_s": wall, "warmup_failures": warm_bad, "stages": rows}, indent=2)
    )
    print(f"{'PASS' if not bad else 'FAIL'}: {bad} crashes + wrong outcomes + hangs; wrote {out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
