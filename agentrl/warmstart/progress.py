"""What a long SFT says while it trains, where no progress bar can be drawn: one line every so often.

Owns :func:`sft_progress`, a ``run_sft`` ``log(step, metrics)`` callback that says the step, the mean
loss and the trained tokens per second since its last line, and the time since it was made: every
``every`` steps, at the first and the last, and (``min_interval_s``) whenever that long has passed
since the last line, so a slow step rate never leaves a log silent. ``agentrl sft`` uses it when
stderr is not a terminal; the built-in models' first-use builds always (``agentrl.warmstart.model_cache``).
Does not draw the terminal's progress bar (``agentrl.cli.sft``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from agentrl.common.cache_entry import say


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def sft_progress(
    label: str,
    steps: int,
    every: int = 100,
    *,
    min_interval_s: float | None = None,
    out: Callable[[str], None] = say,
    clock: Callable[[], float] = time.perf_counter,
) -> Callable[[int, dict], None]:
    """A ``run_sft`` ``log`` callback writing ``out(line)`` (see the module docstring). A step's
    ``tokens`` (from the trainer's metrics) are the tokens it trained on, prompt included: the
    forward and backward passes cost the same per token whatever the loss mask."""
    t0 = clock()
    last = {"t": t0, "tokens": 0, "losses": []}

    def progress(step: int, metrics: dict) -> None:
        now = clock()
        last["tokens"] += int(metrics.get("tokens", 0))
        last["losses"].append(float(metrics["loss"]))
        due = step == 1 or step % max(1, every) == 0 or step == steps
        if not due and not (min_interval_s is not None and now - last["t"] >= min_interval_s):
            return
        losses = last["losses"]
        rate = last["tokens"] / max(now - last["t"], 1e-9)
        out(
            f"{label}, step {step}/{steps}, loss {sum(losses) / len(losses):.3f}, "
            f"{rate:.0f} trained tokens/s, {_clock(now - t0)} elapsed"
        )
        last.update(t=now, tokens=0, losses=[])

    return progress
