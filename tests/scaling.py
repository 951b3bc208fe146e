"""Cost ratios measured side by side, for tests that guard complexity on a shared, loaded machine.

A wall-time bound ("under 2 s") fails when the machine is busy and passes a quadratic bug on a fast
one. A ratio of two costs measured in the same test (the input at size 10n against size n) does
neither: a linear path gives ~10, a quadratic one ~100, whatever the machine's speed. Each side is
timed as the minimum over interleaved repeats (a load spike inflates one sample, not the minimum),
each sample long enough (``MIN_SAMPLE_S``) for the clock's resolution not to matter.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

MIN_SAMPLE_S = 0.005  # a sample repeats the call until it takes at least this long


def _sample(fn: Callable[[], object], number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def cost_ratio(big: Callable[[], object], small: Callable[[], object], *, repeats: int = 5) -> float:
    """min-over-``repeats`` time per call of ``big()`` / that of ``small()``, sampled alternately."""
    numbers = []
    for fn in (big, small):
        once = _sample(fn, 1)  # also warms caches (compiled regexes, imports)
        numbers.append(max(1, math.ceil(MIN_SAMPLE_S / max(once, 1e-9))))
    costs: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for side, (fn, number) in enumerate(zip((big, small), numbers)):
            costs[side].append(_sample(fn, number))
    return min(costs[0]) / min(costs[1])
