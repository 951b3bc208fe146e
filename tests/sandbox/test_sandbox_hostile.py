"""The hostile-input suite: every case on every sandbox backend, each a typed status within its deadline.

Backends: ``local`` (``make_sandbox("local")``: bwrap namespaces when bwrap works here),
``local-plain`` (the local backend with ``bwrap=False``: rlimits, plus, as root, a dedicated uid
and private mount/network namespaces) and ``docker`` (skipped, with the reason printed, when
``agentrl.sandbox.docker`` is missing or no daemon/image answers).

Every case asserts its expected typed status (``EXPECT``), that it returned (``HANG_S``: a bound
against a hang, not a timing test), and that the host is unchanged afterwards (``host_snapshot``:
processes of the sandbox uids and our children, sandbox work dirs and mounts, temp disk usage,
docker containers).

Where a backend cannot contain a case the test says so with ``pytest.skip`` and the reason:

* local without bwrap and without root: network access (no namespaces can be made), fork bombs
  (RLIMIT_NPROC would count all of the trainer's processes, so ``pids`` is not enforced) and
  ``kill -9 -1`` (it would reach the trainer's own processes) are not contained, so not run;
* the local backend never hides world-readable host files without bwrap (not a case here: the
  secrets below are not world-readable, as real secrets are not).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

import components
import pytest
from host_state import assert_host_unchanged, host_snapshot

from agentrl.sandbox import Limits, docker_unavailable_reason, make_sandbox

BACKENDS = ["local", "local-plain", "docker"]
# A hang guard, not a timing test: a run comes back within its deadline plus this. The contract is "plus a
# few seconds" (~0.1 s here); a backend that failed to end a program would wait for it (a busy loop, a
# `sleep 1000` holding the pipes: minutes or forever). 30 s is far from both, on any loaded machine.
HANG_S = 30.0
T = 2.0  # default deadline of a case

# Expected status per case; "*" is the default for backends not named.
EXPECT: dict[str, dict[str, set[str]]] = {
    "fork_bomb": {"*": {"timeout"}},
    "bash_fork_bomb": {"*": {"ok", "timeout"}},
    "busy_loop": {"*": {"timeout"}},
    "alloc_10gb": {"*": {"oom"}},
    "alloc_gradual": {"*": {"oom"}},
    "stdout_1gb": {"*": {"output_limit"}},
    "one_huge_file": {"*": {"ok"}},  # exits non-zero on EFBIG/ENOSPC: the program's failure
    "many_files": {"*": {"ok"}},
    "fill_tmp": {"*": {"ok"}},
    "inodes": {"*": {"ok"}},  # docker's work tmpfs caps nr_inodes too (ENOSPC at ~8 k files)
    "fds": {"*": {"ok"}},
    "network": {"*": {"ok"}},
    "secrets": {"*": {"ok"}},
    "kill_parent": {"*": {"ok"}},
    "kill_all": {"*": {"ok"}},
    "stdin_closed": {"*": {"ok"}},
    "sleep_silently": {"*": {"timeout"}},
    "garbage_output": {"*": {"ok"}},
    "deep_recursion": {"*": {"killed"}},  # through C (repr): the C stack overflows -> SIGSEGV
    # Pure-Python recursion lives on the heap in 3.11: it ends when memory does (docker: OOM kill;
    # local: CPython's own "SystemError" exit under RLIMIT_AS, a program failure, or "oom" when the
    # last line is a MemoryError).
    "deep_recursion_heap": {"*": {"ok", "oom"}, "docker": {"oom"}},
    "segfault": {"*": {"killed"}},
    "orphans": {"*": {"ok"}},
    "copy_out_escapes": {"*": {"ok"}},
    "overwrite_system": {"*": {"ok"}},
    "privilege": {"*": {"ok"}},
    "huge_code": {"*": {"ok"}},
}


def expected(case: str, backend: str) -> set[str]:
    return EXPECT[case].get(backend, EXPECT[case]["*"])


@pytest.fixture(params=BACKENDS)
async def backend(request):
    """(name, sandbox); the host must be unchanged once the sandbox is closed."""
    name = request.param
    if name == "docker":
        reason = docker_unavailable_reason()
        if reason is not None:
            components.unavailable("docker", f"docker backend unavailable: {reason}")
    before = host_snapshot(name)
    sb = make_sandbox("local", bwrap=False) if name == "local-plain" else make_sandbox(name)
    try:
        yield name, sb
    finally:
        await sb.aclose()
    assert_host_unchanged(before, host_snapshot(name))


def facts(sb) -> dict:
    """What the backend contains (docker contains everything here)."""
    d = sb.describe() if hasattr(sb, "describe") else {}
    return {
        "network": d.get("network_isolated", True),
        "pids": d.get("pids_enforced", True),
        "kill_all": d.get("bwrap", False) or d.get("dedicated_uid", True),
    }


async def run_case(case: str, backend: tuple, argv=None, *, code: str | None = None, timeout_s: float = T, **kw):
    name, sb = backend
    argv = argv or ["python3", "-"]
    stdin = code.encode() if code is not None else kw.pop("stdin", None)
    t0 = time.monotonic()
    r = await sb.run(argv, stdin=stdin, timeout_s=timeout_s, **kw)
    wall = time.monotonic() - t0
    assert wall <= timeout_s + HANG_S, f"{case} on {name}: took {wall:.1f}s, deadline {timeout_s}s"
    assert r.status in expected(case, name), f"{case} on {name}: {r.status} {r.exit_code} {r.detail} {r.stderr[-300:]}"
    return r


# ------------------------------------------------------------------------------ resources
async def test_fork_bomb(backend):
    if not facts(backend[1])["pids"]:
        components.unavailable(
            "root", "pids is not enforced on this backend here (local, not root): a fork bomb would exhaust host pids"
        )
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    await run_case("fork_bomb", backend, code=code)
    await run_case("bash_fork_bomb", backend, ["bash", "-c", ":(){ :|:& };:"])


async def test_busy_loop(backend):
    await run_case("busy_loop", backend, code="while True: pass")


@pytest.mark.parametrize(
    "case, code",
    [
        ("alloc_10gb", "x = bytearray(10 * 1024**3)"),
        ("alloc_gradual", "a = []\nwhile True: a.append(bytearray(50 * 2**20))"),
    ],
)
async def test_memory(backend, case, code):
    await run_case(case, backend, code=code, timeout_s=10)


async def test_stdout_1gb(backend):
    code = "import sys\nb = b'x' * (1 << 20)\nfor _ in range(1024): sys.stdout.buffer.write(b)"
    r = await run_case("stdout_1gb", backend, code=code, timeout_s=10)
    assert r.truncated and len(r.stdout) == Limits().max_output_bytes


@pytest.mark.parametrize(
    "case, code, err",
    [
        (
            "one_huge_file",
            "with open('f', 'wb') as f:\n    while True: f.write(b'x' * (1 << 20))",
            ("File too large", "No space"),
        ),
        (
            "many_files",
            "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * (16 << 20)); i += 1",
            ("No space", "too large"),
        ),
        (
            "fill_tmp",
            "i = 0\nwhile True:\n    open(f'/tmp/f{i}', 'wb').write(b'x' * (16 << 20)); i += 1",
            ("No space", "Read-only", "too large"),
        ),
        ("inodes", "i = 0\nwhile True:\n    open(f'n{i}', 'w').close(); i += 1", ("No space", "Too many")),
        ("fds", "fs = []\nwhile True: fs.append(open('/dev/null'))", ("Too many open files",)),
    ],
)
async def test_filling(backend, case, code, err):
    r = await run_case(case, backend, code=code, timeout_s=10)
    # the status is "ok" on every backend (EXPECT): the program met its limit and failed on its own
    assert r.exit_code != 0 and any(e in r.stderr for e in err), r.stderr[-300:]


# ------------------------------------------------------------------------------ network
class _Listener:
    """A TCP listener on the host's loopback that records whether anything connected."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port, self.connections, self._stop = self.sock.getsockname()[1], 0, False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.thread.join()
        self.sock.close()


async def test_network(backend):
    if not facts(backend[1])["network"]:
        components.unavailable("root", "the local backend without bwrap and without root cannot stop network access")
    lst = _Listener()
    try:
        port = lst.port
        code = f"""
import ctypes, socket, subprocess, struct
def attempt(name, fn):
    try:
        fn()
        print(name, "REACHED")
    except Exception as e:
        print(name, "blocked", type(e).__name__)
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2).close())
attempt("dns", lambda: socket.getaddrinfo("deb.debian.org", 80))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53)))
def curl():
    r = subprocess.run(["curl", "-sS", "-m", "2", "http://127.0.0.1:{port}/"], capture_output=True)
    if r.returncode != 0:
        raise OSError(r.returncode)
attempt("curl", curl)
def raw():
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.socket(2, 1, 0)
    addr = struct.pack("<HH4s8x", 2, socket.htons({port}), socket.inet_aton("127.0.0.1"))
    if fd < 0 or libc.connect(fd, addr, len(addr)) != 0:
        raise OSError(ctypes.get_errno())
attempt("ctypes", raw)
"""
        r = await run_case("network", backend, code=code, timeout_s=15)
        assert "REACHED" not in r.stdout.replace("udp REACHED", ""), r.stdout  # UDP send "works" into a void
        assert r.stdout.count("blocked") >= 4 and lst.connections == 0, (r.stdout, r.stderr[-500:])
    finally:
        lst.close()


# ------------------------------------------------------------------------------ secrets
async def test_secrets(backend, monkeypatch):
    canary = "agentrl-canary-" + os.urandom(6).hex()
    monkeypatch.setenv("AGENTRL_CANARY", canary)
    home = os.path.expanduser("~")
    secret_dir = tempfile.mkdtemp(prefix=".agentrl-ssh-", dir=home)  # 0700, like ~/.ssh
    key = os.path.join(secret_dir, "id_rsa")
    with open(key, "w") as f:
        f.write(canary)
    os.chmod(key, 0o600)
    try:
        code = f"""
import os, socket
print(dict(os.environ))
for path in ["/proc/self/environ", "/proc/1/environ", "/proc/{os.getpid()}/environ", "/proc/{os.getppid()}/environ",
             {key!r}, "/etc/shadow"]:
    try:
        print(path, open(path, "rb").read())
    except OSError as e:
        print(path, "denied", type(e).__name__)
for sock in ["/var/run/docker.sock", "/run/docker.sock"]:
    try:
        s = socket.socket(socket.AF_UNIX); s.connect(sock); print(sock, "CONNECTED")
    except OSError as e:
        print(sock, "denied", type(e).__name__)
"""
        r = await run_case("secrets", backend, code=code)
        assert canary not in r.stdout and canary not in r.stderr and "CONNECTED" not in r.stdout, r.stdout
        assert "root:" not in r.stdout  # /etc/shadow
    finally:
        shutil.rmtree(secret_dir)


# ------------------------------------------------------------------------------ processes
async def test_kill_parent(backend):
    code = (
        "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError as e:\n"
        "    print('denied', e)\nprint('alive')"
    )
    r = await run_case("kill_parent", backend, code=code)
    assert r.stdout.strip().endswith("alive")


async def test_kill_all_reaches_only_its_own_run(backend):
    name, sb = backend
    if not facts(sb)["kill_all"]:
        components.unavailable(
            "root", "kill -9 -1 is not contained here (local without bwrap, not root): it would kill the trainer"
        )
    bystander = asyncio.ensure_future(sb.run(["sh", "-c", "sleep 1.5; echo bystander"], timeout_s=10))
    await asyncio.sleep(0.5)
    r = await run_case("kill_all", backend, ["bash", "-c", "kill -9 -1; echo survived"])
    b = await bystander
    assert (b.status, b.stdout) == ("ok", "bystander\n"), b  # another run (and this test process) lived on
    assert (r.status, r.exit_code, r.stdout) == ("ok", 0, "survived\n"), r  # it cannot kill itself, nor its sandbox


async def test_stdin_and_silence(backend):
    # a stdin left open would block both reads until the deadline: status "timeout", not "ok"
    r = await run_case(
        "stdin_closed",
        backend,
        code=None,
        stdin=None,
        timeout_s=10,
        argv=["python3", "-c", "import sys\nprint(repr(sys.stdin.read()))\ninput()"],
    )
    assert r.stdout == "''\n" and "EOFError" in r.stderr and r.exit_code == 1
    await run_case("sleep_silently", backend, code="import time\ntime.sleep(1000)")


async def test_garbage_output(backend):
    code = r"import sys; sys.stdout.buffer.write(b'a\xff\xfe\x00b\x1b[2J\x1b]0;t\x07\r\n')"
    r = await run_case("garbage_output", backend, code=code)
    assert r.stdout == "a\ufffd\ufffd\x00b\x1b[2J\x1b]0;t\x07\r\n"


async def test_deep_recursion_and_segfault(backend):
    r = await run_case(
        "deep_recursion",
        backend,
        timeout_s=10,
        code="import sys\nsys.setrecursionlimit(10**9)\nclass A:\n    def __repr__(self): return repr(self)\nrepr(A())",
    )
    assert r.exit_code == -11
    r = await run_case(
        "deep_recursion_heap",
        backend,
        timeout_s=10,
        limits=Limits(memory_mb=128),
        code="import sys\nsys.setrecursionlimit(10**9)\ndef f(n): return f(n + 1)\nf(0)",
    )
    assert r.exit_code == (-9 if backend[0] == "docker" else 1), r  # docker: OOM-killed; local: Python's error exit
    r = await run_case("segfault", backend, code="import ctypes\nctypes.string_at(0)")
    assert r.exit_code == -11


@pytest.mark.parametrize(
    "script",
    [
        "sleep 1000 & echo started",
        "setsid sleep 1000 & echo started",
        "nohup sleep 1000 >/dev/null 2>&1 & disown; echo started",
        # A double-forked daemon in its own session that also makes itself non-dumpable (its /proc
        # entry then looks root-owned to anyone matching on owners).
        'python3 -c "import os, ctypes, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n'
        '        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n        time.sleep(1000)\n    os._exit(0)\n"; echo started',
    ],
)
async def test_orphans_do_not_survive(backend, script):
    # a backend that waited for the orphan (it holds the pipes) would run into the deadline: wall_s is
    # then the deadline itself (a hang check, not a timing one: ~0.05 s against 10 s)
    r = await run_case("orphans", backend, ["bash", "-c", script], timeout_s=10)
    assert r.stdout == "started\n" and r.wall_s < 10  # the fixture checks that nothing is left behind


# ------------------------------------------------------------------------------ files
async def test_copy_out_escapes(backend):
    code = """
import os
open('ok.txt', 'w').write('fine')
os.symlink('/etc/passwd', 'abs_link')
os.symlink('../../../../../../etc/passwd', 'rel_link')
os.symlink('/', 'root_link')
os.makedirs('d')
os.symlink('..', 'd/up')
"""
    names = [
        "ok.txt",
        "abs_link",
        "rel_link",
        "root_link/etc/passwd",
        "d/up/ok.txt",
        "../etc/passwd",
        "/etc/passwd",
        "d/up/../../etc/passwd",
    ]
    name, sb = backend
    t0 = time.monotonic()
    r = await sb.run(["python3", "-"], stdin=code.encode(), timeout_s=T, collect=names)
    assert time.monotonic() - t0 < T + HANG_S and r.status in expected("copy_out_escapes", name)
    assert all(b"root:" not in v for v in r.files.values())
    assert set(r.files) <= {"ok.txt", "d/up/ok.txt"} and r.files["ok.txt"] == b"fine"
    for refused in ("abs_link", "rel_link", "root_link/etc/passwd", "../etc/passwd", "/etc/passwd"):
        assert repr(refused) in r.detail, r.detail


async def test_overwrite_interpreter_and_rootfs(backend):
    before = {p: (os.stat(p).st_size, os.stat(p).st_mtime) for p in (sys.executable, "/bin/sh", "/usr/bin/env")}
    code = """
import os, sys, shutil
targets = [sys.executable, "/bin/sh", "/usr/bin/env", os.path.join(sys.prefix, "lib", "agentrl-pwned"),
           "/etc/agentrl-pwned", "/agentrl-pwned", "/usr/agentrl-pwned"]
for t in targets:
    try:
        with open(t, "ab") as f:
            f.write(b"pwned")
        print("WROTE", t)
    except OSError as e:
        print("refused", t, type(e).__name__)
for t in ["/bin/sh", sys.executable]:
    try:
        os.remove(t); print("REMOVED", t)
    except OSError as e:
        print("refused rm", t, type(e).__name__)
"""
    r = await run_case("overwrite_system", backend, code=code)
    assert "WROTE" not in r.stdout and "REMOVED" not in r.stdout, r.stdout
    assert before == {p: (os.stat(p).st_size, os.stat(p).st_mtime) for p in before}
    for p in ("/etc/agentrl-pwned", "/agentrl-pwned", "/usr/agentrl-pwned"):
        assert not os.path.exists(p)


async def test_setuid_and_mount(backend):
    code = """
import os, subprocess
for name, fn in [("setuid0", lambda: os.setuid(0)), ("setgid0", lambda: os.setgid(0))]:
    try:
        fn(); print(name, "GAINED")
    except OSError as e:
        print(name, "denied")
r = subprocess.run(["mount", "-t", "tmpfs", "none", "/mnt"], capture_output=True)
print("mount", "GAINED" if r.returncode == 0 else "denied")
print("uid", os.getuid(), os.geteuid())
"""
    r = await run_case("privilege", backend, code=code)
    assert "GAINED" not in r.stdout and r.stdout.count("denied") == 3, r.stdout
    assert " 0 " not in r.stdout.splitlines()[-1] + " ", r.stdout  # neither uid nor euid is 0


async def test_exit_zero_does_not_fake_a_pass(backend):
    from agentrl.envs.code_exec import CodeExecEnv

    _, sb = backend
    env = CodeExecEnv(sandbox=sb, difficulty=5, code_timeout_s=T)
    try:
        for cheat in ("import sys\nsys.exit(0)", "import os\nos._exit(0)"):
            await env.areset(seed=0)
            _, reward, term, _, _ = await env.astep(f"```python\n{cheat}\n```")
            assert term and reward == 0.0
    finally:
        env.close()


async def test_huge_code(backend):
    code = "# " + "a" * (10 << 20) + "\nprint('done')\n"
    r = await run_case("huge_code", backend, code=code, timeout_s=15)
    assert r.stdout == "done\n"


@pytest.mark.slow
async def test_thousand_concurrent_runs(backend):
    name, sb = backend
    t0 = time.monotonic()
    rs = await asyncio.gather(*[sb.run(["sh", "-c", "echo $0", str(i)], timeout_s=60) for i in range(1000)])
    assert [r.stdout for r in rs] == [f"{i}\n" for i in range(1000)] and all(r.ok for r in rs)
    # a hang guard, not a throughput test (bench/ measures that): 8-20 s here; a lost slot never ends
    assert time.monotonic() - t0 < 300
