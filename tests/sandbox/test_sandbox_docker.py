"""The Docker sandbox against a real daemon: isolation flags, limits, typed statuses, pool, sessions.

Every test here starts real containers. Without a daemon and the image (``agentrl sandbox build``)
the module is skipped with the reason printed (``pytest -ra``); it never passes silently.
"""

import asyncio
import os
import time

import components
import pytest

from agentrl.errors import ConfigError, SandboxError
from agentrl.sandbox import STATUSES, Limits
from agentrl.sandbox.docker import unavailable_reason

REASON = unavailable_reason()
pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(REASON is not None, reason=components.reason("docker", f"docker sandbox unavailable: {REASON}")),
]

# A hang guard, not a timing test: a killed run comes back within its deadline plus this. The contract is
# "plus a few seconds" (~0.1 s here); a kill that failed would leave the run to the host deadline or
# forever. 30 s is far from both, on any loaded machine.
HANG_S = 30.0
# processes in the container as the program sees them: pid 1 (the executor) + this python = 2
NPROC = ["python3", "-c", "import os; print(sum(p.isdigit() for p in os.listdir('/proc')))"]


def _ours(run_id=None):
    from agentrl.sandbox.docker.daemon import list_containers

    return list_containers(run_id=run_id)


@pytest.fixture
async def sb():
    from agentrl.sandbox.docker import DockerSandbox

    s = DockerSandbox(pool_size=0, max_concurrency=4)
    yield s
    await s.aclose()
    assert _ours(s.run_id) == [], "containers left behind"


async def test_basic_exec_and_exit_code(sb):
    r = await sb.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout_s=10)
    assert (r.status, r.exit_code, r.stdout, r.stderr) == ("ok", 3, "out\n", "err\n")
    assert r.status in STATUSES and r.wall_s > 0 and not r.truncated and not r.ok
    assert (await sb.run(["true"], timeout_s=10)).ok


async def test_stdin_given_and_closed(sb):
    r = await sb.run(["python3", "-"], stdin=b"import sys\nprint(sum(map(int, '1 2 3'.split())))\n", timeout_s=10)
    assert r.ok and r.stdout == "6\n", r
    r = await sb.run(["cat"], timeout_s=10)  # no stdin: EOF at once (an open stdin: cat runs into the deadline)
    assert r.ok and r.stdout == "", r


async def test_missing_program_is_sandbox_error(sb):
    with pytest.raises(SandboxError, match="no-such-program"):
        await sb.run(["no-such-program"], timeout_s=10)
    with pytest.raises(ValueError):
        await sb.run([], timeout_s=10)
    with pytest.raises(ValueError):
        await sb.run(["true"], timeout_s=10, files={"../x": b""})


async def test_files_in_and_out_with_escape_refusal(sb):
    script = (
        "cat in/a.txt > out.txt; mkdir -p d; echo deep > d/e.txt; ln -s /etc/passwd abs; ln -s ../../etc/passwd up; "
        "ln -s d/e.txt inner; ln -s / root; mkfifo fifo; ln out.txt hard"
    )
    r = await sb.run(
        ["sh", "-c", script],
        files={"in/a.txt": b"hello\x00world"},
        timeout_s=10,
        collect=[
            "out.txt",
            "d/e.txt",
            "inner",
            "abs",
            "up",
            "root/etc/passwd",
            "fifo",
            "hard",
            "../x",
            "/etc/passwd",
            "missing",
            "d",
        ],
    )
    assert r.ok, r
    assert r.files["d/e.txt"] == b"deep\n" and r.files["inner"] == b"deep\n"  # a symlink inside stays allowed
    assert set(r.files) == {"d/e.txt", "inner"}  # out.txt has a second (hard) link: refused, like the rest
    for bad in ("abs", "up", "root/etc/passwd", "fifo", "hard", "../x", "/etc/passwd", "missing", "d", "out.txt"):
        assert repr(bad) in r.detail, (bad, r.detail)


async def test_environment_is_empty(sb, monkeypatch):
    monkeypatch.setenv("AGENTRL_CANARY", "canary-7f3a")
    r = await sb.run(["python3", "-c", "import os, json; print(json.dumps(dict(os.environ)))"], timeout_s=10)
    import json

    env = json.loads(r.stdout)
    assert set(env) <= {"PATH", "HOME", "LANG", "TMPDIR", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"}, env
    assert env["HOME"] == "/work" and "canary-7f3a" not in r.stdout
    r = await sb.run(
        ["sh", "-c", "cat /proc/1/environ; grep -r canary-7f3a /proc/*/environ 2>/dev/null; echo done"], timeout_s=10
    )
    assert "canary-7f3a" not in r.stdout and r.stdout.endswith("done\n")


async def test_network_is_off(sb):
    code = (
        "import socket\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2); print('CONNECTED')\n"
        "except OSError as e: print('refused', e.errno)\n"
        "import os; print(sorted(os.listdir('/sys/class/net')))\n"
    )
    r = await sb.run(["python3", "-c", code], timeout_s=10)
    assert r.ok and "CONNECTED" not in r.stdout and "['lo']" in r.stdout, r


async def test_read_only_root_non_root_user_no_caps(sb):
    r = await sb.run(
        [
            "sh",
            "-c",
            "id -u; id -g; grep -E '^(CapEff|CapBnd|CapPrm|NoNewPrivs)' /proc/self/status; "
            "touch /usr/x /etc/x /x /tmp/x 2>&1 | wc -l; touch /work/ok && echo writable",
        ],
        timeout_s=10,
    )
    lines = r.stdout.splitlines()
    assert lines[:2] == ["1000", "1000"], r
    status = dict(ln.split(":\t") for ln in lines[2:6])
    assert status == {
        "CapPrm": "0000000000000000",
        "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000",
        "NoNewPrivs": "1",
    }, status
    assert lines[6] == "4" and lines[7] == "writable"  # four refusals, the work dir writable
    r = await sb.run(["sh", "-c", "find / -xdev -perm /6000 -type f 2>/dev/null | wc -l"], timeout_s=20)
    assert r.stdout.strip() == "0"  # no setuid/setgid binaries in the image


async def test_memory_limit_is_oom(sb):
    r = await sb.run(["python3", "-c", "a = bytearray(10 * 2**30)"], timeout_s=20, limits=Limits(memory_mb=128))
    assert r.status == "oom", r
    r = await sb.run(
        ["python3", "-c", "x = []\nwhile True: x.append(bytearray(2**24))"], timeout_s=20, limits=Limits(memory_mb=128)
    )
    assert r.status == "oom" and r.exit_code == -9 and "OOM" in r.detail, r
    # the container survives and is reused (its own executor was not the victim)
    assert (await sb.run(["true"], timeout_s=10, limits=Limits(memory_mb=128))).ok


async def test_oom_of_a_container_already_removed_is_read_from_the_event_log(sb):
    """``auto_remove`` can take a container killed out of memory before its state is read (gVisor's
    sandbox dies as a whole): the daemon's event log still says ``oom``; a clean exit says nothing."""
    from agentrl.sandbox.docker.daemon import LABEL, LABEL_RUN

    client, since = sb.daemon.client, time.time()
    hog = "x = []\nwhile True: x.append(bytearray(2**24))"
    cids = {}
    for name, argv in {"hog": ["python3", "-c", hog], "clean": ["true"]}.items():
        c = client.containers.run(
            "agentrl-sandbox:latest", argv, detach=True, auto_remove=True, network_mode="none",
            mem_limit="64m", memswap_limit="64m", labels={LABEL: "1", LABEL_RUN: sb.run_id},
        )  # fmt: skip
        cids[name] = c.id
    deadline = time.monotonic() + 60
    while any(c["id"] in cids.values() for c in _ours(sb.run_id)) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert await sb.daemon.state(cids["hog"]) is None  # removed: its State is gone
    assert await sb.daemon.oom_event(cids["hog"], since) is True
    assert await sb.daemon.oom_event(cids["clean"], since) is False


async def test_pids_limit(sb):
    code = (
        "import subprocess\nprocs, failed = [], 0\n"
        "for _ in range(200):\n"
        "    try: procs.append(subprocess.Popen(['sleep', '30']))\n"
        "    except OSError: failed += 1\n"
        "print(len(procs), failed)\n"
    )
    r = await sb.run(["python3", "-c", code], timeout_s=20, limits=Limits(pids=32))
    started, failed = map(int, r.stdout.split())
    assert r.ok and started < 32 and failed > 0, r


async def test_fork_bomb_times_out_and_container_recovers(sb):
    bomb = "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n"
    t0 = time.monotonic()
    r = await sb.run(["python3", "-c", bomb], timeout_s=3, limits=Limits(pids=48))
    assert r.status == "timeout" and time.monotonic() - t0 < 3 + HANG_S, r
    r = await sb.run(NPROC, timeout_s=10, limits=Limits(pids=48))
    assert r.ok and int(r.stdout) == 2, r  # the bomb is gone


async def test_timeout_within_deadline(sb):
    for argv in (
        ["sleep", "100"],
        ["python3", "-c", "while True: pass"],
        ["sh", "-c", "trap '' TERM INT; setsid sleep 100 & sleep 100"],
    ):
        t0 = time.monotonic()
        r = await sb.run(argv, timeout_s=1.5)
        took = time.monotonic() - t0
        assert r.status == "timeout" and r.exit_code is None and took < 1.5 + HANG_S, (argv, r, took)
    r = await sb.run(NPROC, timeout_s=10)
    assert int(r.stdout) == 2, r  # the setsid escapee is gone too


async def test_output_limit(sb):
    r = await sb.run(
        ["python3", "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"],
        timeout_s=20,
        limits=Limits(max_output_bytes=10_000),
    )
    assert r.status == "output_limit" and r.truncated and len(r.stdout) == 10_000 and r.exit_code is None, r
    assert r.wall_s < 20, r  # the cap ended it, not the deadline
    r = await sb.run(["python3", "-c", "print('a' * 100)"], timeout_s=10, limits=Limits(max_output_bytes=10_000))
    assert r.ok and not r.truncated


async def test_signals_fsize_and_disk_full(sb):
    r = await sb.run(["python3", "-c", "import os; os.kill(os.getpid(), 11)"], timeout_s=10)
    assert (r.status, r.exit_code) == ("killed", -11), r
    r = await sb.run(["dd", "if=/dev/zero", "of=big", "bs=1M", "count=8"], timeout_s=10, limits=Limits(fsize_mb=4))
    assert r.status == "killed" and r.exit_code == -25 and "RLIMIT_FSIZE" in r.detail, r
    r = await sb.run(
        ["python3", "-c", "open('big', 'wb').write(b'x' * (8 * 2**20))"], timeout_s=10, limits=Limits(fsize_mb=4)
    )  # Python ignores SIGXFSZ: it sees EFBIG instead
    assert r.status == "ok" and r.exit_code == 1 and "File too large" in r.stderr, r
    r = await sb.run(
        ["sh", "-c", "dd if=/dev/zero of=fill bs=1M count=64 2>&1; stat -c %s fill"],
        timeout_s=20,
        limits=Limits(disk_mb=16, fsize_mb=64),
    )
    assert r.status == "ok" and "No space left" in r.stdout and r.stdout.split()[-1] == str(16 * 2**20), r


async def test_kill_everything_cannot_break_the_sandbox(sb):
    r = await sb.run(["sh", "-c", "kill -9 -1; kill -9 1; kill -STOP 1; kill -9 $PPID; echo alive"], timeout_s=10)
    assert r.ok and r.stdout == "alive\n", r
    r = await sb.run(["sh", "-c", "cat /proc/1/fd/1 2>&1 | head -c 80"], timeout_s=10)
    assert "Permission denied" in r.stdout, r  # the executor is not dumpable: its pipes are out of reach
    assert (await sb.run(["true"], timeout_s=10)).ok


async def test_session_keeps_files_not_processes(sb):
    async with await sb.session() as s:
        r1 = await s.run(
            ["sh", "-c", "echo 1 > state; (sleep 300 &); cat /proc/self/cgroup | tail -1"],
            timeout_s=10,
            files={"lib/helper.py": b"X = 41\n"},
        )
        r2 = await s.run(
            [
                "python3",
                "-c",
                "import sys; sys.path.insert(0, 'lib'); import helper; print(helper.X + int(open('state').read()))",
            ],
            timeout_s=10,
        )
        r3 = await s.run(NPROC, timeout_s=10)
        r4 = await s.run(["sh", "-c", "cat /proc/self/cgroup | tail -1"], timeout_s=10)
        assert r1.ok and r2.stdout == "42\n", (r1, r2)
        assert int(r3.stdout) == 2 and r4.stdout == r1.stdout  # same container, no leftover sleep
    with pytest.raises(SandboxError, match="closed"):
        await s.run(["true"], timeout_s=5)


async def test_reset_mode_cleans_between_uses(sb):
    dirty = (
        "echo secret > note; mkdir -p sub/deep; chmod 000 sub; echo x > /dev/shm/leak; "
        "python3 -c \"import os; os.setsid(); os.fork() or __import__('time').sleep(300)\" & "
        "cat /proc/self/cgroup | tail -1"
    )
    r1 = await sb.run(["sh", "-c", dirty], timeout_s=10)
    r2 = await sb.run(["sh", "-c", "ls -A /work /dev/shm; cat /proc/self/cgroup | tail -1"], timeout_s=10)
    r3 = await sb.run(NPROC, timeout_s=10)
    assert r2.stdout.splitlines()[-1] == r1.stdout.strip().splitlines()[-1], "expected the same (reused) container"
    assert "note" not in r2.stdout and "sub" not in r2.stdout and "leak" not in r2.stdout, r2
    assert int(r3.stdout) == 2


async def test_fresh_mode_new_container_each_run():
    from agentrl.sandbox.docker import DockerSandbox

    s = DockerSandbox(mode="fresh", pool_size=1, max_concurrency=2)
    try:
        cgroups = set()
        for _ in range(3):
            r = await s.run(["sh", "-c", "echo x > f; cat /proc/self/cgroup | tail -1"], timeout_s=10)
            cgroups.add(r.stdout)
        assert len(cgroups) == 3
    finally:
        await s.aclose()
    assert _ours(s.run_id) == []


async def test_limits_profiles_and_concurrency_cap(sb):
    # the container's own memory limit as its cgroup says it: cgroup v2 (memory.max, a private cgroup
    # namespace: Docker's default on v2) or v1 (memory/memory.limit_in_bytes); exactly one layout is there
    files = "/sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes"
    r = await sb.run(
        ["sh", "-c", f"for f in {files}; do [ -f $f ] && echo $f $(cat $f); done; true"],
        timeout_s=10,
        limits=Limits(memory_mb=200),
    )
    assert r.ok and len(r.stdout.splitlines()) == 1, r
    assert int(r.stdout.split()[1]) == 200 * 2**20, r
    results = await asyncio.gather(*[sb.run(["sh", "-c", f"echo {i}"], timeout_s=30) for i in range(24)])
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(24)]
    assert len(_ours(sb.run_id)) <= sb.max_concurrency + sb.pool_size + 1  # +1: the 200 MB profile's container


async def test_cancelled_run_leaves_nothing(sb):
    task = asyncio.ensure_future(sb.run(["sleep", "30"], timeout_s=60))
    await asyncio.sleep(1.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await sb.run(["true"], timeout_s=10)).ok


async def test_leaked_containers_removed_by_label_at_start():
    import docker

    from agentrl.sandbox.docker import DockerSandbox
    from agentrl.sandbox.docker.daemon import LABEL, LABEL_OWNER, LABEL_RUN
    from agentrl.sandbox.docker.image import DEFAULT_TAG

    client = docker.from_env()
    host = __import__("socket").gethostname()
    leaked = client.containers.run(
        DEFAULT_TAG,
        ["sleep", "300"],
        detach=True,
        network_mode="none",
        labels={LABEL: "1", LABEL_OWNER: f"{host}:999999999:0", LABEL_RUN: "leaked-test"},
    )
    alive = client.containers.run(
        DEFAULT_TAG,
        ["sleep", "300"],
        detach=True,
        network_mode="none",
        labels={LABEL: "1", LABEL_OWNER: f"other-host:{os.getpid()}:0", LABEL_RUN: "other-test"},
    )
    try:
        s = DockerSandbox(pool_size=0)
        await s.aclose()
        ids = {c["id"] for c in _ours()}
        assert leaked.id not in ids, "a container of a dead owner survived the start-up sweep"
        assert alive.id in ids, "another host's container must not be touched"
    finally:
        for c in (leaked, alive):
            try:
                c.remove(force=True)
            except (docker.errors.NotFound, docker.errors.APIError):
                pass  # gone, or another process's start-up sweep is removing it right now


def test_config_errors_name_the_value():
    from agentrl.sandbox.docker import DockerSandbox

    with pytest.raises(ConfigError, match="'sometimes'"):
        DockerSandbox(mode="sometimes")
    with pytest.raises(ConfigError, match="no-such-runtime"):
        DockerSandbox(runtime="no-such-runtime")
    with pytest.raises(ConfigError, match="pool_size"):
        DockerSandbox(pool_size=-1)
    with pytest.raises(SandboxError, match="agentrl sandbox build"):
        DockerSandbox(image="agentrl-sandbox:does-not-exist")
    assert "does-not-exist" in unavailable_reason(image="agentrl-sandbox:does-not-exist")


def test_container_spec_hardening():
    """The flags themselves, as the daemon sees them (inspect), not just as we asked."""
    import docker

    from agentrl.sandbox.docker.daemon import container_spec

    client = docker.from_env()
    spec = container_spec(
        client.api,
        "agentrl-sandbox:latest",
        Limits(memory_mb=256, cpus=0.5, pids=40),
        labels={"agentrl.sandbox": "1", "agentrl.sandbox.run": "spec-test"},
        runtime=None,
        ncpu=2,
    )
    cid = client.api.create_container(**spec)["Id"]
    try:
        info = client.api.inspect_container(cid)
        hc, cfg = info["HostConfig"], info["Config"]
        assert hc["NetworkMode"] == "none" and hc["ReadonlyRootfs"] and hc["CapDrop"] == ["ALL"]
        assert hc["SecurityOpt"] == ["no-new-privileges"] and hc["PidsLimit"] == 40
        assert hc["Memory"] == hc["MemorySwap"] == 256 * 2**20 and hc["NanoCpus"] == 5 * 10**8
        assert {u["Name"] for u in hc["Ulimits"]} == {"nofile", "fsize", "core"}
        assert hc["LogConfig"]["Type"] == "none" and hc["AutoRemove"] and "size=128m" in hc["Tmpfs"]["/work"]
        assert cfg["User"] == "1000:1000" and not hc.get("Privileged")
        assert {e.split("=")[0] for e in cfg["Env"]} <= {
            "PATH",
            "HOME",
            "LANG",
            "TMPDIR",
            "PYTHONDONTWRITEBYTECODE",
            "PYTHONUNBUFFERED",
        }
    finally:
        client.api.remove_container(cid, force=True)


def test_one_sandbox_across_event_loops():
    """A process-wide sandbox outlives ``asyncio.run`` calls: each loop gets its own pool, and the
    containers of a closed loop are removed."""
    from agentrl.sandbox.docker import DockerSandbox

    s = DockerSandbox(pool_size=1, max_concurrency=2)
    try:
        for i in range(3):
            r = asyncio.run(s.run(["sh", "-c", f"echo {i}"], timeout_s=10))
            assert r.stdout == f"{i}\n"
        deadline = time.monotonic() + 20
        while len(_ours(s.run_id)) > 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # the first loops' containers go away in the background
        assert len(_ours(s.run_id)) <= 2
    finally:
        asyncio.run(s.aclose())
    assert _ours(s.run_id) == []


def _runsc_reason():
    import docker

    client = docker.from_env()
    runtimes = sorted(client.info().get("Runtimes") or {})
    if "runsc" not in runtimes:
        return f"gVisor (runsc) is not registered with the Docker daemon (it has {runtimes})"
    try:  # registered but unable to run on this machine (no ptrace/KVM platform): not our code's fault
        client.containers.run("agentrl-sandbox:latest", ["true"], runtime="runsc", network_mode="none", remove=True)
    except docker.errors.DockerException as e:
        return f"gVisor (runsc) is registered but cannot run a container here: {str(e)[:300]}"
    return None


async def test_gvisor_runtime():
    """The same backend on gVisor's user-space kernel, where it is registered (CI registers it)."""
    reason = _runsc_reason()
    if reason is not None:
        components.unavailable("gvisor", reason)
    from agentrl.sandbox.docker import DockerSandbox

    s = DockerSandbox(pool_size=0, max_concurrency=2, runtime="runsc")
    try:
        r = await s.run(["sh", "-c", "dmesg | head -1; id -u; yes | head -2"], timeout_s=30)
        assert r.ok and "gVisor" in r.stdout and "1000\ny\ny\n" in r.stdout, r
        t0 = time.monotonic()
        r = await s.run(["sleep", "100"], timeout_s=1.5)
        assert r.status == "timeout" and time.monotonic() - t0 < 1.5 + HANG_S
        code = (
            "import subprocess\nok = fail = 0\nfor _ in range(60):\n"
            "    try: subprocess.Popen(['sleep', '30']); ok += 1\n    except OSError: fail += 1\nprint(ok, fail)"
        )
        r = await s.run(["python3", "-c", code], timeout_s=30, limits=Limits(pids=16))
        started, failed = map(int, r.stdout.split())
        assert started < 16 and failed > 0, r  # RLIMIT_NPROC inside gVisor (see container_spec)
        r = await s.run(
            ["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)"], timeout_s=20
        )
        assert r.exit_code == 1 and "Error" in r.stderr, r
        r = await s.run(["sh", "-c", "kill -TERM 1; kill -INT 1; kill -HUP 1; echo alive"], timeout_s=20)
        assert r.stdout == "alive\n", r
        r = await s.run(
            ["python3", "-c", "x = []\nwhile True: x.append(bytearray(2**24))"],
            timeout_s=30,
            limits=Limits(memory_mb=128),
        )
        assert r.status == "oom", r  # gVisor as a whole hits the cgroup: the container is replaced
    finally:
        await s.aclose()
    assert _ours(s.run_id) == []


async def test_session_survives_a_missing_program(sb):
    async with await sb.session() as s:
        await s.run(["sh", "-c", "echo kept > f"], timeout_s=10)
        with pytest.raises(SandboxError, match="no-such-program"):
            await s.run(["no-such-program"], timeout_s=10)
        r = await s.run(["cat", "f"], timeout_s=10)
        assert r.stdout == "kept\n"
