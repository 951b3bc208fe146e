"""DAPO dynamic sampling in the staleness queue: exactly the equal-reward groups are filtered (their
slots freed, their positions reported with the next batch), the draw bound hands out a short batch,
the staleness bound still holds, and a snapshot keeps the stream exactly once."""

import asyncio
import random

import pytest

from agentrl.batches.samples import has_signal
from agentrl.batches.staleness import StalenessQueue, dynamic_sampling_metrics, oldest_version
from agentrl.trajectory import Trajectory, TurnRecord


def _traj(reward, version=0, n=3):
    return Trajectory(
        "e",
        "g",
        "x",
        prompt_len=0,
        token_ids=[1] * n,
        loss_mask=[1] * n,
        logprobs=[0.0] * n,
        turn_ids=[0] * n,
        versions=[version] * n,
        turns=[TurnRecord(0, 0, n, 0, "stop", reward=reward)],
        reward=reward,
    )


def _group(rewards, version=0):
    return [_traj(r, version) for r in rewards]


def test_filters_exactly_the_equal_reward_groups():
    async def main():
        q = StalenessQueue(0, 3, keep=has_signal)
        groups = {0: [1, 1], 1: [0, 1], 2: [0, 0], 3: [0.5, 0.25], 4: [1, 1], 5: [1, 0]}
        for p, rewards in groups.items():
            await q.put(await q.admit(), _group(rewards), p)
        assert q.filtered_groups == 3 and q.admitted == 6  # 6 > (k + 1) * B: filtered groups gave their slots back
        batch, positions = await q.get_batch_with_positions()
        assert positions == [1, 3, 5] and q.handed_filtered == [0, 2, 4]
        assert [[t.reward for t in g] for g in batch] == [[0, 1], [0.5, 0.25], [1, 0]]
        assert q.metrics()["filtered_groups"] == 3 and q.metrics()["short_batches"] == 0

    asyncio.run(main())


def test_draw_bound_hands_out_a_short_batch():
    async def main():
        q = StalenessQueue(0, 2, keep=has_signal, max_draws=2)
        for p, rewards in enumerate([[1, 1], [0, 1], [0, 0], [2, 2]]):  # one with signal in 2 x 2 draws
            await q.put(await q.admit(), _group(rewards), p)
        batch, positions = await q.get_batch_with_positions()
        assert positions == [1] and q.handed_filtered == [0, 2, 3] and q.short_batches == 1
        assert q.short_slots == 1  # the step trains: the version moves by one with one slot unfilled
        assert dynamic_sampling_metrics(len(batch), 3, 2) == {
            "filtered_groups": 3,
            "drawn_groups": 4,
            "filtered_frac": 0.75,
            "short_step": 1,
        }
        await q.set_version(1)
        for p in range(4, 8):  # nothing with signal: an empty batch, no step, no slot charged
            await q.put(await q.admit(), _group([0, 0]), p)
        batch, positions = await q.get_batch_with_positions()
        assert batch == [] and q.handed_filtered == [4, 5, 6, 7] and q.short_slots == 1 and q.untrained_groups == 0

    asyncio.run(main())


def test_no_bound_waits_for_a_full_batch():
    async def main():
        q = StalenessQueue(0, 1, keep=has_signal, max_draws=0)
        for p in range(20):
            await q.put(await q.admit(), _group([3, 3]), p)
        get = asyncio.create_task(q.get_batch_with_positions())
        await asyncio.sleep(0.01)
        assert not get.done()
        await q.put(await q.admit(), _group([0, 3]), 20)
        assert (await get)[1] == [20] and len(q.handed_filtered) == 20

    asyncio.run(main())


@pytest.mark.parametrize("k", [0, 1, 2])
def test_staleness_bound_holds_with_filtering_and_short_batches(k):
    B, steps = 3, 8
    engine = {"version": 0}

    async def main():
        q = StalenessQueue(k, B, keep=has_signal, max_draws=2)
        rng = random.Random(k)

        async def producer():
            tasks = []
            while True:
                try:
                    idx = await q.admit()
                except asyncio.CancelledError:
                    break

                async def episode(idx=idx):
                    v0 = engine["version"]
                    await asyncio.sleep(rng.random() * 0.01)
                    rewards = [0, 0] if rng.random() < 0.6 else [0, 1]  # most groups carry no signal
                    await q.put(idx, _group(rewards, v0))

                tasks.append(asyncio.create_task(episode()))
            await asyncio.gather(*tasks)

        prod = asyncio.create_task(producer())
        seen, shorts, handed = [], 0, 0
        for _ in range(steps):
            batch = await q.get_batch()
            shorts += len(batch) < B
            handed += len(batch)
            seen += [q.version - oldest_version(t) for g in batch for t in g]
            # generating or buffered: never more than k + 1 batches (filtered groups gave their slots back)
            pending = q.admitted - q.dropped_groups - q.untrained_groups - q.filtered_groups - handed
            assert pending <= (k + 1) * B
            await asyncio.sleep(0.005)
            if batch:
                engine["version"] += 1
                await q.set_version(engine["version"])
        await q.close()
        prod.cancel()
        await asyncio.gather(prod, return_exceptions=True)
        assert max(seen, default=0) <= k and q.filtered_groups > 0
        assert shorts == q.short_batches

    asyncio.run(main())


def test_snapshot_keeps_pending_filtered_positions_out_of_the_counters():
    async def main():
        q = StalenessQueue(1, 2, keep=has_signal)
        await q.put(await q.admit(), _group([0, 1]), 0)
        await q.put(await q.admit(), _group([1, 1]), 1)  # filtered, not yet handed out with a batch
        await q.put(await q.admit(), _group([1, 0]), 2)
        await q.get_batch_with_positions()
        assert q.handed_filtered == [1]
        await q.set_version(1)
        await q.put(await q.admit(), _group([0, 0]), 3)  # pending at the checkpoint
        await q.put(await q.admit(), _group([0, 2]), 4)  # ready at the checkpoint
        snap = q.snapshot()
        assert snap["filtered"] == [3] and snap["filtered_groups"] == 1 and [p for p, _ in snap["ready"]] == [4]
        r = StalenessQueue(1, 2, keep=has_signal)
        r.version = 1
        r.restore(snap["ready"], **{k: v for k, v in snap.items() if k not in ("ready", "filtered")})
        # after a resume position 3 is requeued by the run and admitted again: outstanding = the ready group
        done = r.dropped_groups + r.untrained_groups + r.filtered_groups - r.short_slots
        assert r.admitted - done == r.version * 2 + 1

    asyncio.run(main())
