"""``distributed: ray`` with ``engine.kind: sglang``: engine actors that own real SGLang servers.

Without Ray or SGLang the tests that need them skip, saying why. The reaper (the watchdog that
kills an actor's server when the actor dies) is tested on plain processes without either.
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import components
import pytest
from ray_local import RUN_ARGS, assert_no_leak, ray_or_skip, ray_pids  # also registers test/RayCount-v0

from agentrl.config.schema import load_config
from agentrl.distributed.config import RayConfig
from agentrl.errors import ConfigError


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _group_members(pgid: int) -> set[int]:
    out = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True)
    return {int(p) for p in out.stdout.split()}


def _gone(pid: int) -> bool:
    """Neither the process nor any live member of a process group with that id is left (zombies
    count as gone: their parent, not the test, reaps them)."""
    return not _alive(pid) and not any(_alive(m) for m in _group_members(pid))


def _wait_gone(pids, timeout_s: float = 60.0) -> set[int]:
    """The pids (process groups) still alive after waiting up to ``timeout_s`` (a deadline, not a timing check)."""
    deadline = time.monotonic() + timeout_s
    left = {p for p in pids if not _gone(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = {p for p in left if not _gone(p)}
    return left


def _parent_and_session(pid: int) -> tuple[int, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[3])  # ppid, session id


# -- without Ray or SGLang ---------------------------------------------------------------------------
OWNER = textwrap.dedent("""
    import subprocess, sys, time
    from agentrl.common.reaper import Reaper
    r = Reaper()
    kept = subprocess.Popen(["sh", "-c", "sleep 1000 & sleep 1000"], start_new_session=True)
    dropped = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    r.watch(kept.pid); r.watch(dropped.pid); r.forget(dropped.pid)
    print(kept.pid, dropped.pid, r.pid, flush=True)
    time.sleep(1000)
""")


def test_the_reaper_kills_watched_groups_when_their_owner_is_sigkilled():
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    kept = dropped = reaper = None
    try:
        kept, dropped, reaper = map(int, owner.stdout.readline().split())
        deadline = time.monotonic() + 30
        while len(_group_members(kept)) < 3 and time.monotonic() < deadline:  # sh + its two sleeps
            time.sleep(0.1)
        assert len(_group_members(kept)) == 3
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        assert _wait_gone([kept]) == set(), f"watched group {kept} survived its owner: {_group_members(kept)}"
        assert _wait_gone([reaper]) == set(), "the watchdog did not exit after reaping"
        assert not _gone(dropped)  # forgotten: the owner stopped it itself, so it is never signalled
    finally:
        for pid in (kept, dropped):
            if pid is not None:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        owner.kill()


def test_ray_mode_takes_sglang_and_names_a_server_count_it_ignores():
    from agentrl.distributed.compute import check

    check(load_config([], ["engine.kind=sglang"]), RayConfig())
    check(load_config([], ["engine.kind=sglang", 'engine.urls=["http://127.0.0.1:1"]']), RayConfig())
    with pytest.raises(ConfigError, match="engine.num_servers: 2 .*ray.num_engines"):
        check(load_config([], ["engine.kind=sglang", "engine.num_servers=2"]), RayConfig())
    with pytest.raises(ConfigError, match="ray.server_host"):
        check(load_config([], ["engine.kind=sglang"]), RayConfig(server_host=" "))


# -- local Ray + real SGLang servers -----------------------------------------------------------------
def _sglang_or_skip():
    from agentrl.engine.sglang.server import unavailable_reason

    reason = unavailable_reason()
    if reason:
        components.unavailable("sglang", reason)


def _cfg(*sets: str):
    """Resolved by the plan as a run is (model.device auto -> cpu here: the servers run on CPU)."""
    from agentrl.config.plan import resolve

    return resolve(load_config([], [*RUN_ARGS, "engine.kind=sglang", "engine.max_total_tokens=4096", *sets]), "run").cfg


@pytest.mark.ray
@pytest.mark.sglang
@pytest.mark.timeout(900)
def test_the_actor_owns_its_server_serves_workers_over_http_and_a_killed_actor_leaves_no_server(sglang_model_dir):
    ray = ray_or_skip()
    _sglang_or_skip()
    from agentrl.distributed import RayCompute
    from agentrl.engine.base import SamplingParams
    from agentrl.episodes.manager import make_specs

    before = ray_pids()
    rc = RayConfig(num_cpus=2, num_engines=1, workers_per_engine=1, placement="colocate")
    compute = RayCompute.start(_cfg(), sglang_model_dir, rc=rc)
    server = reaper = None
    try:
        actor = compute.engine_actors[0]
        info, where = ray.get([actor.info.remote(), actor.placement.remote()])
        server, reaper = info["pid"], info["reaper_pid"]
        print(f"\nbackend start: {compute.timings}; engine actor {info}")
        # the server belongs to the actor: its child, in a session of its own; not the driver's
        assert info["actor_pid"] == where["pid"] != os.getpid()
        assert where["placement_group"] == compute.cluster.groups[0].id.hex()
        assert _parent_and_session(server) == (info["actor_pid"], server)
        assert compute.engine.urls == [info["url"]]

        async def go():
            await compute.engine.start()
            try:
                trajs = await compute.episodes.collect(make_specs(2, 4, seed=1))
                gen = await compute.engine.generate([1, 2, 3], SamplingParams(max_new_tokens=4))  # the driver's view
                counts = await asyncio.to_thread(ray.get, compute.episodes.workers[0].engine_counts.remote())
                # the server crashes: the driver's engine has its actor restart it, same URL
                os.killpg(server, signal.SIGKILL)
                again = await compute.engine.generate([1, 2, 3], SamplingParams(max_new_tokens=4))
                after = await compute.episodes.collect(make_specs(1, 4, seed=2))
            finally:
                await compute.engine.close()
            return trajs, gen, counts, again, after

        trajs, gen, counts, again, after = asyncio.run(go())
        assert len(trajs) == 8 and all(t.trainable for t in trajs), [t.outcome_detail for t in trajs]
        assert gen.info["server"] == info["url"] and len(gen.token_ids) == 4
        assert list(counts) == [info["url"]] and counts[info["url"]]["ok"] >= 8, counts  # straight to its server

        new = ray.get(actor.info.remote())
        print(f"after the crash: {new}; driver counters {compute.engine.router.totals()}")
        assert new["restarts"] == 1 and new["url"] == info["url"] and new["pid"] != server
        assert compute.engine.router.totals()["restarts"] == 1 and again.info["server"] == info["url"]
        assert _gone(server) and _parent_and_session(new["pid"]) == (info["actor_pid"], new["pid"])
        assert all(t.trainable for t in after), [t.outcome_detail for t in after]  # workers reach it again
        server = new["pid"]

        ray.kill(actor)  # SIGKILL: nothing runs in the actor; its watchdog must reap the server
        assert _wait_gone([server]) == set(), f"server group {server} outlived its killed actor"
        assert _wait_gone([reaper]) == set()
    finally:
        compute.close()
        if server is not None and not _gone(server):
            os.killpg(server, signal.SIGKILL)
            pytest.fail(f"server {server} was still running after close()")
    assert not ray.is_initialized()
    assert_no_leak(before)


@pytest.mark.ray
@pytest.mark.sglang
@pytest.mark.timeout(900)
def test_a_failed_start_stops_the_servers_already_launched(sglang_model_dir, tmp_path):
    """A rollout worker that cannot build its env fails the start after the engine actor launched
    its server; that server must go with the actors. The model is copied to a path of this test's
    own, so the servers seen are this test's (other tests' servers serve other paths)."""
    import shutil
    import threading

    ray = ray_or_skip()
    _sglang_or_skip()
    from agentrl.distributed import RayCompute

    model = shutil.copytree(sglang_model_dir, tmp_path / "model")
    seen: set[int] = set()
    stop = threading.Event()

    def spy():  # the server's pid while the start runs (it dies with the failed start)
        while not stop.is_set():
            out = subprocess.run(
                ["pgrep", "-f", f"sglang.launch_server --model-path {model} "], capture_output=True, text=True
            )
            seen.update(int(p) for p in out.stdout.split())
            time.sleep(0.2)

    before = ray_pids()
    t = threading.Thread(target=spy, daemon=True)
    t.start()
    try:
        with pytest.raises(Exception, match="not_an_arg"):
            RayCompute.start(_cfg("env.kwargs={not_an_arg: 1}"), model, rc=RayConfig(num_cpus=2))
    finally:
        stop.set()
        t.join()
    assert seen, "the engine actor never launched its server"
    assert _wait_gone(seen) == set(), f"servers {seen} outlived a failed start"
    assert not ray.is_initialized()
    assert_no_leak(before)


@pytest.mark.ray
@pytest.mark.sglang
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_agentrl_run_on_ray_with_sglang_engine_actors(sglang_model_dir, tmp_path):
    """A 2-step `agentrl run` with distributed=ray and engine.kind=sglang: episodes are served by the
    server the engine actor launched, each step's weights reach it (its weight_version moves), the
    summary is written, and no server, actor or Ray process is left."""
    ray = ray_or_skip()
    _sglang_or_skip()
    import httpx

    from agentrl.jobs.run import Runner

    probes: list[dict] = []

    class ProbedRunner(Runner):
        """Reads the servers' state after each weight push (the run itself is unchanged)."""

        async def _sync_weights(self) -> float:
            s = await super()._sync_weights()
            b = self.compute
            infos = await asyncio.to_thread(ray.get, [a.info.remote() for a in b.engine_actors])
            where = await asyncio.to_thread(ray.get, [a.placement.remote() for a in b.engine_actors])
            counts = await asyncio.to_thread(ray.get, [w.engine_counts.remote() for w in b.episodes.workers])
            async with httpx.AsyncClient(timeout=30) as c:
                versions = [(await c.get(i["url"] + "/model_info")).json()["weight_version"] for i in infos]
            probes.append(
                {
                    "infos": infos,
                    "where": where,
                    "counts": counts,
                    "versions": versions,
                    "owner": [_parent_and_session(i["pid"]) for i in infos],
                }
            )
            return s

    out = tmp_path / "run"
    cfg = load_config(
        [],
        [
            f"output_dir={out}",
            f"model.path={sglang_model_dir}",
            *RUN_ARGS,
            "engine.kind=sglang",
            "engine.max_total_tokens=4096",
            "train.groups_per_step=2",
            "train.steps=2",
            "train.max_staleness=0",
            "train.checkpoint_every=0",
            "eval.num_tasks=2",
            "eval.every=0",
            "eval.env_kwargs={}",
            "trainer.lr=1e-2",
            "trainer.loss_agg=token-mean",
            "logging.tensorboard=false",
            "distributed=ray",
            "ray.num_cpus=2",
            "ray.placement=colocate",
        ],
    )
    before = ray_pids()
    t0 = time.perf_counter()
    summary = asyncio.run(ProbedRunner(cfg, progress=False).run())
    print(f"\nagentrl run, distributed=ray, engine.kind=sglang, 2 steps: {time.perf_counter() - t0:.1f}s wall")
    print("probes:", json.dumps(probes, default=str)[:2000])

    assert len(probes) == 2
    info = probes[0]["infos"][0]
    url = info["url"]
    assert [p["versions"] for p in probes] == [["1"], ["2"]]  # the server serves each pushed version
    # the server process belongs to the engine actor (its child, own session), not to the driver
    assert probes[0]["where"][0]["pid"] == info["actor_pid"] != os.getpid()
    assert probes[0]["owner"] == [(info["actor_pid"], info["pid"])]
    # rollout workers sent their episodes straight to that server, and more of them for step 2
    ok = [sum(c[url]["ok"] for c in p["counts"]) for p in probes]
    assert 0 < ok[0] < ok[1], probes
    assert all(set(c) == {url} for p in probes for c in p["counts"])

    assert summary["steps"] == 2 and (out / "summary.json").exists()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward_mean" in r]
    assert [r["train/version"] for r in steps] == [1.0, 2.0]
    assert all(r["rollout/infra_failures"] == 0 for r in steps)
    second = [json.loads(line) for line in (out / "trajectories" / "step_000002.jsonl").read_text().splitlines()]
    sampled = {v for t in second for v in t["versions"] if v != -1}
    assert sampled == {1}, sampled  # staleness 0: step 2 was sampled by the weights pushed after step 1
    assert [p.name for p in (out / "weights").iterdir()] == ["v00000002"]

    assert _wait_gone([info["pid"], info["reaper_pid"]]) == set(), "a server or watchdog outlived the run"
    assert not ray.is_initialized()
    assert_no_leak(before)


@pytest.mark.ray
@pytest.mark.sglang
@pytest.mark.timeout(900)
def test_engine_urls_attach_driver_and_workers_to_external_servers(sglang_model_dir, tmp_path):
    """``engine.urls`` under Ray: no engine actors; workers and driver attach to the running server,
    weights pushed from the driver reach it, and closing the compute leaves the server (not ours) up."""
    ray = ray_or_skip()
    _sglang_or_skip()
    from conftest import start_sglang_or_skip

    from agentrl.distributed import RayCompute
    from agentrl.episodes.manager import make_specs
    from agentrl.weights.factory import make_weight_sync

    server = start_sglang_or_skip(sglang_model_dir, max_total_tokens=4096)
    before = ray_pids()
    try:
        cfg = _cfg(f'engine.urls=["{server.url}"]')
        compute = RayCompute.start(cfg, sglang_model_dir, rc=RayConfig(num_cpus=2, workers_per_engine=2))
        try:
            assert compute.engine_actors == [] and compute.engine.urls == [server.url]
            assert len(compute.episodes.workers) == 2 and len(compute.actors) == 3  # 1 rank + 2 workers

            async def go():
                await compute.engine.start()
                sync = make_weight_sync("disk", compute.engine, dir=tmp_path / "weights", model_path=sglang_model_dir)
                try:
                    first = await compute.episodes.collect(make_specs(4, 2, seed=1))
                    state = await asyncio.to_thread(compute.trainer.full_state_dict)
                    await sync.push({k: v + 0.0 for k, v in state.items()}, 3)
                    second = await compute.episodes.collect(make_specs(2, 2, seed=1, start=10))
                finally:
                    await sync.close()
                    await compute.engine.close()
                return first, second

            first, second = asyncio.run(go())
            assert all(t.trainable for t in first + second), [t.outcome_detail for t in first + second]
            assert all({v for v in t.versions if v != -1} == {0} for t in first)
            assert all({v for v in t.versions if v != -1} == {3} for t in second)  # the pushed weights served
            counts = ray.get([w.engine_counts.remote() for w in compute.episodes.workers])
            assert all(list(c) == [server.url] for c in counts)
            assert sum(c[server.url]["ok"] for c in counts) == 12, counts
        finally:
            compute.close()
        assert server.alive() and server.healthy(), "closing the compute must not stop an attached server"

        async def late_client():  # a worker's engine starting after a push must not relabel the server
            import httpx

            from agentrl.distributed.sglang_engines import SGLangClient
            from agentrl.engine.base import SamplingParams

            client = SGLangClient([server.url])
            try:
                gen = await client.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
            finally:
                await client.close()
            async with httpx.AsyncClient(timeout=30) as h:
                return gen, (await h.get(server.url + "/model_info")).json()["weight_version"]

        gen, label = asyncio.run(late_client())
        assert label == "3" and gen.versions == [3, 3], (label, gen.versions)  # a plain SGLangEngine pushes "0"
    finally:
        server.stop()
    assert not ray.is_initialized()
    assert_no_leak(before)


DRIVER = textwrap.dedent("""
    import json, sys
    sys.path[:0] = [{here!r}, {tests!r}]
    import ray
    from test_ray_sglang import _cfg
    from agentrl.distributed import RayCompute
    from agentrl.distributed.config import RayConfig
    compute = RayCompute.start(_cfg(), {model!r}, rc=RayConfig(num_cpus=2))
    print(json.dumps(ray.get(compute.engine_actors[0].ready.remote())), flush=True)
    sys.stdin.read()  # until the test kills this driver
""")


@pytest.mark.ray
@pytest.mark.sglang
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_sigkilled_driver_leaves_no_server(sglang_model_dir, tmp_path):
    """The crash the resume tests inject (SIGKILL of `agentrl run`), with SGLang engine actors: the
    local Ray instance goes with its driver, the actors with it, and each actor's watchdog then
    reaps its server."""
    ray_or_skip()
    _sglang_or_skip()
    before = ray_pids()
    code = DRIVER.format(
        here=str(Path(__file__).resolve().parent),
        tests=str(Path(__file__).resolve().parents[1]),
        model=str(sglang_model_dir),
    )
    log = open(tmp_path / "driver.log", "w")
    driver = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,
    )
    info = None
    try:
        line = driver.stdout.readline()
        assert line, f"the driver died: {(tmp_path / 'driver.log').read_text()[-3000:]}"
        info = json.loads(line)
        assert _alive(info["pid"])
        t0 = time.monotonic()
        driver.kill()  # SIGKILL the driver only: Ray and the actors must follow on their own
        driver.wait()
        assert _wait_gone([info["pid"], info["reaper_pid"]], timeout_s=120) == set(), (
            f"server {info['pid']} or its watchdog outlived a SIGKILLed driver"
        )
        t1 = time.monotonic()
        assert_no_leak(before)
        print(
            f"\nafter the driver's SIGKILL: server reaped in {t1 - t0:.1f}s, Ray gone in {time.monotonic() - t0:.1f}s"
        )
    finally:
        driver.kill()
        log.close()
        left = ray_pids() - before  # what the dead driver's Ray left (a failed check above): ours to stop
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if info is not None and not _gone(info["pid"]):
            os.killpg(info["pid"], signal.SIGKILL)
