"""Per-step increases of an engine's own counters, for a run's step metrics and a rollout's summary.

Owns :class:`EngineCounters`: reads ``engine.stats`` (the local engine's counters: decode ``steps``,
``prefills``, ``generated_tokens``, ``prefilled_tokens``, and the prefix cache's ``prefix_*``) and
hands out how much each grew since the last :meth:`EngineCounters.take`. An engine without such a
dict (SGLang, the fake) gives ``{}``: their numbers live on their servers.

Does not reset or own the counters (the engine does) or decide what is shown (``agentrl.observe``).
"""

from __future__ import annotations

from typing import Any


class EngineCounters:
    """``take()`` -> ``{name: increase}`` of the numeric entries of ``engine.stats`` since the last call."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._last: dict[str, float] = {}

    def now(self) -> dict[str, float]:
        """The engine's counters as they are (``{}`` when it keeps none)."""
        stats = getattr(self.engine, "stats", None)
        if not isinstance(stats, dict):
            return {}
        return {k: v for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}

    def take(self) -> dict[str, float]:
        now = self.now()
        step = {k: v - self._last.get(k, 0) for k, v in now.items()}
        self._last = now
        return step
