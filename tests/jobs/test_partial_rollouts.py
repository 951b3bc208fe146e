"""Partial rollouts vs drained weight updates (rollout.partial_rollouts), and mixed_version_turns.

Unit tests drive DrainEngine over ``TickingFakeEngine``, a fake defined here (it samples one token
per tick and stamps each with the version current at that tick, as the real engines do); the real
LocalEngine tests show the same on the tiny model: an update mid-generation yields turns that span
two versions, and through the drain wrapper none does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from agentrl.config.schema import RolloutConfig, load_config
from agentrl.engine.base import Engine, Generation, SamplingParams
from agentrl.engine.fake import FakeEngine
from agentrl.errors import EngineError
from agentrl.observe.run_log import rollout_extra, turn_versions
from agentrl.trajectory import Outcome, Trajectory, TurnRecord
from agentrl.weights.drain import (
    DrainEngine,
    drained_together,
    weight_update_gate,
    with_partial_rollouts,
)

pytestmark = pytest.mark.timeout(120)

NO_STOP = (10**9,)  # an id no model samples: generations run to max_new_tokens


class TickingFakeEngine(Engine):
    """FAKE engine for unit tests: ``max_new_tokens`` tokens, one per ``tick_s``, each stamped with
    the version current when it is sampled. ``update_weights`` takes effect at once, between two
    ticks (like LocalEngine), so an update interrupts generations in flight. Logs events in order."""

    def __init__(self, tick_s: float = 0.005, fail_on: int | None = None) -> None:
        self.tick_s = tick_s
        self.fail_on = fail_on  # a prompt whose first id is this raises EngineError
        self.version = 0
        self.events: list[tuple[str, Any]] = []
        self.running = 0
        self.closed = False
        self.only_here = "forwarded"  # not part of the Engine seam: the wrapper must forward it

    @property
    def policy_version(self) -> int:  # type: ignore[override]
        return self.version

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, session: str | None = None
    ) -> Generation:
        if self.closed:
            raise EngineError("fake engine closed")
        self.running += 1
        self.events.append(("start", session))
        try:
            toks, versions = [], []
            for i in range(params.max_new_tokens):
                await asyncio.sleep(self.tick_s)
                if prompt_ids and prompt_ids[0] == self.fail_on:
                    raise EngineError(f"fake failure on session {session}")
                toks.append(i)
                versions.append(self.version)
            self.events.append(("done", session))
            return Generation(toks, [-0.5] * len(toks), "length", versions)
        finally:
            self.running -= 1

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        self.events.append(("update", self.running))  # generations in flight when the swap happened
        self.version = version

    async def close(self) -> None:
        self.closed = True


def sp(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, stop_token_ids=NO_STOP)


async def until(cond, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


# --- unit: the drain gate over a fake ----------------------------------------------------------


async def test_fake_without_drain_spans_versions():
    """Control (partial rollouts): the fake really interrupts, so the drain tests below can fail."""
    eng = with_partial_rollouts(TickingFakeEngine(), partial_rollouts=True)
    assert type(eng) is TickingFakeEngine
    tasks = [asyncio.create_task(eng.generate([1], sp(40), session=f"s{i}")) for i in range(3)]
    await until(lambda: eng.running == 3)
    await asyncio.sleep(0.02)
    async with weight_update_gate(eng) as waited:  # nothing to wait for: a no-op
        assert waited == 0.0
        await eng.update_weights({}, 1)
    gens = await asyncio.gather(*tasks)
    assert all(set(g.versions) == {0, 1} for g in gens)
    assert ("update", 3) in eng.events


async def test_drain_waits_for_in_flight_and_holds_new_calls():
    inner = TickingFakeEngine()
    eng = with_partial_rollouts(inner, partial_rollouts=False)
    assert isinstance(eng, DrainEngine) and eng.inner is inner
    first = [asyncio.create_task(eng.generate([1], sp(n), session=f"old{n}")) for n in (20, 40, 60)]
    await until(lambda: inner.running == 3)
    assert eng.in_flight == 3

    async def update() -> None:
        async with weight_update_gate(eng) as waited:
            assert waited > 0 and inner.running == 0 and eng.in_flight == 0  # every generation in flight finished
            await eng.update_weights({}, 1)

    upd = asyncio.create_task(update())
    await asyncio.sleep(0.01)
    late = [asyncio.create_task(eng.generate([2], sp(10), session=f"new{i}")) for i in range(2)]
    await until(lambda: eng.held == 2)
    assert not upd.done()
    gens = await asyncio.gather(*first)
    await upd
    late_gens = await asyncio.gather(*late)
    kinds = [e[0] for e in inner.events]
    # the swap came after the three in-flight generations finished and before the held ones started
    assert kinds.index("update") == 6 and inner.events[6] == ("update", 0)
    assert [e[1] for e in inner.events[:6] if e[0] == "start"] == ["old20", "old40", "old60"]
    assert {e[1] for e in inner.events[7:] if e[0] == "start"} == {"new0", "new1"}
    assert all(set(g.versions) == {0} for g in gens)
    assert all(set(g.versions) == {1} for g in late_gens)
    assert eng.held == 0 and eng.in_flight == 0
    s = eng.drain_stats
    assert s["drains"] == 1 and s["held_calls"] == 2 and s["last_drain_wait_s"] > 0


async def test_update_weights_outside_the_gate_drains_itself():
    inner = TickingFakeEngine()
    eng = DrainEngine(inner)
    gens = [asyncio.create_task(eng.generate([1], sp(30))) for _ in range(2)]
    await until(lambda: inner.running == 2)
    await eng.update_weights({}, 5)
    assert ("update", 0) in inner.events and eng.policy_version == 5
    assert all(set(g.versions) == {0} for g in await asyncio.gather(*gens))


async def test_cancel_while_held_and_in_flight_leaks_nothing():
    inner = TickingFakeEngine()
    eng = DrainEngine(inner)
    running = asyncio.create_task(eng.generate([1], sp(2000)))
    await until(lambda: inner.running == 1)
    entered = asyncio.Event()

    async def update() -> None:
        async with eng.drained():
            entered.set()
            await eng.update_weights({}, 1)

    upd = asyncio.create_task(update())
    held = asyncio.create_task(eng.generate([1], sp(5)))
    await until(lambda: eng.held == 1)
    held.cancel()
    with pytest.raises(asyncio.CancelledError):
        await held
    assert eng.held == 0 and eng.in_flight == 1 and not entered.is_set()
    running.cancel()  # the long generation goes away: the drain must notice the engine is idle
    with pytest.raises(asyncio.CancelledError):
        await running
    await asyncio.wait_for(upd, 10)
    assert eng.in_flight == 0 and eng.held == 0
    assert (await eng.generate([1], sp(3))).versions == [1, 1, 1]


async def test_cancelled_drain_reopens_the_gate():
    inner = TickingFakeEngine()
    eng = DrainEngine(inner)
    running = asyncio.create_task(eng.generate([1], sp(2000)))
    await until(lambda: inner.running == 1)

    async def update() -> None:
        async with eng.drained():
            await eng.update_weights({}, 1)

    upd = asyncio.create_task(update())
    held = asyncio.create_task(eng.generate([1], sp(3)))
    await until(lambda: eng.held == 1)
    upd.cancel()  # e.g. the run is stopping while waiting for the drain
    with pytest.raises(asyncio.CancelledError):
        await upd
    assert (await asyncio.wait_for(held, 10)).versions == [0, 0, 0]  # released, old weights
    assert eng.policy_version == 0 and eng.drain_stats["drains"] == 0
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)


async def test_close_fails_held_callers():
    inner = TickingFakeEngine()
    eng = DrainEngine(inner)
    running = asyncio.create_task(eng.generate([1], sp(2000)))
    await until(lambda: inner.running == 1)
    upd = asyncio.create_task(eng.update_weights({}, 1))
    held = [asyncio.create_task(eng.generate([1], sp(3))) for _ in range(3)]
    await until(lambda: eng.held == 3)
    await eng.close()
    for h in held:
        with pytest.raises(EngineError, match="closed while this generation waited"):
            await asyncio.wait_for(h, 10)
    assert eng.held == 0 and inner.closed
    running.cancel()
    await asyncio.gather(running, upd, return_exceptions=True)
    with pytest.raises(EngineError, match="closed"):
        await eng.generate([1], sp(3))
    with pytest.raises(EngineError, match="closed"):
        async with eng.drained():
            pass


async def test_errors_propagate_and_release_the_gate():
    inner = TickingFakeEngine(fail_on=666)
    eng = DrainEngine(inner)
    with pytest.raises(EngineError, match="fake failure on session bad"):
        await eng.generate([666], sp(3), session="bad")
    assert eng.in_flight == 0
    failing = asyncio.create_task(eng.generate([666], sp(3)))
    await until(lambda: inner.running == 1)
    with pytest.raises(RuntimeError, match="push failed"):
        async with eng.drained():  # waits for the failing generation, then the push fails
            raise RuntimeError("push failed")
    with pytest.raises(EngineError):
        await failing
    # the gate is open again: a new generation does not wait
    assert (await asyncio.wait_for(eng.generate([1], sp(2)), 10)).versions == [0, 0]
    assert eng.held == 0 and eng.drain_stats["held_calls"] == 0


async def test_wrapper_delegates_the_engine_seam_and_extras():
    fake = FakeEngine(lambda p, params, ctx: [7, 8], max_context=99)
    eng = DrainEngine(fake)
    assert eng.max_context == 99 and eng.policy_version == 0
    out = await eng.generate([1, 2], SamplingParams(max_new_tokens=4), session="x")
    assert out.token_ids == [7, 8]
    await eng.update_weights({}, 3)
    assert fake.loaded == [3] and eng.policy_version == 3
    assert eng.loaded is fake.loaded  # non-seam attributes (weight syncs use pause, post_all, ...)
    assert DrainEngine(TickingFakeEngine()).only_here == "forwarded"
    with pytest.raises(AttributeError):
        _ = eng.no_such_attribute
    with pytest.raises(TypeError, match="wraps an Engine, got str"):
        DrainEngine("not an engine")


async def test_hold_release_across_tasks():
    inner = TickingFakeEngine()
    eng = DrainEngine(inner)
    with pytest.raises(RuntimeError, match="without a hold"):
        eng.release()
    running = asyncio.create_task(eng.generate([1], sp(20)))
    await until(lambda: inner.running == 1)
    waited = await asyncio.create_task(eng.hold())  # e.g. one actor call holds ...
    assert waited > 0 and running.done() and set(running.result().versions) == {0}
    held = asyncio.create_task(eng.generate([1], sp(2)))
    await until(lambda: eng.held == 1)
    await eng.update_weights({}, 2)  # inside a hold: no second drain, no deadlock
    eng.release()  # ... and another releases
    assert (await held).versions == [2, 2]


class FailingGate:
    """A gate whose hold fails (e.g. a dead Ray worker)."""

    async def hold(self) -> float:
        await asyncio.sleep(0.01)
        raise EngineError("worker 3 is dead")

    def release(self) -> None:
        raise AssertionError("a gate whose hold failed must not be released")


class AwaitedGate:
    """A gate whose hold and release are both awaitables, as a remote (actor) face's are."""

    def __init__(self, engine: DrainEngine) -> None:
        self.engine, self.released = engine, 0

    async def hold(self) -> float:
        return await self.engine.hold()

    async def release(self) -> None:
        await asyncio.sleep(0)
        self.engine.release()
        self.released += 1


async def test_drained_together_waits_for_every_engine():
    inners = [TickingFakeEngine(), TickingFakeEngine()]
    engs = [DrainEngine(i) for i in inners]
    first = [asyncio.create_task(e.generate([1], sp(n))) for e, n in zip(engs, (10, 60))]
    await until(lambda: all(i.running == 1 for i in inners))

    async def update() -> None:
        async with drained_together(engs) as waited:
            assert waited > 0 and all(i.running == 0 for i in inners)
            for e in engs:
                await e.update_weights({}, 1)

    upd = asyncio.create_task(update())
    await until(lambda: first[0].done())
    late = asyncio.create_task(engs[0].generate([1], sp(3)))  # engine 0 is idle but held for engine 1
    await until(lambda: engs[0].held == 1)
    assert not upd.done()
    await upd
    assert all(set(g.versions) == {0} for g in await asyncio.gather(*first))
    assert (await late).versions == [1, 1, 1]
    # one failing hold: the others are released and the error propagates
    body_ran = False
    with pytest.raises(EngineError, match="worker 3 is dead"):
        async with drained_together([engs[0], FailingGate(), engs[1]]):
            body_ran = True
    assert not body_ran
    assert (await asyncio.wait_for(engs[1].generate([1], sp(2)), 10)).versions == [1, 1]
    # awaitable release (a remote gate's), through the runner's entry point
    remote = AwaitedGate(engs[1])
    async with weight_update_gate(engs[0], [remote]) as waited:
        assert waited >= 0 and engs[1].drain_stats["drains"] == 3
    assert remote.released == 1 and (await engs[1].generate([1], sp(1))).versions == [1]
    # cancelled while holding: everything reopens
    running = asyncio.create_task(engs[1].generate([1], sp(2000)))
    await until(lambda: inners[1].running == 1)
    upd = asyncio.create_task(update())
    await asyncio.sleep(0.01)
    probe = asyncio.create_task(engs[0].generate([1], sp(2)))
    await until(lambda: engs[0].held == 1)
    upd.cancel()
    await asyncio.gather(upd, return_exceptions=True)
    assert (await asyncio.wait_for(probe, 10)).versions == [1, 1]
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert all(e.held == 0 and e.in_flight == 0 for e in engs)


def test_config_field():
    assert RolloutConfig().partial_rollouts is True
    assert load_config(overrides=["rollout.partial_rollouts=false"]).rollout.partial_rollouts is False


# --- mixed_version_turns -----------------------------------------------------------------------


def traj(turn_versions_: list[list[int]], obs: int = 2, prompt: int = 3, eid: str = "e") -> Trajectory:
    """A trajectory whose turn i samples len(turn_versions_[i]) tokens with those versions."""
    t = Trajectory(eid, "g", "env", prompt, outcome=Outcome.OK)
    t.token_ids, t.loss_mask, t.logprobs = [1] * prompt, [0] * prompt, [0.0] * prompt
    t.turn_ids, t.versions = [-1] * prompt, [-1] * prompt
    for i, vs in enumerate(turn_versions_):
        t.turns.append(TurnRecord(i, len(t.token_ids), len(vs), obs, "stop"))
        t.token_ids += [2] * (len(vs) + obs)
        t.loss_mask += [1] * len(vs) + [0] * obs
        t.logprobs += [-0.1] * len(vs) + [0.0] * obs
        t.turn_ids += [i] * (len(vs) + obs)
        t.versions += list(vs) + [-1] * obs
    t.validate()
    return t


def test_mixed_version_turns_on_hand_built_trajectories():
    a = traj([[0, 0, 0], [0, 1, 1], [1, 1]])  # one of three turns spans versions 0 and 1
    b = traj([[2, 2], [2, 3]], eid="b")  # one of two
    c = traj([[4]], eid="c")  # none
    assert turn_versions(a) == [{0}, {0, 1}, {1}]
    assert rollout_extra([[a]])["mixed_version_turns"] == pytest.approx(1 / 3)
    assert rollout_extra([[a, b], [c]])["mixed_version_turns"] == pytest.approx(2 / 6)
    assert rollout_extra([[c]])["mixed_version_turns"] == 0.0
    # a turn that sampled nothing (e.g. an empty record) is not a turn with tokens: not counted
    d = traj([[0, 1], []], eid="d")
    assert turn_versions(d) == [{0, 1}] and rollout_extra([[d]])["mixed_version_turns"] == 1.0
    # no turns at all (an episode that failed before sampling): no metric rather than a fake 0
    assert "mixed_version_turns" not in rollout_extra([[traj([], eid="empty")]])
    # a malformed turn record pointing past the tokens never fails the step's metrics
    bad = traj([[0, 1]], eid="bad")
    bad.turns.append(TurnRecord(1, len(bad.token_ids) - 1, 10, 0, "length"))
    assert turn_versions(bad) == [{0, 1}]
