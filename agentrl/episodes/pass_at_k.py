"""pass@k and avg@n over tasks attempted n times each: the unbiased estimator of Chen et al. (2021).

Owns :func:`pass_at_k` (one task: n attempts, c of them solved) and :func:`pass_at_k_rates` (the
mean over tasks for every k from 1 to n, and avg@n). A task's pass@k is the chance that at least one
of k attempts drawn without replacement from its n is solved: ``1 - C(n-c, k) / C(n, k)``, computed
as the product ``prod_{i=n-c+1..n} (1 - k/i)`` so no binomial coefficient is ever formed (C(200, 100)
is past a float's range; the product of c factors in [0, 1] is not).

Does not decide what "solved" means (``agentrl.episodes.summary.is_solved`` does: an attempt that
ended with an infrastructure outcome is an unsolved one, so it counts in n and not in c).
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task with ``c`` solved out of ``n`` attempts (ValueError if not
    ``0 <= c <= n`` and ``1 <= k <= n``)."""
    for name, v in (("n", n), ("c", c), ("k", k)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"pass@k: {name} must be an int, got {v!r}")
    if n < 1:
        raise ValueError(f"pass@k needs at least one attempt, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k: solved attempts c={c} must be within 0..n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n (attempts): k={k} with n={n} cannot be estimated")
    if n - c < k:  # every draw of k holds a solved attempt
        return 1.0
    miss = 1.0  # C(n-c, k) / C(n, k) = prod_{i=n-c+1..n} (1 - k/i)
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def pass_at_k_rates(solved: Sequence[int], n: int) -> dict[str, float]:
    """``pass@1`` .. ``pass@n`` averaged over tasks, each task attempted ``n`` times and solved in
    ``solved[t]`` of them, and ``avg@n`` (solved attempts / all attempts). 0.0 for no tasks."""
    out: dict[str, float] = {}
    for k in range(1, n + 1):
        out[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in solved) / len(solved) if solved else 0.0
    out[f"avg@{n}"] = sum(solved) / (n * len(solved)) if solved else 0.0
    return out
