"""Cost ratios measured side by side, for tests that guard complexity on a shared, loaded machine.

A wall-time bound ("under 2 s") fails when the machine is busy and passes a quadratic bug on a fast
one. A ratio of two costs measured in the same test (the input at size 10n against size n) does
neither: a linear path gives ~10, a quadratic one ~100, whatever the machine's speed. Each side is
timed in this thread's CPU time (``time.thread_time``: other processes' load is not counted; a
descheduled thread's clock stops) as the minimum over interleaved repeats, each sample as long as
the other side's (so both meet the same cache and frequency effects) and at least ``MIN_SAMPLE_S``
for the clock's resolution not to matter.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

MIN_SAMPLE_S = 0.005  # a sample repeats the call until it takes at least this long


def _sample(fn: Callable[[], object], number: int) -> float:
    t0 = time.thread_time()
    for _ in range(number):
        fn()
    return (time.thread_time() - t0) / number


def cost_ratio(big: Callable[[], object], small: Callable[[], object], *, repeats: int = 7) -> float:
    """min-over-``repeats`` CPU time per call of ``big()`` / that of ``small()``, sampled alternately."""
    once = [_sample(fn, 1) for fn in (big, small)]  # also warms caches (compiled regexes, imports)
    length = max(MIN_SAMPLE_S, *once)
    numbers = [max(1, math.ceil(length / max(t, 1e-9))) for t in once]
    costs: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for side, (fn, number) in enumerate(zip((big, small), numbers)):
            costs[side].append(_sample(fn, number))
    return min(costs[0]) / min(costs[1])
