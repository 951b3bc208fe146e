"""Crash test at full count (issue 6): ``agentrl run`` SIGKILLed 20 times, resumed each time.

Two runs on the small crash-test config (``agentrl.jobs.crash_harness.small_run_cmd``: tiny model,
``concise``, 3 groups x 4 samples per step, a checkpoint every step):

1. live rollouts at ``train.max_staleness=2``: after the last resume, the ledger must show every
   prompt position trained by exactly one surviving step or still outstanding (no prompt lost or
   trained twice);
2. replayed rollouts (``train.replay`` of an uninterrupted recorded run): the killed run's final
   parameters and optimizer state must equal the uninterrupted replay's bitwise.

Kills alternate between a random step and the inside of a checkpoint write
(``AGENTRL_FAULT_KILL=checkpoint_write:N``). Prints each kill and the checks; exits 1 if a check
fails. ``tests/jobs/test_resume.py`` runs the same with 4 kills in CI.

    python bench/bench_faults.py [--kills 20] [--seed 0] [--keep DIR] [--out results.json]
    python bench/bench_faults.py --quick     # smoke run: 1 kill per run (~1-2 min: 6 `agentrl run` starts)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentrl.batches.ledger import read_ledger
from agentrl.jobs.crash_harness import (
    final_checkpoint,
    ledger_check,
    run_with_kills,
    same_weights,
    small_run_cmd,
)
from agentrl.warmstart.tiny_model import build_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", help="run directories go here (default: a temp dir, removed)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 kill per run (same checks)")
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/faults[-quick].json)")
    args = ap.parse_args()
    if args.quick:
        args.kills = 1
    out = Path(args.out or Path(__file__).resolve().parent / "results" / f"faults{'-quick' if args.quick else ''}.json")
    root_ctx = tempfile.TemporaryDirectory() if not args.keep else None
    root = Path(args.keep or root_ctx.name)
    root.mkdir(parents=True, exist_ok=True)
    model = build_model(root / "model")
    steps = 3 * args.kills + 4
    ok = True

    live = root / "live"
    res = run_with_kills(
        small_run_cmd(model, live, steps, "train.max_staleness=2"), live, kills=args.kills, seed=args.seed
    )
    chk = ledger_check(live)
    _show("live, staleness 2", res)
    good = chk["steps"] == list(range(1, steps + 1)) and not chk["duplicates"] and not chk["lost"]
    ok &= good
    print(
        f"  ledger: {len(chk['steps'])} steps, {chk['trained']} groups trained, {chk['outstanding']} outstanding, "
        f"positions < {chk['next']}: duplicates {chk['duplicates']} lost {chk['lost']} -> {'OK' if good else 'FAIL'}"
    )

    rec, ref, killed = root / "recorded", root / "replay_ref", root / "replay_killed"
    t0 = time.monotonic()
    subprocess.run(small_run_cmd(model, rec, steps, "train.max_staleness=1"), check=True, capture_output=True)
    subprocess.run(small_run_cmd(model, ref, steps, f"train.replay={rec}"), check=True, capture_output=True)
    print(f"recorded + uninterrupted replay: {time.monotonic() - t0:.1f} s")
    res2 = run_with_kills(
        small_run_cmd(model, killed, steps, f"train.replay={rec}"), killed, kills=args.kills, seed=args.seed + 1
    )
    _show("replayed", res2)
    diff = same_weights(final_checkpoint(ref), final_checkpoint(killed))
    diff_rec = same_weights(final_checkpoint(rec), final_checkpoint(ref))
    same_ledger = read_ledger(killed) == read_ledger(rec)
    ok &= not diff and not diff_rec and same_ledger
    print(f"  killed replay vs uninterrupted replay: {len(diff)} tensors differ {diff[:5]}")
    print(f"  uninterrupted replay vs the recorded live run: {len(diff_rec)} tensors differ {diff_rec[:5]}")
    print(f"  ledgers equal: {same_ledger}")
    print(table(res, res2, good, not diff and not diff_rec and same_ledger))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"live": res, "ledger": chk, "replay": res2, "diff": diff, "diff_recorded": diff_rec}, indent=1, default=str
        )
    )
    print(f"{'PASS' if ok else 'FAIL'} ({out})")
    if root_ctx:
        root_ctx.cleanup()
    return 0 if ok else 1


def table(live: dict, replay: dict, live_ok: bool, replay_ok: bool) -> str:
    """One row per run: kills by kind, attempts, wall time, and whether its exactly-once check held."""
    lines = [f"{'run':<20} {'kills':>5} {'at step':>7} {'in ckpt':>7} {'attempts':>8} {'wall s':>7}  check"]
    for name, res, ok, check in (
        ("live, staleness 2", live, live_ok, "ledger: each prompt trained once"),
        ("replayed", replay, replay_ok, "weights + ledger = uninterrupted"),
    ):
        kinds = [k["at"] for k in res["kills"]]
        lines.append(
            f"{name:<20} {len(kinds):>5} {kinds.count('step'):>7} {kinds.count('checkpoint_write'):>7} "
            f"{res['attempts']:>8} {res['wall_s']:>7.1f}  {check}: {'OK' if ok else 'FAIL'}"
        )
    return "\n".join(lines)


def _show(name: str, res: dict) -> None:
    kinds = [k["at"] for k in res["kills"]]
    print(
        f"{name}: {len(kinds)} kills ({kinds.count('step')} at a step, {kinds.count('checkpoint_write')} inside a "
        f"checkpoint write), {res['attempts']} attempts, {res['wall_s']:.1f} s"
    )
    for k in res["kills"]:
        where = f"step >= {k['target']} +{k['delay_s']} s" if k["at"] == "step" else f"checkpoint write #{k['n']}"
        ckpt = f"checkpoint {k['checkpoint_before']} -> {k['checkpoint_after']}"
        print(f"  attempt {k['attempt']}: killed at {where}; {ckpt}")


if __name__ == "__main__":
    sys.exit(main())
