"""LocalSandbox: isolation layers, limits, statuses, sessions, file copy; the interface's backend choice.

Each behaviour runs in both local modes where it means something: ``bwrap`` (namespaces) and
``plain`` (bwrap=False: rlimits, a dedicated uid and private mount/net namespaces when root).
The hostile-input suite is tests/sandbox/test_sandbox_hostile.py.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import components
import pytest

from agentrl.errors import ConfigError, SandboxError
from agentrl.sandbox import ExecResult, Limits, Sandbox, make_sandbox, shared_sandbox, supports_sessions
from agentrl.sandbox.local import LocalSandbox, jail
from agentrl.sandbox.local import sandbox as local_mod
from agentrl.sandbox.subprocess_runner import SubprocessSandbox

ROOT = os.geteuid() == 0
BWRAP_REASON = LocalSandbox().bwrap_reason
MODES = [
    pytest.param(
        True,
        id="bwrap",
        marks=pytest.mark.skipif(BWRAP_REASON is not None, reason=components.reason("bwrap", str(BWRAP_REASON))),
    ),
    pytest.param(False, id="plain"),
]


@pytest.fixture(params=MODES)
def sb(request) -> LocalSandbox:
    return LocalSandbox(bwrap=request.param)


def py(code: str) -> dict:
    return {"argv": ["python3", "-"], "stdin": code.encode()}


def leftovers() -> tuple[list[str], list[str]]:
    dirs = [d for d in glob.glob(os.path.join(tempfile.gettempdir(), f"agentrl-sbx-{os.getpid()}-*"))]
    mounts = [ln for ln in open("/proc/mounts") if f"agentrl-sbx-{os.getpid()}-" in ln]
    return dirs, mounts


@pytest.fixture(autouse=True)
def no_leftovers():
    yield
    deadline = time.monotonic() + 5  # (without a dedicated uid the executor removes work dirs when idle)
    while leftovers() != ([], []) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert leftovers() == ([], [])


# ------------------------------------------------------------------------------ interface
def test_make_sandbox_choices(monkeypatch):
    assert isinstance(make_sandbox("local"), LocalSandbox)
    assert type(make_sandbox("subprocess")) is SubprocessSandbox
    with pytest.raises(ConfigError, match="auto.*docker.*local|local.*docker"):
        make_sandbox("podman")
    with pytest.raises(ConfigError, match="backend-specific"):
        make_sandbox("auto", bwrap=False)
    monkeypatch.setattr("agentrl.sandbox.factory.docker_unavailable_reason", lambda: "no daemon (test)")
    assert make_sandbox("auto", max_concurrency=3).name == "local"
    assert shared_sandbox("local") is shared_sandbox("local")
    assert shared_sandbox("local", max_concurrency=3) is not shared_sandbox("local")
    assert supports_sessions(make_sandbox("local")) and supports_sessions(make_sandbox("subprocess"))


def test_limits_validation():
    assert Limits().memory_mb == 512
    for bad in ({"memory_mb": 0}, {"pids": 1.5}, {"cpus": 0}, {"max_output_bytes": True}, {"cpus": float("nan")}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            Limits(**bad)


def test_result_defaults_are_backward_compatible():
    r = ExecResult("o", "e", 0, "ok", 0.1)
    assert r.files == {} and r.detail == "" and r.ok


class _OnlyRun(Sandbox):
    async def run(self, argv, *, stdin=None, timeout_s, files=None):
        raise SandboxError("x")


async def test_backend_without_sessions_says_so():
    assert not supports_sessions(_OnlyRun())
    with pytest.raises(NotImplementedError, match="no sessions"):
        await _OnlyRun().session()


def test_bwrap_required_but_missing_is_a_config_error(monkeypatch):
    monkeypatch.setattr(local_mod, "bwrap_unavailable_reason", lambda uid=None: "bwrap is not installed (test)")
    with pytest.raises(ConfigError, match="not installed"):
        LocalSandbox(bwrap=True)
    assert LocalSandbox().describe()["bwrap"] is False


# ------------------------------------------------------------------------------ who and where the program is
async def test_identity_and_view(sb):
    code = (
        "import os, json, socket; print(json.dumps({'uid': os.getuid(), 'cwd': os.getcwd(),"
        " 'env': dict(os.environ),"
        " 'pid': os.getpid(), 'host': socket.gethostname(), 'root': sorted(os.listdir('/')),"
        " 'limits': open('/proc/self/limits').read()}))"
    )
    r = await sb.run(**py(code), timeout_s=10)
    assert r.ok, r
    info = json.loads(r.stdout)
    assert set(info["env"]) <= {
        "PATH",
        "HOME",
        "TMPDIR",
        "LANG",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONUNBUFFERED",
        "LC_CTYPE",
        "PWD",
    }
    if ROOT:
        assert info["uid"] != 0
    if sb.bwrap:
        # bwrap maps the program to uid 1000; a warm python3 - (the executor's own view, as root) keeps its
        # dedicated uid, which no host file or process belongs to
        assert info["uid"] == 1000 or (ROOT and any(info["uid"] in r for r in jail.claimed_uid_ranges()))
        assert info["cwd"] == "/work" and info["host"] == "sandbox" and info["pid"] < 10
        # host folders show only where the trainer's Python prefix lives (pyenv in /root, a venv in /home)
        tops = {p.split("/")[1] for p in sb.describe()["python_prefixes"]}
        assert {"root", "home", "var", "opt"} & set(info["root"]) <= tops, (info["root"], tops)
    limits = info["limits"]
    assert "Max address space         536870912" in limits and "Max open files            256" in limits
    assert "Max cpu time              11" in limits and "Max core file size        0" in limits
    if ROOT:
        assert "Max processes             " + str(64 + (2 if sb.bwrap else 0)) in limits


async def test_works_from_a_parent_far_over_the_memory_limit(sb):
    import mmap

    reserve = mmap.mmap(-1, 4 << 30)  # 4 GB of address space, like a trainer (untouched: costs no RAM)
    try:
        r = await sb.run(**py("print('fine')"), timeout_s=10, limits=Limits(memory_mb=256))
        assert r.stdout == "fine\n", r
    finally:
        reserve.close()


async def test_trainers_python_is_available(sb):
    r = await sb.run(**py("import sys; print(sys.version_info[:2])"), timeout_s=10)
    assert r.stdout.strip() == str(sys.version_info[:2])
    assert sb.describe()["python_prefixes"], sb.describe()


async def test_host_files_are_protected(sb, tmp_path):
    target = tmp_path / "host.txt"
    target.write_text("host")
    os.chmod(tmp_path, 0o755)
    code = f"open({str(target)!r}, 'w').write('pwned')"
    r = await sb.run(**py(code), timeout_s=10)
    assert target.read_text() == "host" and r.exit_code == 1
    assert "Permission" in r.stderr or "No such file" in r.stderr


# ------------------------------------------------------------------------------ limits and statuses
async def test_memory_limit_is_oom(sb):
    r = await sb.run(**py("x = bytearray(2 * 1024**3)"), timeout_s=10, limits=Limits(memory_mb=256))
    assert r.status == "oom" and "256 MB" in r.detail and "MemoryError" in r.stderr


async def test_fsize_and_nofile(sb):
    r = await sb.run(**py("open('big', 'wb').write(b'x' * (3 << 20))"), timeout_s=10, limits=Limits(fsize_mb=2))
    assert r.status == "ok" and r.exit_code == 1 and "File too large" in r.stderr
    r = await sb.run(**py("fs = [open('f%d' % i, 'w') for i in range(100)]"), timeout_s=10, limits=Limits(nofile=32))
    assert r.exit_code == 1 and "Too many open files" in r.stderr


@pytest.mark.skipif(
    not ROOT,
    reason=components.reason("root", "pids (RLIMIT_NPROC) is enforced only with a dedicated uid, i.e. as root"),
)
async def test_pids_limit(sb):
    code = (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n"
        "            os._exit(0)\n        n += 1\nexcept OSError:\n    print(n)\n"
    )
    r = await sb.run(**py(code), timeout_s=20, limits=Limits(pids=10))
    assert r.status == "ok" and 5 <= int(r.stdout) <= 10, r


async def test_disk_limit(sb):
    if not sb.tmpfs:
        components.unavailable("root", "the work dir is size-capped only on a tmpfs work dir, i.e. as root")
    code = "for i in range(100):\n    open('f%d' % i, 'wb').write(b'x' * (1 << 20))"
    r = await sb.run(**py(code), timeout_s=10, limits=Limits(disk_mb=8))
    assert r.exit_code == 1 and "No space left" in r.stderr


async def test_signal_death_is_killed(sb):
    r = await sb.run(**py("import os, signal; os.kill(os.getpid(), signal.SIGABRT)"), timeout_s=10)
    assert (r.status, r.exit_code) == ("killed", -6)
    r = await sb.run(["sh", "-c", "exit 3"], timeout_s=10)
    assert (r.status, r.exit_code) == ("ok", 3)


async def test_missing_program_is_a_sandbox_error(sb):
    with pytest.raises(SandboxError):
        await sb.run(["/nonexistent/agentrl-binary"], timeout_s=5)


async def test_spoofed_bwrap_message_is_not_a_sandbox_error(sb):
    r = await sb.run(["sh", "-c", "echo 'bwrap: execvp x: No such file' >&2; exit 1"], timeout_s=5)
    assert (r.status, r.exit_code) == ("ok", 1)


async def test_output_cap_per_run(sb):
    r = await sb.run(["sh", "-c", "yes"], timeout_s=10, limits=Limits(max_output_bytes=100))
    assert r.status == "output_limit" and r.stdout == "y\n" * 50 and r.truncated


async def test_concurrent_runs_get_distinct_uids(sb):
    if sb.uid_base is None:
        components.unavailable("root", "dedicated uids need root")
    code = "import os, time; time.sleep(0.3); print(os.stat('.').st_uid)"
    rs = await asyncio.gather(*[sb.run(**py(code), timeout_s=10) for _ in range(4)])
    # as root every program runs in a jail of the executor, under its own dedicated uid (the bwrap
    # program, used without a dedicated uid, would show 1000 to each)
    assert len({r.stdout for r in rs}) == 4
    rs = await asyncio.gather(*[sb.run(["sh", "-c", "sleep 0.3; stat -c %u ."], timeout_s=10) for _ in range(4)])
    assert len({r.stdout for r in rs}) == 4, [r.stdout for r in rs]


# ------------------------------------------------------------------------------ files and sessions
async def test_files_in_and_collect_out(sb):
    code = (
        "import os\nopen('out.txt', 'w').write(open('in/data.txt').read().upper())\n"
        "os.symlink('/etc/passwd', 'leak')\nos.symlink('out.txt', 'alias')"
    )
    r = await sb.run(
        **py(code),
        files={"in/data.txt": b"hello"},
        timeout_s=10,
        collect=["out.txt", "alias", "leak", "../../etc/passwd", "nothere"],
    )
    assert r.ok, r
    assert r.files == {"out.txt": b"HELLO", "alias": b"HELLO"}
    assert "'leak'" in r.detail and "'nothere'" in r.detail and "'../../etc/passwd'" in r.detail


async def test_session_keeps_files_not_processes(sb):
    async with await sb.session(limits=Limits(memory_mb=300)) as s:
        await s.run(["sh", "-c", "echo 1 > state; (sleep 60 &) ; echo started"], timeout_s=5)
        mine = (
            "import os\ndef mine(p):\n    try:\n        return os.stat('/proc/' + p).st_uid == os.getuid() and "
            "'sleep' in open('/proc/%s/cmdline' % p).read()\n    except OSError:\n        return False\n"
            "print(open('state').read().strip(), len([p for p in os.listdir('/proc') if p.isdigit() and mine(p)]))"
        )
        r = await s.run(**py(mine), timeout_s=5)
        assert r.stdout.split() == ["1", "0"], r
        r = await s.run(["sh", "-c", "cat state"], files={"state": b"2"}, timeout_s=5, collect=["state"])
        assert r.stdout == "2" and r.files == {"state": b"2"}
        r = await s.run(**py("bytearray(400 * 1024**2)"), timeout_s=5)
        assert r.status == "oom"  # the session's limits apply to each run
    with pytest.raises(SandboxError, match="closed"):
        await s.run(["true"], timeout_s=5)
    await s.close()  # idempotent


async def test_session_file_copy_does_not_follow_links_the_program_planted(sb, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"host")
    async with await sb.session() as s:
        await s.run(["sh", "-c", f"ln -s {victim} cmd.sh; ln -s / d"], timeout_s=5)
        r = await s.run(["sh", "cmd.sh"], files={"cmd.sh": b"echo replaced", "d/x": b"1"}, timeout_s=5)
        assert r.stdout == "replaced\n" and victim.read_bytes() == b"host" and not os.path.exists("/x")


async def test_uids_are_released(sb):
    if sb.uid_base is None:
        components.unavailable("root", "dedicated uids need root")
    from agentrl.sandbox.local import jail

    before = set(jail._UIDS_IN_USE)
    s = await sb.session()
    await s.run(["true"], timeout_s=5)
    assert len(jail._UIDS_IN_USE) == len(before) + 1
    a, b = jail.take_uid(sb.uid_block), jail.take_uid(sb.uid_block)
    jail.give_uid(a)
    jail.give_uid(b)
    assert b == a + 1 and jail.take_uid(sb.uid_block) == b + 1  # round-robin: not the one just freed
    jail.give_uid(b + 1)
    await s.close()
    await sb.run(["true"], timeout_s=5)
    assert jail._UIDS_IN_USE == before


@pytest.mark.skipif(not ROOT, reason=components.reason("root", "dedicated uids need root"))
def test_uid_blocks_are_exclusive_between_processes():
    from agentrl.sandbox.local import jail

    mine = jail.claim_uid_block(1_600_000)
    code = "from agentrl.sandbox.local import jail; print(jail.claim_uid_block(1_600_000))"
    other = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert other != mine and other % jail.UID_RANGE == mine % jail.UID_RANGE


@pytest.mark.skipif(not ROOT, reason=components.reason("root", "tmpfs work dirs need root"))
def test_stale_workdirs_of_dead_trainers_are_removed():
    p = subprocess.Popen(["true"])
    p.wait()  # a pid that is surely dead now
    stale = tempfile.mkdtemp(prefix=f"agentrl-sbx-{p.pid}-")
    from agentrl.sandbox.local import jail

    jail.mount_tmpfs(stale, 1, 0)
    LocalSandbox(tmpfs=True)
    assert not os.path.exists(stale)
    assert not any(stale in ln for ln in open("/proc/mounts"))
