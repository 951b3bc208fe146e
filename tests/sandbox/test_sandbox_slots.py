"""Slots (agentrl.sandbox.slots): waiting for a sandbox slot is recorded, does not count against a
tool's deadline (ToolEnv counts running time), and a saturated sandbox holds new episodes back."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from agentrl.envs.base import ToolEnv
from agentrl.errors import ToolTimeoutError
from agentrl.sandbox import make_sandbox
from agentrl.sandbox import slots as slots_mod
from agentrl.sandbox.slots import WAIT_CLOCK, Slots, WaitClock, admission, queue_summary, take_queue_waits
from agentrl.tools.python import make_python_tool


def test_queue_summary_is_nearest_rank():
    assert queue_summary([]) == {"queue_s_p50": 0.0, "queue_s_p99": 0.0, "queue_calls": 0}
    assert queue_summary([4.0, 1.0, 3.0, 2.0]) == {"queue_s_p50": 2.0, "queue_s_p99": 4.0, "queue_calls": 4}
    xs = [float(i) for i in range(1, 201)]
    assert queue_summary(xs)["queue_s_p50"] == 100.0 and queue_summary(xs)["queue_s_p99"] == 198.0


def test_waits_are_recorded_and_reach_the_callers_clock():
    slots = Slots(1)
    take_queue_waits()

    async def main():
        held, release = asyncio.Event(), asyncio.Event()

        async def holder():
            async with slots.hold():
                held.set()
                await release.wait()

        async def waiter():
            t0 = time.perf_counter()
            async with slots.hold():
                return WAIT_CLOCK.get().waited(), time.perf_counter() - t0

        h = asyncio.ensure_future(holder())
        await held.wait()
        clock = WaitClock()
        WAIT_CLOCK.set(clock)
        w = asyncio.ensure_future(waiter())
        while slots.waiting == 0:
            await asyncio.sleep(0)
        await asyncio.sleep(0.2)  # the waiter waits at least this long
        release.set()
        waited, elapsed = await w
        await h
        return waited, elapsed, clock.waited()

    waited, elapsed, total = asyncio.run(main())
    # bounded by what the test itself did, not by a wall time: at least the 0.2 s it held the slot,
    # at most the waiter's own stopwatch around the wait
    assert 0.2 <= waited <= elapsed and total == waited
    recorded = take_queue_waits()
    assert len(recorded) == 2 and recorded[0] == 0.0 and 0.2 <= recorded[1] <= elapsed, (recorded, elapsed)
    assert take_queue_waits() == []


def test_overlapping_waits_of_parallel_calls_count_once():
    clock = WaitClock()
    t0 = time.perf_counter()
    clock._begin()
    clock._begin()
    time.sleep(0.1)
    clock._end()
    time.sleep(0.1)
    clock._end()
    span = time.perf_counter() - t0
    # at least the 0.2 s slept, at most the span itself: counted one by one the two waits would add
    # the overlap twice (> span), whatever the machine's load
    assert 0.2 <= clock.waited() <= span


def test_admission_waits_while_a_sandbox_is_saturated(monkeypatch):
    monkeypatch.setattr(slots_mod, "_ADMISSION_POLL_S", 0.01)
    slots = Slots(1)

    async def main():
        held, release = asyncio.Event(), asyncio.Event()

        async def hold(first=False):
            async with slots.hold():
                if first:
                    held.set()
                    await release.wait()

        first = asyncio.ensure_future(hold(first=True))
        await held.wait()
        waiting = [asyncio.ensure_future(hold()) for _ in range(2)]  # 2 waiting > capacity 1
        while slots.waiting < 2:
            await asyncio.sleep(0)
        assert slots.saturated
        gate = asyncio.ensure_future(admission())
        await asyncio.sleep(0.1)  # ten polls
        held_back = not gate.done()
        release.set()  # one waiter runs, one waits: no longer saturated
        await asyncio.wait_for(gate, 30)
        await asyncio.gather(first, *waiting)
        return held_back

    assert asyncio.run(main()), "admission() returned while the sandbox was saturated"
    assert not slots.saturated


class OneToolEnv(ToolEnv):
    def __init__(self, sandbox, **kw):
        self.tools = [make_python_tool(sandbox, timeout_s=5)]
        super().__init__(**kw)

    def sample_task(self, rng, options):
        return {"id": "t", "prompt": "run it"}

    def initial_messages(self, task):
        return [{"role": "user", "content": task["prompt"]}]

    async def score(self, task, final_text, transcript):
        return 0.0


def _call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def test_a_tool_deadline_counts_running_time_not_the_queue():
    """One slot, a 1 s program holding it: a second call queued behind it would pass a 0.6 s
    deadline that counted the wait; its own run is short, so it must succeed. A program that runs
    past the deadline still times out."""
    sb = make_sandbox("local", bwrap=False, max_concurrency=1)

    async def main():
        env_a, env_b = OneToolEnv(sb, tool_timeout_s=5.0), OneToolEnv(sb, tool_timeout_s=0.6)
        env_a.reset(seed=0)
        env_b.reset(seed=0)
        first = asyncio.ensure_future(env_a.astep(_call("import time; time.sleep(1.0); print('slow')")))
        await asyncio.sleep(0.2)
        _, _, _, _, info = await env_b.astep(_call("print('quick')"))
        await first
        return info

    info = asyncio.run(main())
    assert info["messages"][0]["content"].strip() == "quick"
    env = OneToolEnv(sb, tool_timeout_s=0.3)
    env.reset(seed=0)
    with pytest.raises(ToolTimeoutError):
        env.step(_call("import time; time.sleep(3)"))
