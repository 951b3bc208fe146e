"""The live progress display of ``agentrl run``: on a terminal, a rich bar with the headline numbers
of the last step (reward, solve rate and infrastructure-failure rate of the step's rollouts, the
last eval's solve and infrastructure-failure rates, tool use, staleness, loss) and notes (monitor
alerts) above it; off a terminal (a log file, CI, ``nohup``), one plain line per step and per eval
(:func:`step_line`, :func:`eval_line`) instead of the bar; with ``-q``, only the notes. Notes always
go to stderr. Owns nothing else.
"""

from __future__ import annotations

import sys
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


def _num(flat: dict[str, Any], key: str) -> float | None:
    v = flat.get(key)
    return float(v) if isinstance(v, (int, float)) else None


def _rate(flat: dict[str, Any], prefix: str) -> str:
    """``0.375 (12/32 solved, 0 infra)``: a solve rate with its denominator and failure count."""
    rate, n, infra = (_num(flat, f"{prefix}/{k}") for k in ("solve_rate", "episodes", "infra_failures"))
    if rate is None:
        return "-"
    if n is None:
        return f"{rate:.3f}"
    return f"{rate:.3f} ({round(rate * n)}/{int(n)} solved, {int(infra or 0)} infra)"


def step_line(step: int, total: int, flat: dict[str, Any]) -> str:
    """One training step as a log line: reward, solve rate with its counts, loss, the step's time
    and where it went (waiting for rollouts, the trainer, the weight sync), the resident memory."""
    parts = [f"step {step}/{total}"]
    reward = _num(flat, "rollout/reward_mean")
    if reward is not None:
        parts.append(f"reward {reward:.3f}")
    parts.append(f"solve {_rate(flat, 'rollout')}")
    tool, loss = _num(flat, "rollout/tool_use_rate"), _num(flat, "train/loss")
    if tool is not None:
        parts.append(f"tool use {tool:.2f}")
    if loss is not None:
        parts.append(f"loss {loss:.4g}")
    step_s = _num(flat, "time/step_s")
    if step_s is not None:
        split = [
            f"{label} {v:.1f}"
            for label, key in (("rollout wait", "time/wait_rollout_s"), ("train", "train/step_time_s"))
            if (v := _num(flat, key)) is not None
        ]
        sync = _num(flat, "time/weight_sync_s")
        if sync is not None:
            split.append(f"sync {sync:.1f}")
        parts.append(f"{step_s:.1f} s" + (f" ({', '.join(split)})" if split else ""))
    rss = _num(flat, "memory/rss_gb")
    if rss is not None:
        parts.append(f"rss {rss:.1f} GB")
    return "  ".join(parts)


def eval_line(step: int, flat: dict[str, Any]) -> str:
    """A held-out eval as a log line: its solve rate over every task, infrastructure failures beside."""
    tool = _num(flat, "eval/tool_use_rate")
    line = f"eval after step {step}: solve {_rate(flat, 'eval')}"
    return line + (f"  tool use {tool:.2f}" if tool is not None else "")


class RunDisplay:
    """The headline numbers of each step: a rich progress bar on a terminal, else a line per step."""

    def __init__(self, enabled: bool, total: int, start: int = 0, *, terminal: bool | None = None) -> None:
        self.enabled = enabled
        self.total = total
        self.last_eval: dict[str, Any] = {}
        self.last_step: dict[str, Any] = {}
        self.lines = enabled and not (sys.stderr.isatty() if terminal is None else terminal)
        if not enabled or self.lines:
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
        if self.lines:
            if any(k.startswith("rollout/") for k in flat):
                self._print(step_line(step, self.total, flat))
            if any(k.startswith("eval/") for k in flat):
                self._print(eval_line(step, flat))
            return
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
        if self.enabled and not self.lines:
            self.bar.console.print(message, soft_wrap=True)  # one line: greppable in logs
        else:
            self._print(message)

    @staticmethod
    def _print(line: str) -> None:
        from rich.console import Console

        Console(stderr=True).print(line, soft_wrap=True, highlight=False)

    def close(self) -> None:
        if self.enabled and not self.lines:
            self.bar.stop()
