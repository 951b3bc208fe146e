"""SubprocessSandbox: statuses, deadlines, process-group cleanup, env, files, caps; python/bash tools."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from agentrl.errors import SandboxError
from agentrl.sandbox import ExecResult, Sandbox, default_sandbox
from agentrl.sandbox.subprocess_runner import SubprocessSandbox
from agentrl.tools import format_exec_result
from agentrl.tools.bash import make_bash_tool
from agentrl.tools.python import make_python_tool

PY = sys.executable  # for the plain SubprocessSandbox only: it runs on the host, where this interpreter is


def _gone(pid: int) -> bool:
    """Dead or a zombie (PID 1 in a container may never reap orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


async def _wait_gone(pid: int, within: float = 2.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        await asyncio.sleep(0.02)
    return _gone(pid)


@pytest.fixture
def sb() -> SubprocessSandbox:
    return SubprocessSandbox()


async def test_stdout_stderr_and_exit_code(sb):
    r = await sb.run([PY, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"], timeout_s=10)
    assert (r.stdout, r.stderr, r.exit_code, r.status, r.truncated) == ("out\n", "err\n", 3, "ok", False)
    assert not r.ok and r.wall_s > 0


async def test_env_is_empty_except_basics(sb, monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "hunter2")
    r = await sb.run([PY, "-c", "import os, json; print(json.dumps(dict(os.environ)))"], timeout_s=10)
    import json

    env = json.loads(r.stdout)
    assert "AGENTRL_TEST_SECRET" not in env
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "LC_CTYPE"}
    assert env["HOME"] == env["TMPDIR"]


async def test_workdir_files_and_cleanup(sb):
    r = await sb.run(
        [PY, "main.py"],
        timeout_s=10,
        files={"main.py": b"import os; print(os.getcwd()); print(open('d/x.txt').read())", "d/x.txt": b"data"},
    )
    cwd, data = r.stdout.split()
    assert data == "data" and not os.path.exists(cwd)


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "a/../../b", ""])
async def test_bad_file_names_rejected(sb, name):
    with pytest.raises(ValueError):
        await sb.run([PY, "-c", "pass"], timeout_s=5, files={name: b"x"})


async def test_stdin_given_and_closed(sb):
    r = await sb.run([PY, "-c", "import sys; print(sys.stdin.read().upper())"], stdin=b"abc", timeout_s=10)
    assert r.stdout == "ABC\n"
    r = await sb.run([PY, "-c", "import sys; print(repr(sys.stdin.read()))"], timeout_s=10)
    assert (r.status, r.stdout) == ("ok", "''\n"), r  # EOF at once (an open stdin: the read runs into the deadline)


@pytest.mark.parametrize("code", ["while True: pass", "import time; time.sleep(100)"])
async def test_timeout_kills(sb, code):
    t0 = time.monotonic()
    r = await sb.run([PY, "-c", code], timeout_s=0.5)
    assert r.status == "timeout" and r.exit_code is None
    # a hang guard, not a timing test: back at ~0.5 s; a kill that failed would wait 100 s or for ever
    assert time.monotonic() - t0 < 0.5 + 30


async def test_background_children_are_killed_after_normal_exit(sb):
    r = await sb.run(["bash", "-c", "sleep 987 & echo $!"], timeout_s=10)
    assert r.status == "ok" and r.exit_code == 0
    assert r.wall_s < 10  # did not wait for the orphan to close its pipes (that runs into the deadline)
    assert await _wait_gone(int(r.stdout))


async def test_whole_group_killed_at_deadline(sb, tmp_path):
    pidfile = tmp_path / "pid"
    script = f"sleep 999 & echo $! > {pidfile}; wait"
    r = await sb.run(["bash", "-c", script], timeout_s=0.5)
    assert r.status == "timeout"
    assert await _wait_gone(int(pidfile.read_text()))


async def test_cancellation_kills_the_program(sb, tmp_path):
    pidfile = tmp_path / "pid"
    code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    task = asyncio.ensure_future(sb.run([PY, "-c", code], timeout_s=60))
    for _ in range(200):
        if pidfile.exists() and pidfile.read_text():
            break
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _wait_gone(int(pidfile.read_text()))


async def test_output_flood_is_capped_and_killed():
    sb = SubprocessSandbox(max_output_bytes=1000)
    r = await sb.run([PY, "-c", "import sys\nwhile True: sys.stdout.write('x' * 4096)"], timeout_s=10)
    assert r.status == "output_limit" and r.truncated and r.exit_code is None
    assert r.stdout == "x" * 1000
    assert r.wall_s < 10  # the cap ended it, not the deadline


async def test_output_exactly_at_cap_is_fine():
    sb = SubprocessSandbox(max_output_bytes=1000)
    r = await sb.run([PY, "-c", "import sys; sys.stdout.write('y' * 1000)"], timeout_s=10)
    assert r.status == "ok" and not r.truncated and len(r.stdout) == 1000


async def test_signal_death_and_invalid_utf8(sb):
    r = await sb.run([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"], timeout_s=10)
    assert r.status == "killed" and r.exit_code == -11
    r = await sb.run([PY, "-c", "import sys; sys.stdout.buffer.write(b'a\\xff\\x00b')"], timeout_s=10)
    assert r.stdout == "a\ufffd\x00b"


async def test_start_failure_is_sandbox_error(sb):
    with pytest.raises(SandboxError, match="cannot start"):
        await sb.run(["/nonexistent/agentrl-binary"], timeout_s=5)


async def test_concurrency_is_bounded():
    sb = SubprocessSandbox(max_concurrency=2)
    t0 = time.monotonic()
    rs = await asyncio.gather(*[sb.run(["sleep", "0.3"], timeout_s=10) for _ in range(6)])
    assert all(r.status == "ok" for r in rs)
    assert time.monotonic() - t0 >= 0.85  # three waves of two


def test_same_sandbox_from_two_event_loops():
    sb = default_sandbox()
    assert sb is default_sandbox()
    for _ in range(2):  # a semaphore bound to the first loop would break the second
        # `python3` from the sandbox's PATH, as the python tool runs it: this test is about event loops,
        # not where the interpreter lives (tests/sandbox/test_sandbox_prefix.py is)
        r = asyncio.run(sb.run(["python3", "-c", "print(1)"], timeout_s=10))
        assert r.stdout == "1\n"


def test_format_exec_result():
    def res(**kw):
        base = dict(stdout="", stderr="", exit_code=0, status="ok", wall_s=0.1, truncated=False)
        return ExecResult(**{**base, **kw})

    assert format_exec_result(res(), 5) == "(no output)"
    assert format_exec_result(res(stdout="a\n", stderr="b\n", exit_code=1), 5) == "a\nb\n[exit code 1]"
    assert format_exec_result(res(status="timeout", exit_code=None), 2).startswith("TimeoutError:")
    assert "output limit" in format_exec_result(res(status="output_limit", exit_code=None, truncated=True), 5)


async def test_python_tool(sb):
    t = make_python_tool(sb, timeout_s=1)
    assert t.name == "python" and t.parameters["required"] == ["code"]
    assert await t(code="print(6 * 7)") == "42"
    out = await t(code="x = 1\n1 / 0")
    assert 'File "<stdin>", line 2' in out and "ZeroDivisionError" in out and "[exit code 1]" in out
    assert (await t(code="import time; time.sleep(5)")).startswith(
        "TimeoutError: the program did not finish within 1 s"
    )
    assert await t(code="pass") == "(no output)"


async def test_bash_tool(sb):
    t = make_bash_tool(sb, timeout_s=2)
    assert await t(command="echo hi; pwd | grep -c agentrl-sbx") == "hi\n1"
    assert "[exit code 7]" in await t(command="exit 7")


class _BrokenSandbox(Sandbox):
    async def run(self, argv, *, stdin=None, timeout_s, files=None):
        raise SandboxError("daemon gone")


async def test_tools_propagate_sandbox_errors():
    with pytest.raises(SandboxError):
        await make_python_tool(_BrokenSandbox())(code="print(1)")


async def test_sessions_collect_and_limits(sb):
    from agentrl.sandbox import Limits

    async with await sb.session(limits=Limits(max_output_bytes=10)) as s:
        await s.run([PY, "-c", "open('keep.txt', 'w').write('kept')"], timeout_s=10)
        r = await s.run([PY, "-c", "print(open('keep.txt').read() * 5)"], timeout_s=10, collect=["keep.txt", "../x"])
        assert r.status == "output_limit" and r.files == {"keep.txt": b"kept"} and "'../x'" in r.detail
    with pytest.raises(SandboxError, match="closed"):
        await s.run([PY, "-c", "pass"], timeout_s=5)
    assert sb.max_output_bytes == 64 * 1024 and SubprocessSandbox(max_output_bytes=5).limits.max_output_bytes == 5


@pytest.mark.parametrize("argv, timeout", [([], 5), ("echo hi", 5), (["echo", "a\x00b"], 5), (["true"], 0)])
async def test_caller_mistakes_are_value_errors(sb, argv, timeout):
    with pytest.raises(ValueError):
        await sb.run(argv, timeout_s=timeout)
