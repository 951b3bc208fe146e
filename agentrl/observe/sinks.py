"""Metrics sinks: where the run loop's per-step metrics go.

Owns the ``MetricsSink`` seam (``write(step, metrics)`` / ``close()``) and its implementations:
JSONL (always; the source of truth for reports), TensorBoard (when the ``tensorboard`` package is
importable) and Weights & Biases (only when installed *and* asked for). ``MemorySink`` is the fake
for tests. Nested dicts are flattened to ``a/b`` keys; non-numeric values go to JSONL only.
Does not decide what to log.
"""

from __future__ import annotations

import abc
import json
import math
from pathlib import Path
from typing import Any


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def _scalars(metrics: dict) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in flatten(metrics).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    }


class MetricsSink(abc.ABC):
    @abc.abstractmethod
    def write(self, step: int, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None:
        pass


class JsonlSink(MetricsSink):
    """One JSON object per line, flushed every write (a crash loses nothing written)."""

    def __init__(self, path: str | Path, append: bool = False) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "a" if append else "w", encoding="utf-8")

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self._fh.write(json.dumps({"step": step, **metrics}, default=str) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class TensorBoardSink(MetricsSink):
    """``purge_step``: a resumed run's first step; TensorBoard hides what earlier event files logged
    at that step or later (the steps the interrupted run did after its checkpoint)."""

    def __init__(self, logdir: str | Path, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._w = SummaryWriter(str(logdir), purge_step=purge_step)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        for k, v in _scalars(metrics).items():
            self._w.add_scalar(k, v, step)
        self._w.flush()

    def close(self) -> None:
        self._w.close()


class WandbSink(MetricsSink):
    def __init__(self, project: str, config: dict, run_dir: str | Path) -> None:
        import wandb  # pyright: ignore[reportMissingImports]  not a dependency: only when asked for (error names it)

        self._run = wandb.init(project=project, config=config, dir=str(run_dir))

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self._run.log(_scalars(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class MemorySink(MetricsSink):
    """Fake sink for tests: keeps every write."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict]] = []

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self.rows.append((step, metrics))


class MultiSink(MetricsSink):
    def __init__(self, sinks: list[MetricsSink]) -> None:
        self.sinks = sinks

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        for s in self.sinks:
            s.write(step, metrics)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def make_sinks(
    run_dir: Path, *, tensorboard: bool, wandb_project: str | None, config: dict, resume_step: int | None = None
) -> tuple[MultiSink, list[str]]:
    """JSONL always; TensorBoard/W&B as asked. Returns the sink and warnings to show the user.
    ``resume_step``: the checkpoint's step when resuming (JSONL appends, TensorBoard purges the
    steps after it)."""
    sinks: list[MetricsSink] = [JsonlSink(run_dir / "metrics.jsonl", append=resume_step is not None)]
    warnings = []
    if tensorboard:
        try:
            sinks.append(
                TensorBoardSink(run_dir / "tensorboard", purge_step=None if resume_step is None else resume_step + 1)
            )
        except ImportError:
            warnings.append("tensorboard is not installed: `pip install tensorboard` to get TensorBoard logs")
    if wandb_project:
        try:
            sinks.append(WandbSink(wandb_project, config, run_dir))
        except ImportError:
            warnings.append("wandb is not installed: `pip install wandb` to log to Weights & Biases")
    return MultiSink(sinks), warnings
