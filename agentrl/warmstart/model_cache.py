"""Building a cached model directory once, for the built-in models.

Re-exports ``cached(dest, build)``, ``lock`` and ``say`` from ``agentrl.common.cache_entry`` (concurrent
runs never see half a model and never build it twice; a failed build leaves nothing behind) and owns
``sft_progress`` (an SFT build's step and loss, said every so many steps). Used by the built-in models
(``agentrl.warmstart.default_model``, ``textworld_model``, ``textworld_practice``); does not decide
where entries live or what goes in them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from agentrl.common.cache_entry import cached, lock, say

__all__ = ["cached", "lock", "say", "sft_progress"]


def sft_progress(label: str, steps: int, every: int = 100) -> Callable[[int, dict], None]:
    """A ``run_sft`` ``log`` callback for a long first-use build: says ``label``, the step, the loss and
    the seconds since it was made, every ``every`` steps and at the last."""
    t0 = time.perf_counter()

    def progress(step: int, metrics: dict) -> None:
        if step % every == 0 or step == steps:
            say(f"{label}, step {step}/{steps}, loss {metrics['loss']:.3f}, {time.perf_counter() - t0:.0f} s")

    return progress
