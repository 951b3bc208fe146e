"""bench/latency.py: the benchmark's injected-latency wrappers draw the same delays for the same
episode and turn whatever the call order, have the lognormal's mean and CV, and forward the
engine/env they wrap. Uses FakeEngine (a unit test of the wrapper, not of an engine) and the real
concise env. No timing assertions: delays are read from the wrappers, not measured."""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from latency import LatencyEngine, LatencyEnv, SampleCounter, lognormal_draw, seeded_rng

from agentrl.engine.base import SamplingParams
from agentrl.engine.fake import FakeEngine
from agentrl.envs.concise import ConciseEnv


def test_lognormal_draw_has_the_asked_mean_and_cv():
    rng = random.Random(0)
    xs = [lognormal_draw(2.0, 1.0, rng) for _ in range(200_000)]
    assert statistics.fmean(xs) == pytest.approx(2.0, rel=0.03)
    assert statistics.pstdev(xs) / statistics.fmean(xs) == pytest.approx(1.0, rel=0.08)
    assert lognormal_draw(0.0, 1.0, rng) == 0.0
    with pytest.raises(ValueError, match="mean=-1"):
        lognormal_draw(-1, 1.0, rng)


def test_seeded_rng_is_stable_and_keyed():
    a = [seeded_rng(0, "gen", "s0-p1-2", 3).random() for _ in range(2)]
    assert a[0] == a[1]
    assert seeded_rng(0, "gen", "s0-p1-2", 3).random() != seeded_rng(0, "gen", "s0-p1-2", 4).random()
    assert seeded_rng(0, "gen", "s0-p1-2", 3).random() != seeded_rng(1, "gen", "s0-p1-2", 3).random()


def test_engine_delays_follow_session_and_turn_not_call_order():
    def policy(ids, params, ctx):
        return [5, 6]

    async def play(order):
        eng = LatencyEngine(FakeEngine(policy), per_token_s=1e-4, mean_tokens=10, seed=7)
        got: dict[tuple[str, int], float] = {}
        turns: dict[str, int] = {}
        for s in order:
            await eng.generate([1, 2], SamplingParams(max_new_tokens=4), session=s)
            t = turns.get(s, 0)
            turns[s] = t + 1
            got[(s, t)] = eng.delays[-1]
        return got

    a = asyncio.run(play(["a", "b", "a", "c", "b", "a"]))
    b = asyncio.run(play(["c", "a", "a", "b", "b", "a"]))
    assert a == b
    assert len(set(a.values())) == len(a)  # distinct episodes/turns draw distinct delays
    eng = LatencyEngine(FakeEngine(policy), per_token_s=1e-4, mean_tokens=10, seed=7)
    assert a[("b", 1)] == eng.delay_for("b", 1)


def test_engine_disabled_and_forwarding():
    inner = FakeEngine(lambda ids, p, ctx: [3], max_context=64)
    eng = LatencyEngine(inner, per_token_s=1e-4, mean_tokens=10)

    async def go():
        await eng.start()
        eng.enabled = False
        gen = await eng.generate([1], SamplingParams(max_new_tokens=2), session="x")
        await eng.update_weights({}, 3)
        await eng.close()
        return gen

    gen = asyncio.run(go())
    assert gen.token_ids == [3] and eng.delays == []
    assert eng.policy_version == inner.policy_version == 3
    assert eng.max_context == 64
    with pytest.raises(ValueError, match="per_token_s"):
        LatencyEngine(inner, per_token_s=-1, mean_tokens=10)


def test_env_delays_follow_task_sample_and_turn():
    async def episode(counter, seed):
        env = LatencyEnv(ConciseEnv(n_turns=2), tool_mean_s=1e-4, seed=3, counter=counter)
        await env.areset(seed=seed)
        r = []
        for _ in range(2):
            _, reward, _, _, _ = await env.astep("ok")
            r.append(reward)
        return env.delays, r

    async def run(order):
        counter = SampleCounter()
        return [await episode(counter, s) for s in order]

    first = asyncio.run(run([11, 11, 12]))
    second = asyncio.run(run([12, 11, 11]))
    assert first[0] == second[1] and first[1] == second[2] and first[2] == second[0]
    assert first[0][0] != first[1][0]  # sample 0 and 1 of task 11 draw their own delays
    inner = ConciseEnv(n_turns=2)
    inner.reset(seed=11)
    assert first[0][1] == [inner.step("ok")[1], inner.step("ok")[1]]  # rewards are the inner env's
    off = LatencyEnv(ConciseEnv(n_turns=1), tool_mean_s=0.0)
    off.reset(seed=1)
    off.step("x")
    assert off.delays == [0.0]
    with pytest.raises(ValueError, match="tool_mean_s"):
        LatencyEnv(ConciseEnv(), tool_mean_s=-0.5)
