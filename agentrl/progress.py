"""The live progress display of ``agentrl run``: a rich bar with the headline numbers of the last
step (reward, eval solve rate, tool use, staleness, loss) and notes (monitor alerts) above it.
Disabled (``-q``), every method is a no-op. Owns nothing else.
"""
from __future__ import annotations

from typing import Any


class RunDisplay:
    """A rich progress bar with the headline numbers of the last step."""

    def __init__(self, enabled: bool, total: int, start: int = 0) -> None:
        self.enabled = enabled
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("{task.fields[status]}"))
        self.bar.start()
        self.task = self.bar.add_task("train", total=total, completed=start, status="")

    def update(self, step: int, flat: dict[str, Any]) -> None:
        if not self.enabled:
            return
        parts = []
        for key, label in (("rollout/reward_mean", "reward"), ("eval/solve_rate", "eval"),
                           ("rollout/tool_use_rate", "tool"), ("staleness/staleness_mean", "stale"),
                           ("train/loss", "loss")):
            if key in flat and isinstance(flat[key], (int, float)):
                parts.append(f"{label}={flat[key]:.3f}")
        self.bar.update(self.task, completed=step, status=" ".join(parts))

    def note(self, message: str) -> None:
        if self.enabled:
            self.bar.console.print(message)

    def close(self) -> None:
        if self.enabled:
            self.bar.stop()
