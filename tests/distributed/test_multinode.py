"""Several Ray nodes simulated on this machine (``ray.cluster_utils.Cluster``: a head without CPUs
plus worker raylets, each with its own CPUs and a custom resource naming it): actors spread over
the nodes by ``ray.pg_strategy`` (asserted from the node ids the actors report), the object-store
weight sync staging one copy per node, and a node removed in the middle of an ``agentrl run`` that
the run notices, restarts from its checkpoint and finishes exactly once. Without Ray these skip,
saying why; the units at the top need no Ray."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import torch
from ray_local import RUN_ARGS, assert_no_leak, ray_or_skip, ray_pids  # also registers test/RayCount-v0

from agentrl.config.plan import resolve
from agentrl.config.schema import load_config
from agentrl.distributed import RayConfig
from agentrl.distributed.compute import check_weight_sync
from agentrl.distributed.recovery import Supervisor, is_node_loss, lost_nodes
from agentrl.errors import ConfigError, EngineError, NodeLostError
from agentrl.weights.distributed import rendezvous_address
from agentrl.weights.fake import FakeServerEngine
from agentrl.weights.object_store import ObjectStoreSync, one_per_node, stage_weights_dir


# -- without Ray -----------------------------------------------------------------------------------
def test_node_loss_is_recognised_through_causes_and_nothing_else_is():
    class ActorDiedError(Exception):  # stands for Ray's class of that name only if it comes from ray.*
        pass

    ActorDiedError.__module__ = "ray.exceptions"
    try:
        raise EngineError("engine actor 0: ActorDiedError") from ActorDiedError("gone")
    except EngineError as e:
        wrapped = e
    assert is_node_loss(wrapped) and is_node_loss(NodeLostError("node x lost"))
    group = Exception("group")
    group.exceptions = (ValueError("a"), NodeLostError("b"))  # an ExceptionGroup's members are searched
    assert is_node_loss(group)
    local = type("ActorDiedError", (Exception,), {})  # same name, not Ray's: not a loss
    assert (
        not is_node_loss(local("x"))
        and not is_node_loss(EngineError("HTTP 500"))
        and not is_node_loss(TimeoutError("slow"))
    )


def test_lost_nodes_names_dead_and_unknown_nodes_with_their_actors():
    where = {"trainer-rank-0": "A", "engine-0": "B", "rollout-worker-0": "B", "rollout-worker-1": "C"}
    nodes = [{"NodeID": "A", "Alive": True}, {"NodeID": "B", "Alive": False}]
    assert lost_nodes(where, nodes) == {"B": ["engine-0", "rollout-worker-0"], "C": ["rollout-worker-1"]}
    assert lost_nodes(where, [{"NodeID": n, "Alive": True} for n in "ABC"]) == {}


def test_supervisor_restarts_only_after_a_loss_and_at_most_restarts_times():
    notes: list[str] = []
    seen: list[int] = []

    async def attempt(n: int) -> str:
        seen.append(n)
        if n < 2:
            raise NodeLostError(f"node {n} lost")
        sup.stepped(7)
        return "done"

    sup = Supervisor(2, note=notes.append)
    assert asyncio.run(sup.run(attempt)) == "done" and seen == [0, 1, 2]
    assert [r.attempt for r in sup.recoveries] == [1, 2] and sup.recoveries[-1].resumed_step == 6
    assert sup.recoveries[-1].as_dict()["recover_s"] >= 0 and "restart 2/2" in notes[1]
    with pytest.raises(NodeLostError):  # one loss too many
        seen.clear()
        asyncio.run(Supervisor(1, note=notes.append).run(attempt))
    assert seen == [0, 1]

    async def broken(n: int) -> None:
        seen.append(n)
        raise ValueError("a bug, not a lost node")

    seen.clear()
    with pytest.raises(ValueError):
        asyncio.run(Supervisor(5, note=notes.append).run(broken))
    assert seen == [0]


def test_disk_sync_across_nodes_needs_a_declared_shared_filesystem(monkeypatch):
    from agentrl.distributed.compute import check

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    check_weight_sync("disk", RayConfig(), [])  # a local instance: one machine, one filesystem
    cluster = RayConfig(address="10.0.0.1:6379")
    with pytest.raises(ConfigError, match="ray.shared_filesystem: true"):
        check_weight_sync("disk", cluster, [])
    check_weight_sync("disk", RayConfig(address="10.0.0.1:6379", shared_filesystem=True), [])
    check_weight_sync("object_store", cluster, [])
    with pytest.raises(ConfigError, match="engine.urls"):
        check_weight_sync("object_store", cluster, ["http://10.0.0.2:30000"])
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # auto resolves to disk for sglang on CPU
    with pytest.raises(ConfigError, match="shared_filesystem"):
        check(load_config([], ["engine.kind=sglang", "model.device=cpu"]), RayConfig())


def test_the_nccl_rendezvous_listens_where_remote_servers_reach_it():
    assert rendezvous_address(["http://127.0.0.1:30000", "http://localhost:30001"]) == "127.0.0.1"
    addr = rendezvous_address(["http://127.0.0.1:1", "http://192.0.2.77:30000"])
    assert addr != "127.0.0.1" and addr.count(".") == 3  # this host's address on the route to that server


def _state() -> dict:
    return {"embed.weight": torch.arange(12.0).view(4, 3), "norm.weight": torch.ones(3)}


def test_stagers_on_one_disk_never_clobber_each_other(tmp_path, tiny_model_dir):
    named = list(_state().items())
    paths = [stage_weights_dir(named, 3, tiny_model_dir, tmp_path, keep=1) for _ in range(2)]
    assert paths[0] == paths[1] == tmp_path / "v00000003"
    assert (paths[0] / "config.json").is_file() and not list(tmp_path.glob(".stage-*"))
    stage_weights_dir(named, 4, tiny_model_dir, tmp_path, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v00000004"]
    nodes = [type("S", (), {"node": n})() for n in ("a", "b", "a", None, None)]
    assert [s.node for s in one_per_node(nodes)] == ["a", "b", None, None]
    with pytest.raises(EngineError, match="no weight_stagers"):
        ObjectStoreSync(FakeServerEngine())


# -- a simulated multi-node cluster ----------------------------------------------------------------
def _cluster(worker_cpus=(2, 2)):
    ray = ray_or_skip()
    from ray.cluster_utils import Cluster

    # Ray is installed: a cluster that cannot start fails the test (never a skip that hides a broken set-up)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})  # the driver's node: no actors
    workers = [c.add_node(num_cpus=n, resources={f"node_{chr(97 + i)}": 1}) for i, n in enumerate(worker_cpus)]
    c.wait_for_nodes()
    return ray, c, workers


@pytest.fixture(scope="class")  # torn down before the node-loss tests start clusters of their own
def three_nodes():
    before = ray_pids()
    ray, c, workers = _cluster()
    ray.init(address=c.address)
    yield ray, c, workers
    ray.shutdown()
    c.shutdown()
    assert_no_leak(before)


class Stager:
    """A stand-in for an SGLang engine actor's ``stage_weights`` (no SGLang here): the same
    ``stage_weights_dir`` on whatever node Ray put it."""

    def __init__(self, src: str) -> None:
        self.src = src

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def stage_weights(self, state: dict, version: int, parent: str, keep: int) -> str:
        return str(stage_weights_dir(list(state.items()), version, self.src, parent, keep))


class StagerHandle:
    def __init__(self, actor) -> None:
        import ray

        self.actor, self.node = actor, ray.get(actor.node.remote())

    def stage_weights(self, ref, version, parent, keep):
        import ray

        return ray.get(self.actor.stage_weights.remote(ref, version, parent, keep))


@pytest.mark.ray
class TestSimulatedCluster:
    def test_strict_spread_puts_ranks_and_engines_on_different_nodes(self, three_nodes, tiny_model_dir):
        from agentrl.distributed import RayCompute
        from agentrl.episodes.manager import make_specs

        ray, c, workers = three_nodes
        rc = RayConfig(
            trainer_ranks=2, num_engines=2, workers_per_engine=1, placement="split", pg_strategy="STRICT_SPREAD"
        )
        t0 = time.perf_counter()
        cfg = resolve(load_config([], RUN_ARGS), "run").cfg  # auto device/dtype resolved, as a run does
        compute = RayCompute.start(cfg, tiny_model_dir, rc=rc)
        print(f"\n2 ranks + 2 engines + 2 workers over 2 worker nodes: {time.perf_counter() - t0:.1f}s")
        try:
            ids = {w.node_id for w in workers}
            nodes = compute.nodes
            reported = {n: ray.get(a.placement.remote())["node"] for n, a in compute.named.items()}
            assert reported == nodes and set(nodes.values()) == ids, nodes  # both worker nodes, never the head
            assert nodes["trainer-rank-0"] != nodes["trainer-rank-1"]
            assert nodes["engine-0"] != nodes["engine-1"]
            assert nodes["rollout-worker-0"] == nodes["engine-0"]  # a worker shares its engine's bundle

            async def go():
                await compute.engine.start()
                return await compute.episodes.collect(make_specs(2, 2, seed=4))

            out = asyncio.run(go())
            assert len(out) == 4 and all(t.trainable for t in out), [t.outcome_detail for t in out]
        finally:
            compute.close()

    def test_object_store_sync_writes_one_copy_per_node_and_loads_that_path(
        self, three_nodes, tiny_model_dir, tmp_path
    ):
        from agentrl.distributed.compute import ship_by_value

        ray, c, workers = three_nodes
        ship_by_value(Stager)  # this test module is not importable on the workers
        cls = ray.remote(Stager)
        actors = [
            cls.options(num_cpus=0.1, resources={f"node_{x}": 0.1}).remote(str(tiny_model_dir)) for x in ("a", "a", "b")
        ]  # two servers on node a, one on node b
        try:
            stagers = [StagerHandle(a) for a in actors]
            assert len({s.node for s in stagers}) == 2
            eng = FakeServerEngine(urls=("http://10.0.0.1:1", "http://10.0.0.1:2", "http://10.0.0.2:1"))
            sync = ObjectStoreSync(eng, tmp_path / "w", stagers=stagers)
            stats = asyncio.run(sync.push(_state(), 5))
            assert stats.path == "object_store" and stats.phases["nodes"] == 2.0  # node a wrote once
            path = str(tmp_path / "w" / "v00000005")
            assert (
                "post",
                "/update_weights_from_disk",
                {"model_path": path, "weight_version": "5", "flush_cache": True},
            ) in eng.calls
            assert eng.policy_version == 5 and eng.weights_path == path
            assert [c[0] for c in eng.calls][:1] == ["pause"]  # staged before the pause, loaded inside it
            from safetensors.torch import load_file

            got = load_file(path + "/model.safetensors")
            assert all(torch.equal(got[k], v) for k, v in _state().items())
            asyncio.run(sync.push(_state(), 6))
            assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["v00000006"]
        finally:
            for a in actors:
                ray.kill(a)

    def test_the_heartbeat_names_a_dead_actor_and_ignores_a_busy_one(self, three_nodes):
        from agentrl.distributed.compute import ship_by_value
        from agentrl.distributed.recovery import watch

        ray, c, workers = three_nodes
        ship_by_value(Pinged)
        cls = ray.remote(Pinged)
        actors = {"busy": cls.options(num_cpus=0.1).remote(), "doomed": cls.options(num_cpus=0.1).remote()}
        where = {n: ray.get(a.placement.remote())["node"] for n, a in actors.items()}
        actors["busy"].sleep.remote(30)  # a sync actor inside a long call: its pings time out, it is alive
        try:

            async def go():
                task = asyncio.create_task(watch(actors, where, interval_s=0.3, probe_timeout_s=0.5))
                await asyncio.sleep(2.0)
                assert not task.done()  # busy is not dead
                ray.kill(actors["doomed"])
                t0 = time.monotonic()
                with pytest.raises(NodeLostError, match="actor doomed"):
                    await asyncio.wait_for(task, 30)
                return time.monotonic() - t0

            print(f"\ndead actor noticed by the heartbeat after {asyncio.run(go()):.1f}s")
        finally:
            ray.kill(actors["busy"])


class Pinged:
    def placement(self) -> dict:
        import ray

        return {"node": ray.get_runtime_context().get_node_id()}

    def sleep(self, s: float) -> None:
        time.sleep(s)


# -- a node lost mid-run ----------------------------------------------------------------------------
def _node_of(cluster_nodes, node_id: str):
    return next(n for n in cluster_nodes if n.node_id == node_id)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("victim", ["trainer-rank-0", "rollout-worker-1"])
def test_a_node_removed_mid_run_is_noticed_and_the_run_resumes_exactly_once(tiny_model_dir, tmp_path, victim):
    """Head (no CPUs) + 2 worker nodes; ``agentrl run`` with distributed: ray, a checkpoint every
    step and ray.restart_on_node_loss=2. After step 2 the node holding ``victim`` is removed (the
    trainer's: its next call fails; a rollout worker's: only the heartbeat or the next weight push
    to its engine can tell): the run notices, stops its actors, places them again on the node left,
    resumes from its newest checkpoint and finishes; the ledger shows every prompt trained exactly once."""
    from agentrl.jobs.crash_harness import ledger_check
    from agentrl.jobs.run import Runner

    before = ray_pids()
    ray, c, workers = _cluster()
    out = tmp_path / "run"
    steps = 6
    cfg = load_config(
        [],
        [
            f"output_dir={out}",
            f"model.path={tiny_model_dir}",
            *RUN_ARGS,
            "train.groups_per_step=2",
            f"train.steps={steps}",
            "train.max_staleness=1",
            "train.checkpoint_every=1",
            "eval.num_tasks=0",
            "eval.env_kwargs={}",
            "trainer.lr=2e-2",
            "trainer.loss_agg=token-mean",
            "logging.tensorboard=false",
            "distributed=ray",
            f"ray.address={c.address}",
            "ray.placement=split",
            "ray.pg_strategy=SPREAD",
            "ray.workers_per_engine=2",
            "ray.restart_on_node_loss=2",
            "ray.heartbeat_s=1.0",
            "ray.startup_timeout_s=240",
        ],
    )
    runner = Runner(cfg, progress=False)
    removed: dict = {}

    def remove_when_step_2() -> None:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            rows = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").exists() else []
            if any(json.loads(r).get("step", 0) >= 2 for r in rows) and runner.compute is not None:
                node_id = runner.compute.nodes[victim]
                removed.update(
                    node=node_id,
                    at=time.time(),
                    step=max(json.loads(r)["step"] for r in rows),
                    actors=sorted(n for n, v in runner.compute.nodes.items() if v == node_id),
                )
                c.remove_node(_node_of(workers, node_id))
                return
            time.sleep(0.2)

    killer = threading.Thread(target=remove_when_step_2, daemon=True)
    try:
        killer.start()
        t0 = time.perf_counter()
        summary = asyncio.run(runner.run())
        wall = time.perf_counter() - t0
        killer.join(timeout=5)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()
    assert removed, "the run ended before the node could be removed"
    assert summary["steps"] == steps and len(summary["recoveries"]) == 1, summary.get("recoveries")
    rec = summary["recoveries"][0]
    detect_s, recover_s = rec["noticed_at"] - removed["at"], rec["recovered_at"] - removed["at"]
    print(
        f"\nnode {removed['node'][:12]} removed after step {removed['step']} with {removed['actors']}; "
        f"noticed after {detect_s:.1f}s ({rec['error'][:120]}); resumed at step {rec['resumed_step']}; "
        f"first step after the restart done {recover_s:.1f}s after the removal; run wall {wall:.1f}s"
    )
    # a hang guard, not a timing test: noticed after 0.3-0.5 s (BENCHMARKS.md); a loss nobody notices never ends
    assert 0 <= detect_s < 30 and rec["resumed_step"] >= 1
    chk = ledger_check(out)
    assert chk["steps"] == list(range(1, steps + 1)), chk
    assert chk["duplicates"] == [] and chk["lost"] == [], chk
    assert (out / "checkpoints" / f"step_{steps:06d}" / "COMPLETE").exists()
    assert_no_leak(before)


# -- the object-store path on real SGLang engine actors (skips without SGLang) ----------------------
@pytest.mark.ray
@pytest.mark.sglang
@pytest.mark.slow
def test_object_store_sync_loads_new_weights_into_sglang_actors_on_two_nodes(sglang_model_dir, tmp_path):
    """Two SGLang engine actors on two simulated nodes (STRICT_SPREAD); a push of the trainer's
    weights through ``object_store``: each node's actor writes its copy, both servers load it and
    serve the new version (the tokens they sample afterwards carry it)."""
    from test_ray_sglang import _sglang_or_skip

    _sglang_or_skip()
    from agentrl.distributed import RayCompute
    from agentrl.engine.base import SamplingParams
    from agentrl.weights.factory import make_weight_sync

    before = ray_pids()
    ray, c, workers = _cluster(worker_cpus=(3, 3))
    try:
        cfg = resolve(
            load_config(
                [],
                [
                    *RUN_ARGS,
                    "engine.kind=sglang",
                    "engine.max_total_tokens=4096",
                    "engine.weight_sync=object_store",
                    f"ray.address={c.address}",
                ],
            ),
            "run",
        ).cfg
        rc = RayConfig(
            address=c.address, num_engines=2, workers_per_engine=1, placement="split", pg_strategy="STRICT_SPREAD"
        )
        compute = RayCompute.start(cfg, sglang_model_dir, rc=rc)
        try:
            assert compute.nodes["engine-0"] != compute.nodes["engine-1"]
            assert {s.node for s in compute.engine.weight_stagers} == {
                compute.nodes["engine-0"],
                compute.nodes["engine-1"],
            }

            async def go():
                await compute.engine.start()
                sync = make_weight_sync("object_store", compute.engine)
                try:
                    sd = {k: v + 0.0 for k, v in (await asyncio.to_thread(compute.trainer.full_state_dict)).items()}
                    stats = await sync.push(sd, 3)
                    gens = [
                        await compute.engine.generate([1, 2, 3], SamplingParams(max_new_tokens=4), session=s)
                        for s in ("a", "b", "c", "d")
                    ]
                finally:
                    await sync.close()
                    await compute.engine.close()
                return stats, gens

            stats, gens = asyncio.run(go())
            print(f"\nobject_store push to 2 nodes: {stats.seconds:.2f}s {stats.phases}")
            assert stats.phases["nodes"] == 2.0
            assert {g.info["server"] for g in gens} == set(compute.engine.urls)  # both servers answered
            assert all(set(g.versions) == {3} for g in gens), [g.versions for g in gens]
        finally:
            compute.close()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()
    assert_no_leak(before)
