"""Stop a run that cannot work: every episode of its first evaluation (or first training step) ended
with the same infrastructure outcome (a model directory the engine cannot serve, a dead sandbox, a
broken env). Such a run would otherwise train on nothing, write checkpoints and exit 0.

Owns :func:`stop_if_all_failed`. Does not: judge partial failure rates (``agentrl.observe.monitors`` alerts on
those, ``monitor.pause_on`` can pause on them), nor decide when it is called (``agentrl.jobs.run``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from agentrl.errors import InfraFailureError
from agentrl.trajectory import Outcome, Trajectory

#: Fewer episodes than this prove nothing: one unlucky tool timeout must not stop a run.
MIN_EPISODES = 4


def stop_if_all_failed(trajs: Iterable[Trajectory], what: str) -> None:
    """InfraFailureError naming the outcome and an example detail if every one of ``trajs`` (at
    least ``MIN_EPISODES``) ended with one and the same infrastructure outcome."""
    trajs = list(trajs)
    outcomes = Counter(Outcome(t.outcome) for t in trajs)
    if len(trajs) < MIN_EPISODES or len(outcomes) != 1:
        return
    (outcome,) = outcomes
    if outcome.trainable:
        return
    detail = next((t.outcome_detail for t in trajs if t.outcome_detail), "")
    example = " ".join(detail.split())[:200] or "no detail recorded"
    raise InfraFailureError(
        f"every one of the {len(trajs)} episodes of {what} ended {outcome.value} "
        f"(e.g. {example!r}): stopping instead of training on nothing"
    )
