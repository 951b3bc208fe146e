"""Where a test run's time went: ``python tools/suite_time.py FILE`` on the JSON a run writes when
``AGENTRL_SUITE_TIMES=FILE`` is set (tests/conftest.py). Prints the wall time, each worker's busy time, the totals
per test folder and per tier marker, and the slowest tests (all phases of a test summed: a session fixture's
set-up, such as an SGLang server start, is counted in the first test that asks for it)."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def summarize(data: dict, top: int = 30) -> str:
    phases = data["phases"]
    per_test: dict[str, float] = defaultdict(float)
    marks: dict[str, list[str]] = {}
    outcome: dict[str, str] = {}
    workers: dict[str, float] = defaultdict(float)
    for p in phases:
        per_test[p["test"]] += p["s"]
        marks[p["test"]] = p["marks"]
        workers[p["worker"]] += p["s"]
        if p["when"] == "call" or p["outcome"] != "passed":
            outcome[p["test"]] = p["outcome"] if p["outcome"] != "passed" or p["test"] not in outcome else "passed"
    busy = sum(per_test.values())
    lines = [
        f"wall {data['wall_s'] / 60:.1f} min; test time {busy / 60:.1f} min over {len(per_test)} tests; "
        + ", ".join(f"{w} busy {s / 60:.1f} min" for w, s in sorted(workers.items()))
    ]

    def table(title: str, groups: dict[str, list[str]]) -> None:
        lines.append("")
        lines.append(f"{title:<28} {'tests':>6} {'min':>7} {'share':>6}")
        for name, tests in sorted(groups.items(), key=lambda kv: -sum(per_test[t] for t in kv[1])):
            s = sum(per_test[t] for t in tests)
            lines.append(f"{name:<28} {len(tests):>6} {s / 60:>7.1f} {s / busy:>6.0%}")

    folders: dict[str, list[str]] = defaultdict(list)
    tiers: dict[str, list[str]] = defaultdict(list)
    for t in per_test:
        path = t.split("::")[0]
        folders["/".join(path.split("/")[:2]) if path.count("/") > 1 else path].append(t)
        tiers["+".join(marks[t]) or "(unmarked)"].append(t)
    table("folder", folders)
    table("tier markers", tiers)
    lines.append("")
    lines.append(f"{'slowest tests':<100} {'s':>6}  marks")
    for t, s in sorted(per_test.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{t[:100]:<100} {s:>6.0f}  {','.join(marks[t])}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--top", type=int, default=30, help="how many of the slowest tests to list")
    args = ap.parse_args()
    print(summarize(json.loads(args.file.read_text()), args.top))


if __name__ == "__main__":
    main()
