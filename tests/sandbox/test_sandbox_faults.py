"""Fault injection on the Docker sandbox (real daemon): containers killed or frozen under load,
the trainer dying, and a killed container ending an episode as ``sandbox_error``.

Skipped, with the reason printed, where no Docker daemon or sandbox image is available.
"""

import asyncio
import json
import os
import random
import subprocess
import sys
import time

import components
import pytest

from agentrl.errors import SandboxError
from agentrl.sandbox import STATUSES
from agentrl.sandbox.docker import unavailable_reason

REASON = unavailable_reason()
# A hang guard, not a timing test: how far past its deadline a run may come back. The contract is "a few
# seconds"; a run nobody ends waits for its program (sleep 60) or for ever. 30 s is far from both.
HANG_S = 30.0
pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(REASON is not None, reason=components.reason("docker", f"docker sandbox unavailable: {REASON}")),
]


def _ours(run_id):
    from agentrl.sandbox.docker.daemon import list_containers

    return list_containers(run_id=run_id)


def _docker():
    import docker

    return docker.from_env()


async def test_docker_kill_during_100_runs_typed_results_no_leak():
    """Kill containers (``docker kill``) while 100 runs go through a pool of 6: every run returns
    a typed result or raises SandboxError (and none hangs: HANG_S), runs after the kills succeed,
    and no container of the sandbox survives ``aclose``."""
    from agentrl.sandbox.docker import DockerSandbox

    sb = DockerSandbox(pool_size=0, max_concurrency=6)
    client = _docker()
    timeout_s, n = 5.0, 100
    outcomes: list[tuple[str, float, float]] = []  # (outcome, started, took)
    kill_times: list[float] = []

    gate = asyncio.Semaphore(6)  # the sandbox's own cap: time each run from when it can start

    async def one(i: int) -> None:
        async with gate:
            t0 = time.monotonic()
            try:
                r = await sb.run(["python3", "-c", f"import time; time.sleep(0.3); print({i})"], timeout_s=timeout_s)
                assert r.status in STATUSES
                outcome = r.status if r.status != "ok" or r.stdout == f"{i}\n" else "wrong-output"
            except SandboxError:
                outcome = "sandbox_error"
            outcomes.append((outcome, t0, time.monotonic() - t0))

    async def killer() -> None:
        rng = random.Random(3)
        await asyncio.sleep(1.0)
        for _ in range(4):
            ids = [c["id"] for c in await asyncio.to_thread(_ours, sb.run_id)]
            if ids:
                kill_times.append(time.monotonic())
                try:
                    await asyncio.to_thread(client.api.kill, rng.choice(ids))
                except Exception:  # noqa: BLE001 - it may have been replaced in between
                    pass
            await asyncio.sleep(0.7)

    try:
        await asyncio.gather(killer(), *[one(i) for i in range(n)])
    finally:
        await sb.aclose()
    assert len(outcomes) == n
    counts = {k: sum(1 for o, _, _ in outcomes if o == k) for k in {o for o, _, _ in outcomes}}
    print(f"100 runs under docker kill: {counts}, slowest {max(t for _, _, t in outcomes):.2f} s")
    assert set(counts) <= {"ok", "sandbox_error"}, counts
    assert counts.get("sandbox_error", 0) >= 1, f"no kill hit a running program: {counts}"
    assert counts["ok"] >= n - 4 * 6, counts
    assert max(t for _, _, t in outcomes) <= timeout_s + HANG_S, "a run outlived its deadline: a hang"
    late = [o for o, start, _ in outcomes if kill_times and start > kill_times[-1] + 1.0]
    assert late and all(o == "ok" for o in late), "runs after the last kill must succeed on replaced containers"
    assert _ours(sb.run_id) == [], "containers leaked"


async def test_every_run_bounded_when_killed_mid_run():
    """The deadline bound itself, without queueing: one container, killed during a long run."""
    from agentrl.sandbox.docker import DockerSandbox

    sb = DockerSandbox(pool_size=0, max_concurrency=1)
    client = _docker()
    try:
        for _ in range(3):
            task = asyncio.ensure_future(sb.run(["sleep", "60"], timeout_s=10))
            await asyncio.sleep(1.0)
            (cid,) = [c["id"] for c in _ours(sb.run_id)]
            t_kill = time.monotonic()
            await asyncio.to_thread(client.api.kill, cid)
            with pytest.raises(SandboxError, match="died during the run"):  # noticed, not timed out
                await task
            assert time.monotonic() - t_kill < HANG_S
            assert (await sb.run(["true"], timeout_s=10)).ok  # a new container takes over
    finally:
        await sb.aclose()
    assert _ours(sb.run_id) == []


async def test_frozen_container_hits_the_host_deadline():
    """``docker pause`` freezes the executor itself: only the host-side deadline can end the run."""
    from agentrl.sandbox.docker import DockerSandbox

    sb = DockerSandbox(pool_size=0, max_concurrency=1, host_grace_s=2.0)
    client = _docker()
    try:
        # warm one container first: on a loaded machine a cold start alone can outlast a 2 s deadline
        assert (await sb.run(["true"], timeout_s=60)).ok
        task = asyncio.ensure_future(sb.run(["sleep", "60"], timeout_s=2))
        for _ in range(300):  # wait for the container (slow to start on a loaded machine)
            await asyncio.sleep(0.1)
            ids = [c["id"] for c in _ours(sb.run_id)]
            if ids:
                break
        (cid,) = ids
        await asyncio.to_thread(client.api.pause, cid)
        t0 = time.monotonic()
        with pytest.raises(SandboxError, match="no answer from its executor"):  # the host deadline (2 + 2 s)
            await task
        assert time.monotonic() - t0 < 2 + 2.0 + HANG_S
        assert (await sb.run(["true"], timeout_s=10)).ok
    finally:
        await sb.aclose()
    assert _ours(sb.run_id) == []


def test_trainer_killed_leaves_no_container():
    """A trainer SIGKILLed with containers in use: its attach streams close, each executor reads
    EOF and exits, and ``auto_remove`` takes the containers away (no sweep needed)."""
    code = (
        "import asyncio, sys\n"
        "from agentrl.sandbox.docker import DockerSandbox\n"
        "async def main():\n"
        "    sb = DockerSandbox(pool_size=2, max_concurrency=2)\n"
        "    await sb.start()\n"
        "    print(sb.run_id, flush=True)\n"
        "    await sb.run(['sleep', '600'], timeout_s=600)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        run_id = proc.stdout.readline().strip()
        assert run_id, "the child sandbox did not start"
        deadline = time.monotonic() + 30
        while len(_ours(run_id)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_ours(run_id)) == 3  # two idle + one running `sleep 600`
    finally:
        os.kill(proc.pid, 9)
        proc.wait()
    deadline = time.monotonic() + 20
    while _ours(run_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ours(run_id) == [], "containers of a dead trainer outlived it"


# ---------------------------------------------------------------------------- episode level
def _call(code: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'python', 'arguments': {'code': code}})}\n</tool_call>"


@pytest.mark.parametrize("session", [False, True], ids=["one-shot", "session"])
def test_killed_container_ends_episode_as_sandbox_error(tiny_tokenizer, session):
    """EpisodeManager + FakeEngine + CodeExecEnv on the Docker sandbox; the container dies during
    the second tool call: the episode ends ``sandbox_error``, reward 0.0, and is not trainable."""
    from agentrl.config.schema import RolloutConfig
    from agentrl.engine.fake import FakeEngine
    from agentrl.envs.code_exec import CodeExecEnv
    from agentrl.episodes.manager import EpisodeManager, EpisodeSpec
    from agentrl.sandbox.docker import DockerSandbox
    from agentrl.trajectory import Outcome

    tok = tiny_tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    script = [
        _call("print(6 * 7)"),
        _call("import time\nprint('working', flush=True)\ntime.sleep(30)"),
        "The answer is \\boxed{42}.",
    ]

    def policy(prompt_ids, params, ctx):
        return tok.encode(script[min(ctx.call_index, len(script) - 1)], add_special_tokens=False) + [end]

    async def main():
        sb = DockerSandbox(pool_size=0, max_concurrency=1)
        client = _docker()

        async def kill_when_busy():
            # the second call's container: wait for the program to be running, then kill it
            for _ in range(400):
                await asyncio.sleep(0.05)
                if engine.calls >= 2:
                    break
            await asyncio.sleep(1.0)
            for c in await asyncio.to_thread(_ours, sb.run_id):
                await asyncio.to_thread(client.api.kill, c["id"])

        engine = FakeEngine(policy)
        mgr = EpisodeManager(
            engine,
            lambda: CodeExecEnv(sandbox=sb, session=session, code_timeout_s=20),
            tok,
            RolloutConfig(max_turns=4, turn_timeout_s=60),
            env_id="code_exec",
        )
        try:
            traj, _ = await asyncio.gather(mgr.run_episode(EpisodeSpec("g", 0, task_seed=1)), kill_when_busy())
        finally:
            await sb.aclose()
        assert _ours(sb.run_id) == []
        return traj

    traj = asyncio.run(main())
    assert traj.outcome == Outcome.SANDBOX_ERROR, (traj.outcome, traj.outcome_detail)
    assert traj.reward == 0.0 and not Outcome(traj.outcome).trainable and not traj.trainable
    assert "died during the run" in traj.outcome_detail
    tool_msgs = [m for m in traj.messages if m["role"] == "tool"]
    assert tool_msgs and "42" in tool_msgs[0]["content"]  # the first call ran normally
