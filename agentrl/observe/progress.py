"""The live progress display of ``agentrl run``: a rich bar with the headline numbers of the last
step (reward, solve rate and infrastructure-failure rate of the step's rollouts, the last eval's
solve and infrastructure-failure rates, tool use, staleness, loss) and notes (monitor alerts) above
it. Disabled (``-q``, or no terminal), only the notes are printed (to stderr). Owns nothing else.
"""

from __future__ import annotations

from typing import Any

# (metric, label): each solve rate with the infrastructure-failure rate of the same episodes beside it
STATUS = (
    ("rollout/reward_mean", "reward"),
    ("rollout/solve_rate", "solve"),
    ("rollout/infra_failure_rate", "infra"),
    ("eval/solve_rate", "eval"),
    ("eval/infra_failure_rate", "eval_infra"),
    ("rollout/tool_use_rate", "tool"),
    ("staleness/staleness_mean", "stale"),
    ("train/loss", "loss"),
)


class RunDisplay:
    """A rich progress bar with the headline numbers of the last step."""

    def __init__(self, enabled: bool, total: int, start: int = 0) -> None:
        self.enabled = enabled
        self.last_eval: dict[str, Any] = {}
        self.last_step: dict[str, Any] = {}
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.bar = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
        )
        self.bar.start()
        self.task = self.bar.add_task("train", total=total, completed=start, status="")

    def update(self, step: int, flat: dict[str, Any]) -> None:
        if not self.enabled:
            return
        # the eval runs every eval.every steps (and in rows of its own at the start and the end): each
        # part stays on the line until its next row
        self.last_eval.update({k: v for k, v in flat.items() if k.startswith("eval/")})
        if any(k.startswith("rollout/") for k in flat):
            self.last_step = flat
        shown = {**self.last_step, **self.last_eval}
        parts = []
        for key, label in STATUS:
            if key in shown and isinstance(shown[key], (int, float)):
                parts.append(f"{label}={shown[key]:.3g}")
        self.bar.update(self.task, completed=step, status=" ".join(parts))

    def note(self, message: str) -> None:
        """A line above the bar; without a bar (``-q``, not a terminal) still printed, to stderr:
        notes are what a run must tell (the sandbox's isolation, alerts, a stop)."""
        if self.enabled:
            self.bar.console.print(message, soft_wrap=True)  # one line: greppable in logs
        else:
            from rich.console import Console

            Console(stderr=True).print(message, soft_wrap=True)

    def close(self) -> None:
        if self.enabled:
            self.bar.stop()
