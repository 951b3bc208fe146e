"""The run's ledger: which prompt groups each optimizer step trained, and rewinding a run's logs to a
checkpoint.

Owns ``RUN/ledger.jsonl`` — one line per finished step, ``{"step", "version", "positions",
"group_ids"}`` in the order the step trained them (``train.replay`` uses that order), plus
``"filtered"``: the positions dynamic sampling drew for the step and dropped for want of signal
(consumed, never trained, never run again; absent when none) — and
``rewind(run_dir, step)``, which a resume calls first: ledger lines and ``metrics.jsonl`` rows
after the checkpoint's step are dropped (temp file + rename) and ``trajectories/step_N.jsonl``
files after it deleted, since that work is redone from the checkpoint; the final ledger then says
exactly what the final weights were trained on. A torn last line (a kill mid-write) is ignored.
TensorBoard event files cannot be rewound: after a resume they hold both attempts of the redone steps.

Does not decide what is trained (``agentrl.jobs.run``) or hand out positions (``agentrl.batches.prompt_stream``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LEDGER = "ledger.jsonl"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a kill mid-write
    return rows


def read_ledger(run_dir: str | Path) -> list[dict[str, Any]]:
    return _read_jsonl(Path(run_dir) / LEDGER)


class Ledger:
    """Appends one line per trained step (flushed at once)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LEDGER

    def append(
        self, step: int, version: int, positions: Sequence[int], group_ids: Sequence[str], filtered: Sequence[int] = ()
    ) -> None:
        row = {
            "step": int(step),
            "version": int(version),
            "positions": [int(p) for p in positions],
            "group_ids": list(group_ids),
            **({"filtered": [int(p) for p in filtered]} if filtered else {}),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def _keep_until(path: Path, step: int) -> None:
    if not path.exists():
        return
    rows = [r for r in _read_jsonl(path) if int(r.get("step", 0)) <= step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)


def rewind(run_dir: str | Path, step: int) -> None:
    """Forget what the run logged after ``step`` (the checkpoint a resume starts from)."""
    run_dir = Path(run_dir)
    _keep_until(run_dir / LEDGER, step)
    _keep_until(run_dir / "metrics.jsonl", step)
    for f in (run_dir / "trajectories").glob("step_*.jsonl"):
        n = f.name[5:-6]
        if n.isdigit() and int(n) > step:
            f.unlink()
