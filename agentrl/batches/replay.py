"""``train.replay``: train on the batches another run recorded instead of generating new ones.

Owns reading a recorded run — ``ledger.jsonl`` (which groups each step trained, in order) and
``trajectories/step_N.jsonl`` (every trajectory of step N; the run must have logged with
``logging.trajectories_per_step=-1``) — back into step N's batch: the same groups, in the same
order, each group's samples in sample order. Trajectories round-trip JSON exactly, so the trainer
sees what it saw then: a replayed run reproduces the recorded run's parameters bitwise (same
trainer config, threads and start model), which is how the crash tests check that a resume is
exact. Checked up front: a clear ConfigError names what is missing.

Does not: generate, compute advantages (the runner does, from these groups) or check staleness.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import yaml

from agentrl.batches.ledger import read_ledger
from agentrl.errors import ConfigError
from agentrl.trajectory import Trajectory, read_jsonl


class ReplaySource:
    """Step N's recorded batch: ``batch(N) -> (groups, positions)``."""

    def __init__(self, run_dir: str | Path, steps: int) -> None:
        self.dir = Path(run_dir)
        cfg_file = self.dir / "config.yaml"
        if not cfg_file.exists():
            raise ConfigError(f"train.replay: {str(self.dir)!r} is not a run directory (no config.yaml)")
        logged = (yaml.safe_load(cfg_file.read_text()) or {}).get("logging", {}).get("trajectories_per_step")
        if logged != -1:
            raise ConfigError(
                f"train.replay: {str(self.dir)!r} logged trajectories_per_step={logged!r}; "
                f"replay needs every trajectory (-1)"
            )
        self.steps = {int(r["step"]): r for r in read_ledger(self.dir)}
        missing = [n for n in range(1, steps + 1) if n not in self.steps or not self._file(n).exists()]
        if missing:
            raise ConfigError(
                f"train.replay: {str(self.dir)!r} has no recorded batch for step(s) "
                f"{missing[:5]}{' ...' if len(missing) > 5 else ''} (train.steps={steps})"
            )

    def _file(self, step: int) -> Path:
        return self.dir / "trajectories" / f"step_{step:06d}.jsonl"

    def batch(self, step: int) -> tuple[list[list[Trajectory]], list[int]]:
        row = self.steps[step]
        by_group: dict[str, list[Trajectory]] = defaultdict(list)
        for t in read_jsonl(self._file(step)):
            by_group[t.group_id].append(t)
        groups = [sorted(by_group[g], key=lambda t: t.sample_index) for g in row["group_ids"]]
        empty = [g for g, grp in zip(row["group_ids"], groups) if not grp]
        if empty:
            raise ConfigError(f"train.replay: {self._file(step)} has no trajectories of group(s) {empty}")
        return groups, [int(p) for p in row["positions"]]
