"""Bounded-staleness queue: admission control and the hard per-sample bound."""

import asyncio
import random

import pytest

from agentrl.batches.staleness import StalenessQueue, oldest_version
from agentrl.trajectory import Trajectory


def _traj(versions):
    n = len(versions)
    return Trajectory(
        "e",
        "g",
        "x",
        prompt_len=0,
        token_ids=[1] * n,
        loss_mask=[1] * n,
        logprobs=[0.0] * n,
        turn_ids=[0] * n,
        versions=list(versions),
    )


def test_oldest_version_ignores_mask0():
    t = _traj([3, 4, 5])
    t.loss_mask[0], t.versions[0] = 0, -1
    assert oldest_version(t) == 4


@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_bound_holds_under_stalled_trainer_and_random_latency(k):
    B, steps = 3, 6
    engine = {"version": 0}

    async def main():
        q = StalenessQueue(k, B)

        async def producer():
            rng = random.Random(k)
            tasks = []
            while True:
                try:
                    idx = await q.admit()
                except asyncio.CancelledError:
                    break

                async def episode(idx=idx):
                    v0 = engine["version"]
                    await asyncio.sleep(rng.random() * 0.02)  # long-tail-ish latency
                    v1 = engine["version"]  # partial rollout: later tokens may be newer
                    await q.put(idx, [_traj([v0] * 3 + [v1] * 2)])

                tasks.append(asyncio.create_task(episode()))
            await asyncio.gather(*tasks)

        prod = asyncio.create_task(producer())
        # stall: the trainer does nothing for a while; generation must stop at (k+1)*B groups
        await asyncio.sleep(0.2)
        assert q.admitted == (k + 1) * B
        trained = []
        for step in range(steps):
            batch = await q.get_batch()
            for group in batch:
                for t in group:
                    trained.append(q.version - oldest_version(t))
            await asyncio.sleep(0.01)  # "training"
            engine["version"] = step + 1
            await q.set_version(step + 1)
            assert q.admitted <= (q.version + k + 1) * B
        await q.close()
        await prod
        return q, trained

    q, trained = asyncio.run(asyncio.wait_for(main(), 30))
    assert len(trained) == steps * B
    assert max(trained) <= k  # the hard bound: no trained sample older than version - k
    assert sum(q.histogram.values()) == steps * B
    if k == 0:
        assert set(trained) == {0}  # synchronous on-policy


def test_stale_groups_are_dropped_and_counted():
    async def main():
        q = StalenessQueue(1, 1)
        i0 = await q.admit()
        i1 = await q.admit()
        await q.set_version(5)  # the engine moved far ahead (e.g. an external update)
        await q.put(i0, [_traj([0, 0])])
        await q.put(i1, [_traj([5, 5])])
        batch = await q.get_batch()
        return q, batch

    q, batch = asyncio.run(main())
    assert q.dropped_groups == 1
    assert oldest_version(batch[0][0]) == 5


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_staleness"):
        StalenessQueue(-1, 2)
    with pytest.raises(ValueError, match="groups_per_batch"):
        StalenessQueue(0, 0)


def test_batch_with_nothing_trainable_gives_its_slots_back():
    """Every episode of a batch failed (e.g. the engine crashed): the trainer takes no step and the
    version stays, so the queue must re-open admission itself or a synchronous run waits forever."""
    from agentrl.trajectory import Outcome

    def failed():
        t = _traj([0, 0])
        t.outcome = Outcome.ENGINE_ERROR
        return t

    async def main():
        q = StalenessQueue(0, 2)
        for _ in range(2):
            await q.put(await q.admit(), [failed()])
        assert not q.can_admit()
        await q.get_batch()
        assert q.can_admit() and q.untrained_groups == 2
        for _ in range(2):  # a batch with one trainable episode is trained: no slots back
            await q.put(await q.admit(), [failed(), _traj([0, 0])])
        await q.get_batch()
        assert not q.can_admit() and q.untrained_groups == 2
        await q.set_version(1)
        assert q.can_admit()

    asyncio.run(main())


def test_a_returned_batch_is_handed_out_again_with_the_counters_undone():
    """A stop interrupted the train step: ``return_batch`` puts the batch back as if it had never
    been handed out (snapshot and metrics as before), and the next hand-out gives the same groups."""
    from agentrl.trajectory import Outcome

    def failed():
        t = _traj([0, 0])
        t.outcome = Outcome.ENGINE_ERROR
        return t

    async def main():
        q = StalenessQueue(1, 2, keep=lambda g: len(g[0].token_ids) > 1, max_draws=2)
        await q.put(await q.admit(), [_traj([0])], position=9)  # filtered: reported with the next batch
        for pos in (10, 11, 12):
            await q.put(await q.admit(), [_traj([0, 0])], position=pos)
        snap, metrics, admits = q.snapshot(), q.metrics(), q.can_admit()
        groups, positions = await q.get_batch_with_positions()
        assert positions == [10, 11] and q.handed_filtered == [9] and q.metrics() != metrics
        q.return_batch()
        assert q.snapshot() == snap and q.metrics() == metrics and q.can_admit() == admits
        assert q.handed_filtered == []
        again, positions2 = await q.get_batch_with_positions()
        assert positions2 == [10, 11] and again == groups and q.handed_filtered == [9]
        await q.set_version(1)  # trained: there is nothing to give back any more
        with pytest.raises(RuntimeError, match="no batch was handed out"):
            q.return_batch()
        # an untrainable batch (every episode failed) gave its slots back: returning takes them again
        q2 = StalenessQueue(0, 1)
        await q2.put(await q2.admit(), [failed()], position=0)
        assert not q2.can_admit()
        await q2.get_batch()
        assert q2.can_admit() and q2.untrained_groups == 1
        q2.return_batch()
        assert not q2.can_admit() and q2.untrained_groups == 0

    asyncio.run(main())
