"""Infrastructure faults in the middle of a real (shortened) ``agentrl run``: sandbox containers
killed over and over (``docker kill`` by the sandbox's owner label) while the code_exec env runs
on the docker backend, and the SGLang server SIGKILLed (its whole process group) between steps.

Asserted: the run finishes all its steps; every episode that failed for infrastructure reasons is
excluded from training and counted (per step ``credit/excluded == rollout/infra_failures`` and
``credit/samples`` = episodes - failures; the run summary's outcome counts hold them as
``sandbox_error`` / ``engine_error``); steps after the fault train again; and nothing is left
behind: no container of this process, no SGLang process of the run, no new child process, no new
file descriptor.

Real pieces throughout (Runner, trainer, EpisodeManager, env, sandbox, engine); only the faults
are injected, from a background thread, without touching agentrl code. Each test skips, saying
why, where docker or SGLang cannot run here.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import threading
import time
from urllib.parse import urlparse

import components
import leak_probe
import pytest
import short_run  # noqa: F401  (registers test/Short-v0)

from agentrl.config.schema import load_config
from agentrl.jobs.run import Runner


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def assert_failures_excluded_and_counted(out, summary: dict, steps: int, per_step: int, outcome: str) -> int:
    """Per trained step: the excluded episodes are exactly the infra failures, and every other
    episode became a sample; returns the number of failures seen by training."""
    rows = [r for r in _rows(out) if "rollout/infra_failures" in r]
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), [r["step"] for r in rows]
    for r in rows:
        failed = int(r["rollout/infra_failures"])
        assert r["credit/excluded"] == failed, r
        assert r["credit/samples"] == per_step - failed, r
    failed = sum(int(r["rollout/infra_failures"]) for r in rows)
    counted = summary["rollout"]["outcomes"]
    assert counted.get(outcome, 0) >= 1, f"no {outcome} episode: the fault never hit a running episode ({counted})"
    assert failed >= 1, f"training never saw a failed episode: {[r['rollout/infra_failures'] for r in rows]}"
    assert sum(v for k, v in counted.items() if k in ("sandbox_error", "engine_error", "tool_timeout")) >= failed
    assert rows[-1]["credit/samples"] > 0, "the last step trained nothing: the run did not recover"
    print(f"per step infra failures: {[int(r['rollout/infra_failures']) for r in rows]}; outcomes {counted}")
    return failed


# --------------------------------------------------------------------------------- sandboxes
@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_docker_containers_killed_during_run(tmp_path):
    """code_exec on the docker sandbox with the built-in (tool-calling) model; a thread kills every
    container of this process every second until the last step. Each killed program ends its
    episode ``sandbox_error``; the last step, without kills, trains on replaced containers."""
    from agentrl.sandbox import docker_unavailable_reason, shared_sandbox
    from agentrl.sandbox.factory import _SHARED

    reason = docker_unavailable_reason()
    if reason is not None:
        components.unavailable("docker", f"docker backend unavailable: {reason}")
    import docker

    client = docker.from_env()
    opts = {"pool_size": 1, "max_concurrency": 8}
    G, groups, steps = 4, 2, 3
    out = tmp_path / "run"
    cfg = load_config(
        [],
        [
            f"output_dir={out}",
            "env.id=code_exec",
            "env.kwargs={sandbox_backend: docker, sandbox_options: {pool_size: 1, max_concurrency: 8}, code_timeout_s: 10}",  # noqa: E501
            "rollout.max_turns=3",
            "rollout.max_new_tokens=96",
            f"rollout.group_size={G}",
            "rollout.turn_timeout_s=120",
            f"train.groups_per_step={groups}",
            f"train.steps={steps}",
            "train.max_staleness=0",
            "train.checkpoint_every=0",
            "eval.num_tasks=0",
            "logging.tensorboard=false",
        ],
    )
    runner = Runner(cfg, progress=False)
    gc.collect()
    fds0, kids0 = leak_probe.fds(), leak_probe.children()
    # earlier tests in this process may keep their own shared sandboxes' warm containers (closed at
    # exit): only containers this run adds count as leaks
    others = set(leak_probe.our_containers())
    stop, kills = threading.Event(), []

    def killer() -> None:  # kills until the last step's batch starts: that one shows the recovery
        while not stop.wait(1.0) and runner.step < steps - 1:
            for cid in set(leak_probe.our_containers()) - others:
                try:
                    client.api.kill(cid)
                    kills.append(cid)
                except docker.errors.APIError:  # gone already (replaced, or removed by the pool)
                    pass

    try:
        summary = _run_while(runner, killer, stop)
    finally:
        sb = _SHARED.pop(("docker", tuple(sorted(opts.items()))), None) or shared_sandbox("docker", **opts)
        asyncio.run(sb.aclose())  # the shared sandbox lives as long as the process; close it to count leaks
        client.close()
    assert summary["steps"] == steps
    print(f"{len(kills)} containers killed")
    assert kills, "no container was ever seen: did the model call the tool?"
    assert_failures_excluded_and_counted(out, summary, steps, G * groups, "sandbox_error")
    # killed/closed containers are removed by the daemon asynchronously (auto-remove): allow it 30 s
    deadline = time.monotonic() + 30
    while set(leak_probe.our_containers()) - others and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sorted(set(leak_probe.our_containers()) - others) == []
    _assert_no_new_children_or_fds(kids0, fds0)


# ------------------------------------------------------------------------------------ engine
def _server_pgids(port: int) -> set[int]:
    """Process groups of SGLang servers listening on ``port`` (the launcher gives each its own)."""
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = open(f"/proc/{name}/cmdline", "rb").read().split(b"\0")
            if (
                b"sglang.launch_server" in cmd
                and b"--port" in cmd
                and cmd[cmd.index(b"--port") + 1] == str(port).encode()
            ):
                out.add(os.getpgid(int(name)))
        except (OSError, ValueError, IndexError):
            continue
    return out


@pytest.mark.sglang
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_sglang_server_killed_during_run(sglang_model_dir, tmp_path):
    """``engine.kind=sglang`` run; after step 1 the server's process group gets SIGKILL while
    requests of the next batch are in flight. The engine restarts it (reloading the pushed
    weights); the requests caught by the crash, and those sent while it restarts, pass the 8 s
    turn deadline (a restart takes longer: importing SGLang alone takes ~10 s here; with 20 s an
    idle machine restarted in time and no episode failed) and end ``engine_error``; the weight push
    waits for the restart; the steps after it train again."""
    from agentrl.engine.sglang.server import unavailable_reason

    reason = unavailable_reason()
    if reason:
        components.unavailable("sglang", reason)
    G, groups, steps = 4, 2, 8
    out = tmp_path / "run"
    cfg = load_config(
        [],
        [
            f"output_dir={out}",
            f"model.path={sglang_model_dir}",
            "env.id=test/Short-v0",
            "env.kwargs={}",
            "engine.kind=sglang",
            "rollout.max_new_tokens=6",
            "rollout.max_turns=1",
            "rollout.score_truncated=true",
            f"rollout.group_size={G}",
            "rollout.turn_timeout_s=8",
            f"train.groups_per_step={groups}",
            f"train.steps={steps}",
            "train.max_staleness=0",
            "train.checkpoint_every=0",
            "eval.num_tasks=0",
            "trainer.lr=1e-2",
            "trainer.loss_agg=token-mean",
            "logging.tensorboard=false",
        ],
    )
    runner = Runner(cfg, progress=False)
    gc.collect()
    fds0, kids0 = leak_probe.fds(), leak_probe.children()
    stop, seen, killed, scanned = threading.Event(), set(), [], [0.0]

    def killer() -> None:
        while not stop.wait(0.005):
            engine = getattr(runner, "engine", None)
            if engine is None or not getattr(engine, "urls", None):
                continue
            if time.monotonic() - scanned[0] > 0.5:
                seen.update(_server_pgids(urlparse(engine.urls[0]).port))
                scanned[0] = time.monotonic()
            busy = sum(b.inflight for b in engine.router.backends)  # requests awaiting an answer
            if not killed and runner.step >= 1 and seen and busy:
                pgid = max(seen)
                os.killpg(pgid, signal.SIGKILL)
                killed.append((pgid, runner.step))

    summary = _run_while(runner, killer, stop)
    assert killed, "the server was never killed"
    print(f"killed process group {killed[0][0]} after step {killed[0][1]}; server process groups seen {sorted(seen)}")
    assert summary["steps"] == steps
    assert_failures_excluded_and_counted(out, summary, steps, G * groups, "engine_error")
    assert len(seen) >= 2, f"no restarted server was seen (process groups {seen})"
    left = {pg: leak_probe.in_group(pg) for pg in seen}
    assert not any(left.values()), f"SGLang processes outlived the run: {left}"
    _assert_no_new_children_or_fds(kids0, fds0)


@pytest.mark.sglang
@pytest.mark.timeout(900)
def test_weight_push_to_a_crashed_server_recovers_it(sglang_server):
    """The server dies while no request is in flight (e.g. during a train step): the next weight
    push (pause -> load -> resume) finds it dead, restarts it and goes through; generation works.
    On the session's server: the restart brings it back with its own weights."""
    from agentrl.engine.base import SamplingParams
    from agentrl.engine.sglang.engine import SGLangEngine

    pgid = sglang_server.proc.pid

    async def main() -> None:
        engine = SGLangEngine(servers=[sglang_server])
        try:
            await engine.start()
            assert (await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))).token_ids
            os.killpg(pgid, signal.SIGKILL)
            await engine.pause()
            await engine.resume()
            assert engine.router.totals()["restarts"] == 1
            assert (await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))).token_ids
        finally:
            await engine.close()

    asyncio.run(main())
    assert not leak_probe.in_group(pgid), "the killed server's processes outlived it"
    assert sglang_server.proc.pid != pgid and sglang_server.healthy()


def _run_while(runner, killer, stop: threading.Event) -> dict:
    """``runner.run()`` with ``killer`` running in a thread until the run ends (``stop`` is set then)."""
    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        return asyncio.run(runner.run())
    finally:
        stop.set()
        t.join()


def _assert_no_new_children_or_fds(kids0: set[int], fds0: dict[str, str]) -> None:
    deadline = time.monotonic() + 10
    while leak_probe.children() - kids0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leak_probe.children() - kids0 == set(), "child processes outlived the run"

    # Known, fault-independent: matplotlib keeps the fonts of the curve plot open (its font cache),
    # and every Runner.run leaves the trainer's gloo process group's epoll + pipe pair + socket
    # open (also without faults: measured on a plain run). Anything beyond that is a leak here.
    # fds are process-wide: one that another thread of this pytest process holds for a moment
    # (seen once in CI: a 5th fd, gone on a rerun) must close within the wait to pass.
    def extra() -> dict[str, str]:
        gc.collect()
        return {fd: t for fd, t in leak_probe.new_fds(fds0, leak_probe.fds()).items() if "matplotlib" not in t}

    def ok(left: dict[str, str]) -> bool:
        kinds = sorted(t.split(":")[0] for t in left.values())
        return len(left) <= 4 and set(kinds) <= {"anon_inode", "pipe", "socket"} and kinds.count("socket") <= 1

    deadline = time.monotonic() + 10
    while not ok(left := extra()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ok(left), "new fds after the run: " + ", ".join(f"{fd}={t}" for fd, t in sorted(left.items()))
