"""EngineCounters: per-step increases of an engine's counters; {} for engines that keep none."""

from __future__ import annotations

from types import SimpleNamespace

from agentrl.engine.counters import EngineCounters
from agentrl.engine.fake import FakeEngine
from agentrl.engine.wrapper import EngineWrapper


def test_take_gives_increases_and_now_the_totals():
    eng = SimpleNamespace(stats={"steps": 3, "prefilled_tokens": 100, "label": "x", "flag": True})
    c = EngineCounters(eng)
    assert c.take() == {"steps": 3, "prefilled_tokens": 100}  # numbers only, from zero
    eng.stats.update(steps=7, prefilled_tokens=100, new=2)
    assert c.take() == {"steps": 4, "prefilled_tokens": 0, "new": 2}
    assert c.now() == {"steps": 7, "prefilled_tokens": 100, "new": 2}


def test_through_a_wrapper_and_without_counters():
    inner = SimpleNamespace(stats={"steps": 1})
    assert EngineCounters(EngineWrapper(inner)).take() == {"steps": 1}
    assert EngineCounters(FakeEngine(lambda prompt, params: [1])).take() == {}
