"""The local backend's executor (agentrl.sandbox.local.executor, .client): programs are forked by a
single-threaded executor process, never by the trainer; the warm ``python3 -`` path behaves as a cold
interpreter; the executor's death is an infrastructure failure and it comes back; it dies with its
client. Runs in every isolation mode this machine has (bubblewrap, root without it)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import components
import pytest

from agentrl.errors import SandboxError
from agentrl.sandbox import make_sandbox
from agentrl.sandbox.local import bwrap_unavailable_reason
from agentrl.sandbox.local.client import executor

MODES = ["bwrap", "no-bwrap"]


@pytest.fixture(params=MODES)
def sb(request):
    if request.param == "bwrap" and bwrap_unavailable_reason() is not None:
        components.unavailable("bwrap", f"bubblewrap mode: {bwrap_unavailable_reason()}")
    return make_sandbox("local", bwrap=request.param == "bwrap")


def run(sb, code: str, **kw):
    return asyncio.run(
        sb.run(["python3", "-"], stdin=textwrap.dedent(code).encode(), timeout_s=kw.pop("timeout_s", 10), **kw)
    )


def test_the_trainer_process_never_forks(sb):
    forks = []
    os.register_at_fork(before=lambda: forks.append(os.getpid()))
    r = asyncio.run(sb.run(["sh", "-c", "echo $PPID"], timeout_s=10))
    r2 = run(sb, "import os; print(os.getppid())")
    assert r.ok and r2.ok
    mine = [p for p in forks if p == os.getpid()]
    assert mine == [], "the trainer forked to start a sandboxed program"
    assert int(r.stdout) != os.getpid() and int(r2.stdout) != os.getpid()


# Programs whose output must be the same from the warm fork and from a cold `python3 -`.
SAME = {
    "argv_name_path0": "import sys; print(sys.argv, __name__, repr(sys.path[0]))",
    "exit_code": "import sys; print('x'); sys.exit(3)",
    "exit_message": "import sys; sys.exit('bad things')",
    "exit_none": "raise SystemExit",
    "traceback": "def f():\n    1/0\nf()",
    "syntax_error": "def (:",
    "stdin_eof": "try:\n    input()\nexcept EOFError:\n    print('eof')",
    "environ": "import os; print(sorted(k for k in os.environ if k != 'PWD'))",
    "atexit_and_threads": (
        "import atexit, threading, time\natexit.register(lambda: print('atexit'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\nprint('main')"
    ),
    "unicode_out": "print('h\\u00e9llo \\u2603'); import sys; sys.stderr.write('\\udcff\\n')",
    "keyboard_interrupt": "raise KeyboardInterrupt",
    "file_too_large": "import resource\nopen('big', 'wb').write(b'x' * (1 << 21))\nprint('not reached')",
    "broken_pipe": "import os\nr, w = os.pipe()\nos.close(r)\ntry:\n    os.write(w, b'x')\nexcept BrokenPipeError:\n    print('EPIPE')",  # noqa: E501
}


@pytest.mark.parametrize("name", sorted(SAME))
def test_warm_python_matches_a_cold_interpreter(name):
    from agentrl.sandbox import Limits
    from agentrl.sandbox.local import sandbox as local

    sb = make_sandbox("local", bwrap=False, limits=Limits(fsize_mb=1))
    warm = run(sb, SAME[name])
    real = local._is_warm_python
    local._is_warm_python = lambda argv, env: False
    try:
        cold = run(sb, SAME[name])
    finally:
        local._is_warm_python = real
    assert (warm.status, warm.exit_code, warm.stdout) == (cold.status, cold.exit_code, cold.stdout)
    # tracebacks: same lines (a cold interpreter may word an exit-by-signal note its own way)
    assert warm.stderr.splitlines()[-1:] == cold.stderr.splitlines()[-1:]


def test_warm_calls_get_fresh_random_state_and_fresh_modules(sb):
    a = run(sb, "import random; print(random.random())")
    b = run(sb, "import random; print(random.random())")
    assert a.ok and b.ok and a.stdout != b.stdout
    c = run(sb, "import json; json.dumps = None; print('patched')")
    d = run(sb, "import json; print(json.dumps([1]))")
    assert c.ok and d.stdout.strip() == "[1]"


def test_a_program_sees_only_its_own_descriptors(sb):
    r = run(sb, "import os; print(sorted(int(f) for f in os.listdir('/proc/self/fd')))")
    assert r.ok, r
    fds = eval(r.stdout)
    assert set(fds) - {0, 1, 2} <= {3, 4}  # the listdir's own fd (and bwrap's status fd under bwrap)
    r = run(
        sb,
        """
        import os, socket
        for fd in range(3, 256):
            try:
                s = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            print('socket', fd, s.family)
    """,
    )
    assert r.ok and "socket" not in r.stdout, r.stdout


def test_the_executor_dying_is_an_infrastructure_failure_and_it_comes_back():
    sb = make_sandbox("local", bwrap=False)

    async def main():
        task = asyncio.ensure_future(sb.run(["sleep", "30"], timeout_s=60))
        await asyncio.sleep(0.5)
        os.kill(executor().pid, signal.SIGKILL)
        with pytest.raises(SandboxError, match="executor died"):
            await asyncio.wait_for(task, 20)
        r = await sb.run(["sh", "-c", "echo again"], timeout_s=10)
        assert r.ok and r.stdout == "again\n"

    asyncio.run(main())


def test_the_executor_and_its_programs_die_with_the_trainer(tmp_path):
    code = textwrap.dedent("""
        import asyncio, sys
        from agentrl.sandbox import make_sandbox
        from agentrl.sandbox.local.client import executor
        sb = make_sandbox("local", bwrap=False)
        async def main():
            t = asyncio.ensure_future(sb.run(["sleep", "1000"], timeout_s=2000))
            await asyncio.sleep(1)
            print(executor().pid, flush=True)
            await t
        asyncio.run(main())
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    ex_pid = int(proc.stdout.readline())
    sleepers = _pids_running("sleep 1000")
    assert sleepers, "the program did not start"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (_alive(ex_pid) or _pids_running("sleep 1000") & sleepers):
        time.sleep(0.1)
    assert not _alive(ex_pid), "the executor outlived its client"
    assert not _pids_running("sleep 1000") & sleepers, "a sandboxed program outlived the trainer"


def test_without_bwrap_as_root_a_run_has_its_own_pid_namespace():
    if os.geteuid() != 0:
        components.unavailable("root", "own pid namespaces need root (or bubblewrap)")
    sb = make_sandbox("local", bwrap=False)
    r = run(
        sb,
        """
        import os
        print(os.getpid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
    """,
    )
    assert r.ok, r
    pid, visible = r.stdout.split(" ", 1)
    assert int(pid) == 2 and eval(visible) == [1, 2]  # our init and the program: no host process
    r = asyncio.run(sb.run(["sh", "-c", "kill -SEGV $$"], timeout_s=10))
    assert r.status == "killed" and r.exit_code == -signal.SIGSEGV  # the init relays a death by signal


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except OSError:
        return False


def _pids_running(cmdline: str) -> set[int]:
    out = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if f.read().replace(b"\0", b" ").strip() == cmdline.encode() and _alive(int(name)):
                        out.add(int(name))
            except OSError:
                pass
    return out


def test_close_stops_the_executor_and_the_next_run_starts_a_new_one():
    sb = make_sandbox("local", bwrap=False)
    assert asyncio.run(sb.run(["true"], timeout_s=10)).ok
    ex = executor()
    old = ex.pid
    ex.close()
    deadline = time.monotonic() + 10
    while _alive(old) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(old)
    assert asyncio.run(sb.run(["true"], timeout_s=10)).ok and ex.pid != old


# ------------------------------------------------------------------------------ ready jails, connections
async def _ready_jail(kind_of_argv: list[str], sb) -> tuple[str, int]:
    """Run once (a cold jail), then wait for the executor to hand this loop a ready one: (kind, pid)."""
    assert (await sb.run(kind_of_argv, timeout_s=10)).ok
    conn = executor()._conn()
    for _ in range(200):
        ready = [(kind, pid) for kind, jails in conn.ready.items() for pid, _ in jails]
        if ready:
            return ready[0]
        await asyncio.sleep(0.05)
    raise AssertionError("no ready jail was handed over within 10 s")


def test_a_pause_readies_a_jail_and_the_next_run_takes_it(sb):
    async def main():
        kind, pid = await _ready_jail(["true"], sb)
        with open(f"/proc/{pid}/comm") as f:
            assert f.read().strip() == "agentrl-ready"
        r = await sb.run(["sh", "-c", "echo ran"], timeout_s=10)
        assert r.ok and r.stdout == "ran\n"
        conn = executor()._conn()
        assert pid not in [p for p, _ in conn.ready.get(kind, [])]
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:  # it ran the request and ended
            await asyncio.sleep(0.05)
        assert not _alive(pid)

    asyncio.run(main())


def test_a_ready_jail_that_died_is_passed_over(sb):
    async def main():
        kind, pid = await _ready_jail(["true"], sb)
        os.kill(pid, signal.SIGKILL)
        conn = executor()._conn()
        while pid in [p for p, _ in conn.ready.get(kind, [])]:  # the executor's note of its end
            await asyncio.sleep(0.01)
        r = await sb.run(["sh", "-c", "echo fine"], timeout_s=10)
        assert (r.status, r.stdout) == ("ok", "fine\n")

    asyncio.run(main())


def test_each_event_loop_has_its_own_connection_let_go_with_the_loop():
    sb = make_sandbox("local", bwrap=False)
    for _ in range(4):
        assert asyncio.run(sb.run(["true"], timeout_s=10)).ok
    ex = executor()
    assert len(ex._conns) <= 1  # the closed loops' connections (and their ready jails) were let go
    assert len(ex.fds()) <= 1 + 1 + 4  # the first socket, one connection, its ready jails' channels


def test_a_run_cancelled_as_it_starts_leaves_nothing(sb):
    async def main():
        for delay in (0, 0, 0.001, 0.005, 0.02):
            task = asyncio.ensure_future(sb.run(["sleep", "31.25"], timeout_s=60))
            await asyncio.sleep(delay)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    deadline = time.monotonic() + 10
    while _pids_running("sleep 31.25") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pids_running("sleep 31.25")


def test_a_one_shot_run_makes_its_work_dir_inside_its_jail(sb):
    if os.geteuid() != 0:
        components.unavailable("root", "work dirs inside a jail's own mount namespace need root")
    import glob
    import tempfile

    mine = os.path.join(tempfile.gettempdir(), f"agentrl-sbx-{os.getpid()}-*")

    async def main():
        task = asyncio.ensure_future(sb.run(["sh", "-c", "sleep 0.5; echo x > f; cat f; stat -c %u ."], timeout_s=10))
        await asyncio.sleep(0.2)
        seen = glob.glob(mine)  # no host directory (nor mount) for a run whose files nobody copies
        r = await task
        assert seen == [] and r.ok, (seen, r)
        assert r.stdout.split()[0] == "x" and int(r.stdout.split()[1]) != 0  # writable, owned by the run's uid
        r = await sb.run(["sh", "-c", "cat in"], files={"in": b"given"}, timeout_s=10)
        assert r.stdout == "given"  # files given: the trainer's work dir, bound in

    asyncio.run(main())


def test_no_nested_user_namespaces_in_bubblewraps_view():
    if os.geteuid() != 0:
        components.unavailable("root", "the executor builds bubblewrap's view as root")
    if bwrap_unavailable_reason() is not None:
        components.unavailable("bwrap", f"bubblewrap's view: {bwrap_unavailable_reason()}")
    sb = make_sandbox("local", bwrap=True)
    r = asyncio.run(sb.run(["sh", "-c", "unshare -U true && echo MADE || echo refused"], timeout_s=10))
    assert r.ok and r.stdout.strip() == "refused", r
    code = "import ctypes; print('MADE' if ctypes.CDLL(None).unshare(0x10000000) == 0 else 'refused')"
    r = run(sb, code)
    assert r.ok and r.stdout.strip() == "refused", r


def test_only_the_most_recently_used_kinds_keep_a_ready_jail():
    from agentrl.sandbox import Limits
    from agentrl.sandbox.local.executor import MAX_READY

    sb = make_sandbox("local", bwrap=False)

    async def settle(want: set[int]) -> set[int]:
        """The disk sizes with a ready jail once the executor's notes have caught up with ``want``
        (a run's result can reach us before the notes that drop and refill the ready jails)."""
        conn = executor()._conn()
        deadline = time.monotonic() + 10
        while True:
            ready = {int(re.search(r'"disk_mb": (\d+)', k)[1]) for k, v in conn.ready.items() if v}
            if ready == want or time.monotonic() > deadline:
                return ready
            await asyncio.sleep(0.05)

    async def main():
        kinds = [Limits(disk_mb=16 + i) for i in range(MAX_READY + 2)]  # a kind per disk size
        for limits in kinds:
            assert (await sb.run(["true"], timeout_s=10, limits=limits)).ok
        latest = {16 + i for i in range(2, MAX_READY + 2)}
        assert await settle(latest) == latest  # the two least recent let go
        assert (await sb.run(["true"], timeout_s=10, limits=kinds[0])).ok  # the oldest is used again
        want = {16} | latest - {18}  # it gets one back, the least recent of the others lets go
        assert await settle(want) == want

    asyncio.run(main())


def test_a_missing_program_in_a_ready_jail_is_an_error_and_the_next_jail_is_readied(sb):
    async def main():
        await _ready_jail(["true"], sb)
        with pytest.raises(SandboxError, match="agentrl-no-such-program"):
            await sb.run(["agentrl-no-such-program"], timeout_s=10)
        conn = executor()._conn()
        deadline = time.monotonic() + 10
        while not any(conn.ready.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert any(conn.ready.values()), "a failed request in a ready jail stopped the executor readying its kind"

    asyncio.run(main())


def test_work_dirs_handed_to_the_executor_are_removed_when_it_is_idle(tmp_path):
    ours = tmp_path / "agentrl-sbx-handed-over"
    (ours / "sub").mkdir(parents=True)
    (ours / "sub" / "f").write_text("x")
    other = tmp_path / "not-a-work-dir"
    other.mkdir()
    link = tmp_path / "agentrl-sbx-link"
    link.symlink_to(other)

    async def main():
        assert (await make_sandbox("local", bwrap=False).run(["true"], timeout_s=10)).ok
        for path in (ours, other, link):
            assert executor().discard(str(path))
        deadline = time.monotonic() + 10
        while ours.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)

    asyncio.run(main())
    assert not ours.exists()
    assert other.is_dir() and link.is_symlink()  # only real directories named as work dirs go
    assert not executor().discard(str(ours))  # no running loop: the caller removes it
