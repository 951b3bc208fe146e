"""``distributed: ray`` on a real local Ray instance: placement, actors, 2 Ray trainer ranks vs 1
process, and a shortened ``agentrl run`` end to end. Tests that need Ray skip, saying why, only
where Ray cannot be imported or started; every Ray connection is shut down by its test/fixture."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from ray_local import RUN_ARGS, assert_no_leak, ray_or_skip, ray_pids, ray_run_cfg  # also registers test/RayCount-v0

from agentrl.config.schema import load_config
from agentrl.distributed import RayConfig, plan
from agentrl.errors import ConfigError


def _cfg(*sets: str):
    """The run config of these tests, resolved by the plan as a run resolves it (auto device/dtype)."""
    from agentrl.config.plan import resolve

    return resolve(load_config([], [*RUN_ARGS, *sets]), "run").cfg


# -- without Ray -----------------------------------------------------------------------------------
def test_plan_colocate_shares_bundles():
    lay = plan(
        RayConfig(
            trainer_ranks=2,
            num_engines=1,
            workers_per_engine=2,
            trainer_cpus=1,
            engine_cpus=0.5,
            worker_cpus=0.25,
            placement="colocate",
        )
    )
    assert lay.bundles == [[{"CPU": 2.0}, {"CPU": 1.0}]]  # rank 0 + engine 0 + 2 workers; rank 1 alone
    assert [(s.group, s.bundle) for s in lay.trainer] == [(0, 0), (0, 1)]
    assert [(s.group, s.bundle) for s in lay.engines] == [(0, 0)]
    assert [(s.group, s.bundle) for s in lay.workers] == [(0, 0), (0, 0)]


def test_plan_split_separates_trainer_and_rollout_with_gpus():
    lay = plan(
        RayConfig(
            trainer_ranks=2, num_engines=3, workers_per_engine=1, trainer_gpus=1, engine_gpus=1, placement="split"
        )
    )
    assert lay.bundles[0] == [{"CPU": 0.5, "GPU": 1.0}] * 2
    assert lay.bundles[1] == [{"CPU": 0.75, "GPU": 1.0}] * 3
    assert {s.group for s in lay.trainer} == {0} and {s.group for s in lay.engines + lay.workers} == {1}
    assert [s.bundle for s in lay.workers] == [0, 1, 2]


def test_ray_mode_rejects_what_it_cannot_run():
    from agentrl.distributed.compute import check

    with pytest.raises(
        ConfigError, match="engine.num_servers: 2"
    ):  # engine.kind=sglang: tests/distributed/test_ray_sglang.py
        check(load_config([], ["engine.kind=sglang", "engine.num_servers=2"]), RayConfig())
    with pytest.raises(ConfigError, match="ray.address"):
        check(load_config([], []), RayConfig(address=" "))


# -- a local Ray instance --------------------------------------------------------------------------
@pytest.fixture(scope="class")
def ray_session():
    """One local Ray instance (2 CPUs) for a class of tests, shut down after it."""
    ray = ray_or_skip()
    from agentrl.distributed.cluster import RayCluster

    before = ray_pids()
    cluster = RayCluster(RayConfig(num_cpus=2))
    cluster.connect()  # Ray is installed: a failed connect is agentrl's (or Ray's) failure, never a skip
    print(f"\nray.init (local, 2 CPUs): {cluster.connect_s:.1f}s")
    yield ray
    cluster.close()
    assert not ray.is_initialized()
    assert_no_leak(before)


def _pg_of(info: dict) -> str:
    """The placement group Ray reports for an actor (its runtime context)."""
    assert info["placement_group"], f"actor not in a placement group: {info}"
    return info["placement_group"]


@pytest.mark.ray
class TestOnLocalRay:
    def test_colocated_actors_on_one_group_run_episodes_and_take_weights(self, ray_session, tiny_model_dir):
        from agentrl.distributed import RayCompute
        from agentrl.episodes.manager import make_specs

        ray = ray_session
        cfg = _cfg()
        rc = RayConfig(trainer_ranks=1, num_engines=1, workers_per_engine=2, placement="colocate")
        compute = RayCompute.start(cfg, tiny_model_dir, rc=rc)
        print(f"compute start: {compute.timings}")
        try:
            pg_hex = compute.cluster.groups[0].id.hex()
            where = ray.get([a.placement.remote() for a in compute.actors])
            assert [_pg_of(w) for w in where] == [pg_hex] * 4, where  # rank, engine, 2 workers
            assert len({w["pid"] for w in where}) == 4  # separate processes

            async def go():
                await compute.engine.start()
                first = await compute.episodes.collect(make_specs(3, 4, seed=1))
                sd = await asyncio.to_thread(compute.trainer.full_state_dict)
                sd = {k: v + 0.0 for k, v in sd.items()}
                await compute.engine.update_weights(sd, 7)
                second = await compute.episodes.collect(make_specs(1, 4, seed=1, start=10))
                return first, second

            first, second = asyncio.run(go())
            assert len(first) == 12 and all(t.trainable for t in first), [t.outcome_detail for t in first]
            assert all(t.num_sampled > 0 and set(t.versions[t.prompt_len :]) == {0} for t in first)
            assert all(set(t.versions[t.prompt_len :]) == {7} for t in second)  # the pushed version served
            assert compute.episodes.metrics.episodes == 16

            # A dead worker or engine ends its episodes as typed infra failures; the batch completes.
            ray.kill(compute.episodes.workers[0])
            third = asyncio.run(compute.episodes.collect(make_specs(4, 2, seed=2)))
            lost = [t for t in third if not t.trainable]
            assert lost and all(t.outcome == "engine_error" and "rollout worker 0" in t.outcome_detail for t in lost)
            assert len(third) == 8 and len(lost) < 8  # groups routed to worker 1 still ran
            ray.kill(compute.engine.actors[0])
            fourth = asyncio.run(compute.episodes.collect(make_specs(4, 2, seed=3)))
            assert len(fourth) == 8 and all(t.outcome == "engine_error" for t in fourth), [t.outcome for t in fourth]
            assert any("engine actor 0" in t.outcome_detail for t in fourth)
        finally:
            compute.close()
        assert ray.util.placement_group_table()[pg_hex]["state"] == "REMOVED"

    @pytest.mark.slow
    def test_two_ray_ranks_match_one_process(self, ray_session, tmp_path):
        """The non-Ray version of this check is tests/trainer/test_trainer_dist.py (torchrun)."""
        from trainer_dist import STEPS, config, run

        from agentrl.distributed import RayCompute
        from agentrl.trainer import Trainer
        from agentrl.warmstart.tiny_model import build_model

        ray = ray_session
        model_dir = str(build_model(tmp_path / "model", hidden_size=64, num_layers=2))
        cfg = _cfg()
        cfg.trainer = config()
        rc = RayConfig(trainer_ranks=2, placement="split")
        compute = RayCompute.start(cfg, model_dir, critic=True, rc=rc)
        try:
            groups = [g.id.hex() for g in compute.cluster.groups]
            ranks = ray.get([r.placement.remote() for r in compute.trainer.ranks])
            assert [_pg_of(w) for w in ranks] == [groups[0]] * 2
            engine = ray.get(compute.engine.actors[0].placement.remote())
            assert _pg_of(engine) == groups[1] != groups[0]
            assert compute.trainer.world == 2
            two = run(compute.trainer)
            p2 = compute.trainer.full_state_dict()
            compute.trainer.save(tmp_path / "ck", extra={"written_by": 2})
        finally:
            compute.close()

        with Trainer(model_dir, config(), critic=True) as t:
            one = run(t)
            p1 = t.full_state_dict()
        diff = max((p1[k] - p2[k]).abs().max().item() for k in p1)
        print(f"max |param(1 proc) - param(2 Ray ranks)| after {STEPS} steps: {diff:.3g}")
        assert p1.keys() == p2.keys() and diff < 1e-5
        for m1, m2 in zip(one["metrics"], two["metrics"]):
            for k in ("loss", "pg_loss", "kl", "entropy", "value_loss", "tokens", "loss_tokens"):
                assert m2[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-6), k
        worst = max(abs(a - b) for r1, r2 in zip(one["logprobs"], two["logprobs"]) for a, b in zip(r1, r2))
        assert worst < 1e-5
        with Trainer(model_dir, config(), critic=True) as u:
            assert u.load(tmp_path / "ck") == {"written_by": 2} and u.version == STEPS

    def test_a_failing_actor_fails_the_start_and_nothing_is_left(self, ray_session, tmp_path):
        from agentrl.distributed import RayCompute

        ray = ray_session
        with pytest.raises(Exception, match="no-such-model"):
            RayCompute.start(_cfg(), tmp_path / "no-such-model", rc=RayConfig(trainer_ranks=2))
        assert all(g["state"] == "REMOVED" for g in ray.util.placement_group_table().values())
        deadline = time.monotonic() + 60  # Ray's resource view catches up with removals asynchronously
        while ray.available_resources().get("CPU") != 2.0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ray.available_resources().get("CPU") == 2.0, ray.available_resources()  # all CPUs came back

    def test_an_impossible_layout_is_a_clear_error(self, ray_session, tiny_model_dir):
        from agentrl.distributed import RayCompute

        rc = RayConfig(trainer_ranks=1, trainer_cpus=64, startup_timeout_s=3)
        with pytest.raises(ConfigError, match=r"bundles \[\[\{'CPU': 64.75\}\]\] \(colocate\) could not be placed"):
            RayCompute.start(_cfg(), tiny_model_dir, rc=rc)
        assert not ray_session.util.placement_group_table() or all(
            g["state"] == "REMOVED" for g in ray_session.util.placement_group_table().values()
        )


# First in the Ray group: after an in-process local instance has run and shut down, attaching this process to an
# outside head failed (the trainer actor "never ran"), while the test alone passes; Ray's process-wide state
@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.first_in_group
def test_the_same_config_joins_a_running_cluster_via_RAY_ADDRESS(tiny_model_dir, tmp_path, monkeypatch):
    """A Ray head started apart (as on a cluster); RAY_ADDRESS points the unchanged config at it.
    The env class (tests/ray_local.py's CountEnv) reaches the workers by value (no shared import path)."""
    import os
    import shutil
    import signal
    import sys

    ray = ray_or_skip()
    from agentrl.distributed import RayCompute
    from agentrl.episodes.manager import make_specs

    cli = shutil.which("ray") or os.path.join(os.path.dirname(sys.executable), "ray")
    before = ray_pids()
    log = open(tmp_path / "head.log", "w")
    # --port=0: the head's GCS binds a port the OS picks (a port picked here could be taken before the
    # head bound it: EADDRINUSE); `ray start` then prints where it listens
    head = subprocess.Popen(
        [
            cli,
            "start",
            "--head",
            "--port=0",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--block",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # Ray 2.60's `ray start` turns token auth on once ~/.ray/auth_token exists (its first run writes it),
        # and a driver then needs RAY_AUTH_MODE=token: Ray's own login, kept out of this test of agentrl's attach
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    port = None
    try:
        deadline = time.monotonic() + 120
        while port is None:
            found = re.search(r"--address='[^']*:(\d+)'", (tmp_path / "head.log").read_text())
            if found:
                port = int(found.group(1))
            elif head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray head did not say where it listens: {(tmp_path / 'head.log').read_text()[-3000:]}")
            else:
                time.sleep(0.5)
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
        monkeypatch.chdir(tmp_path)  # the workers cannot import this test's module from the cwd either
        compute = None
        deadline = time.monotonic() + 120
        while compute is None:
            try:
                compute = RayCompute.start(_cfg(), tiny_model_dir, rc=RayConfig())
            except ConnectionError:
                if head.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"ray head did not come up: {(tmp_path / 'head.log').read_text()[-3000:]}")
                time.sleep(2)
        try:
            assert compute.cluster.address == f"127.0.0.1:{port}" and compute.cluster.owns_connection
            assert ray.get_runtime_context().gcs_address.endswith(f":{port}")

            async def go():
                await compute.engine.start()
                return await compute.episodes.collect(make_specs(2, 2))

            trajs = asyncio.run(go())
            assert len(trajs) == 4 and all(t.trainable for t in trajs), [t.outcome_detail for t in trajs]
        finally:
            compute.close()
        assert not ray.is_initialized()  # the driver left ...
        assert head.poll() is None  # ... and the cluster is still up
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # the head we started, and its raylet/gcs children
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        log.close()
        current = Path("/tmp/ray/ray_current_cluster")  # `ray start` recorded our head there
        if port is not None and current.exists() and current.read_text().strip().endswith(f":{port}"):
            current.unlink()
    assert_no_leak(before)


@pytest.mark.ray
@pytest.mark.slow
def test_agentrl_run_with_distributed_ray_completes_and_cleans_up(tiny_model_dir, tmp_path):
    """A shortened `agentrl run` (as in tests/jobs/test_runner.py) with distributed: ray: trains, syncs
    weights into the engine actors, checkpoints, evaluates, and leaves no Ray process behind."""
    ray = ray_or_skip()
    from agentrl.jobs.run import Runner

    before = ray_pids()
    out = tmp_path / "ray"
    t0 = time.perf_counter()
    summary = asyncio.run(Runner(ray_run_cfg(tiny_model_dir, out, "ray"), progress=False).run())
    print(f"\nagentrl run, distributed=ray, 3 steps: {time.perf_counter() - t0:.1f}s wall")
    assert not ray.is_initialized()
    assert_no_leak(before)
    assert summary["steps"] == 3 and summary["eval_solve_rate_end"] is not None
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward_mean" in r]
    assert len(steps) == 3 and all(r["rollout/infra_failures"] == 0 for r in steps)
    assert [r["train/version"] for r in steps] == [1.0, 2.0, 3.0]
    assert (out / "checkpoints" / "step_000002" / "COMPLETE").exists()
    assert "distributed: ray" in (out / "config.yaml").read_text()
    assert summary["rollout"]["episodes"] >= 3 * 2 * 4  # counted in the driver from the workers' results
