"""The process mechanics every host-process backend shares, and the plain runner built on them.

Owns: ``SubprocessSandbox`` (no isolation) and the machinery ``LocalSandbox`` extends through a few
hooks: work dir lifecycle, spawning in a new session/process group, output capping as it arrives,
the deadline, killing the whole group, reaping, copying files in and out, sessions.

THE PLAIN RUNNER IS NOT A SECURITY BOUNDARY. The program runs as the same user as the trainer, with
full network access, the whole filesystem readable and writable, no memory/CPU/pid limits, and the
ability to signal any process of that user (``kill -9 -1`` would take the trainer down). Use it
for trusted workloads, tests and benchmarks; ``agentrl.sandbox.local`` is the hardened one.

What the mechanics guarantee (both backends):

* each run (or session) gets a fresh temp working dir, removed afterwards; ``files`` are written
  there first and ``collect`` copies files out with ``agentrl.sandbox.files`` (escapes refused);
* the environment is empty except ``PATH`` (this interpreter's bin dir first, so ``python3`` is
  the trainer's Python), ``LANG``, ``HOME``, ``TMPDIR`` and ``PYTHONDONTWRITEBYTECODE``/``UNBUFFERED``;
* the program leads its own session/process group; at the deadline, at an output overflow, on
  cancellation, and after a normal exit (to reap background children such as ``sleep 1000 &``)
  the whole group gets SIGKILL. Here a child that calls ``setsid`` itself escapes the group (the
  local backend catches those); we stop reading its pipes after a short grace instead;
* stdout and stderr are each capped (``Limits.max_output_bytes``). Going over the cap kills the
  program with status ``output_limit``: reading a 1 GB flood would burn the deadline for nothing;
* at most ``max_concurrency`` programs run at once (``agentrl.sandbox.slots``: the wait for a slot is
  recorded, and does not count against the program's ``timeout_s``).

Of ``Limits`` the plain runner enforces only ``max_output_bytes``; status ``oom`` never occurs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentrl.errors import SandboxError
from agentrl.sandbox.base import ExecResult, Limits, Sandbox, SandboxSession
from agentrl.sandbox.files import check_relpath, collect_files, write_files
from agentrl.sandbox.slots import Slots

_PIPE_GRACE_S = 0.5  # how long to wait for pipes held open by escaped (setsid) children
_EXIT_GRACE_S = 5.0  # after SIGKILL a process is gone in microseconds; this only bounds a wedged kernel
WORKDIR_PREFIX = "agentrl-sbx-"
MB = 1 << 20
PASS_FD_ENV = "AGENTRL_PASS_FD"  # where a program finds the number of the descriptor ``run(pass_fd=...)`` gave it


def base_env(home: str, tmp: str, python_bin: str | None) -> dict[str, str]:
    """The whole environment a sandboxed program gets (nothing is inherited from the trainer)."""
    path = ([python_bin] if python_bin else []) + ["/usr/local/bin", "/usr/bin", "/bin"]
    return {
        "PATH": os.pathsep.join(path),
        "HOME": home,
        "TMPDIR": tmp,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }


@dataclass
class Workdir:
    """A run's or a session's work dir: ``path`` on the host (or, ``private``, in the run's own
    mount namespace only, made and dropped with it), ``owner`` (uid, gid) of the sandbox user when
    it differs from ours, and whatever the backend needs to tear it down."""

    path: str
    owner: tuple[int, int] | None = None
    mounted: bool = False
    private: bool = False


@dataclass
class Spawn:
    """How to start one program: the host argv, its env and cwd, and what a backend adds."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    request: dict[str, Any] | None = None  # backend-specific: what the local executor needs beyond this
    status_fd: int | None = None  # backend-specific: read end of a status pipe, closed after the run
    status_w: int | None = None  # its write end, given to the child and closed once it started
    pass_fd: int | None = None  # a descriptor of the caller's the program inherits (``run(pass_fd=...)``)


class _Protocol(asyncio.SubprocessProtocol):
    """Counts and caps output as it arrives and signals exit without waiting for pipes to close
    (a background child may hold them open for ever)."""

    def __init__(self, cap: int) -> None:
        loop = asyncio.get_running_loop()
        self.cap = cap
        self.bufs = {1: bytearray(), 2: bytearray()}
        self.seen = {1: 0, 2: 0}
        self.exited, self.overflow, self.pipes_closed = (loop.create_future() for _ in range(3))
        self._open = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        buf = self.bufs[fd]
        self.seen[fd] += len(data)
        if len(buf) < self.cap:
            buf += data[: self.cap - len(buf)]
        if self.seen[fd] > self.cap and not self.overflow.done():
            self.overflow.set_result(None)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open.discard(fd)
        if not self._open and not self.pipes_closed.done():
            self.pipes_closed.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def text(self, fd: int) -> str:
        return bytes(self.bufs[fd]).decode("utf-8", errors="replace")

    @property
    def truncated(self) -> bool:
        return any(n > self.cap for n in self.seen.values())


async def _settle(proto: _Protocol) -> None:
    """Wait for the killed program to be reaped and its pipes to deliver their tail; give up on
    pipes after a short grace (an escaped setsid child may hold them open for ever)."""
    for fut, grace in ((proto.exited, _EXIT_GRACE_S), (proto.pipes_closed, _PIPE_GRACE_S)):
        if fut.done():  # the common case: no timer, no trip round the loop
            continue
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout=grace)
        except TimeoutError:
            pass


def killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def check_call(argv: Sequence[str], timeout_s: float) -> list[str]:
    """Caller mistakes, raised before anything runs."""
    if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, str) and "\x00" not in a for a in argv):
        raise ValueError(f"argv must be a non-empty list of str without NUL, got {argv!r:.200}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    return list(argv)


class SubprocessSandbox(Sandbox):
    """Runs programs as plain child processes. See the module docstring: not a security boundary.

    Subclasses change *how* (``_new_workdir``, ``_drop_workdir``, ``_spawn``, ``_kill``,
    ``_classify``); the deadline/output/cleanup/session mechanics stay here, in one place.
    """

    name = "subprocess"

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        max_concurrency: int = 16,
        max_output_bytes: int | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        limits = limits or Limits()
        if max_output_bytes is not None:  # the older spelling of limits.max_output_bytes
            limits = replace(limits, max_output_bytes=max_output_bytes)
        self.limits = limits
        self.max_concurrency = max_concurrency
        self.extra_env = dict(extra_env or {})
        self.slots = Slots(max_concurrency)

    @property
    def max_output_bytes(self) -> int:
        return self.limits.max_output_bytes

    def isolation_summary(self) -> str:
        return (
            "subprocess (NO isolation: programs run as you, with your files and network; for trusted code "
            "only: use 'local' or 'docker')"
        )

    # ------------------------------------------------------------------------------ hooks
    def _new_workdir(self, limits: Limits, one_shot: bool = False) -> Workdir:
        """A work dir; ``one_shot``: for one run whose files the trainer neither writes nor collects."""
        return Workdir(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))

    def _drop_workdir(self, wd: Workdir) -> None:
        shutil.rmtree(wd.path, ignore_errors=True)

    def _spawn(self, argv: list[str], wd: Workdir, limits: Limits, timeout_s: float) -> Spawn:
        env = {**base_env(wd.path, wd.path, os.path.dirname(sys.executable)), **self.extra_env}
        return Spawn(argv, env, wd.path)

    async def _start(self, spawn: Spawn, proto: _Protocol, with_stdin: bool) -> Any:
        """Start the program; returns an asyncio-subprocess-like transport feeding ``proto``."""
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: proto,
                *spawn.argv,
                cwd=spawn.cwd,
                env=spawn.env,
                start_new_session=True,
                stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=() if spawn.pass_fd is None else (spawn.pass_fd,),
            )
        except (OSError, subprocess.SubprocessError) as e:
            raise SandboxError(f"cannot start {spawn.argv[0]!r}: {e}") from e
        return transport

    def _pass_fd_at(self, spawn: Spawn) -> int:
        """The number the program finds ``spawn.pass_fd`` at (here: the same; ``pass_fds`` keeps it)."""
        return spawn.pass_fd  # type: ignore[return-value]

    def _kill(self, transport: Any, wd: Workdir) -> None:
        killpg(transport.get_pid())

    def _classify(
        self, status: str, code: int | None, stderr: str, spawn: Spawn, limits: Limits
    ) -> tuple[str, int | None, str]:
        """(status, exit_code, detail) from what the mechanics saw; backends refine (oom, signals)."""
        if status == "ok" and code is not None and code < 0:
            return "killed", code, f"died by signal {-code}"
        return status, code, ""

    # ------------------------------------------------------------------------------ API
    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float,
        files: Mapping[str, bytes] | None = None,
        limits: Limits | None = None,
        collect: Sequence[str] = (),
        pass_fd: int | None = None,
    ) -> ExecResult:
        """``Sandbox.run``, and ``pass_fd``: a descriptor of ours (left open) the program inherits,
        its number there in its environment as ``AGENTRL_PASS_FD`` (e.g. one end of a socket pair:
        a way out of the sandbox that leads only where the caller's end does)."""
        argv = check_call(argv, timeout_s)
        limits = limits or self.limits
        for name in files or {}:
            check_relpath(name)
        async with self.slots.hold():
            wd = self._open_workdir(limits, one_shot=not files and not collect)
            try:
                return await self._execute(argv, wd, limits, stdin, timeout_s, files, collect, pass_fd)
            finally:
                self._drop_workdir(wd)

    async def session(self, *, limits: Limits | None = None) -> SandboxSession:
        return _Session(self, limits or self.limits)

    def _open_workdir(self, limits: Limits, one_shot: bool = False) -> Workdir:
        try:
            return self._new_workdir(limits, one_shot)
        except OSError as e:
            raise SandboxError(f"cannot create a sandbox work dir: {e}") from e

    async def _execute(
        self,
        argv: list[str],
        wd: Workdir,
        limits: Limits,
        stdin: bytes | None,
        timeout_s: float,
        files: Mapping[str, bytes] | None,
        collect: Sequence[str],
        pass_fd: int | None = None,
    ) -> ExecResult:
        if files:
            write_files(wd.path, files, owner=wd.owner, max_total_bytes=limits.disk_mb * MB)
        spawn = self._spawn(argv, wd, limits, timeout_s)
        if pass_fd is not None:
            spawn.pass_fd = pass_fd
            spawn.env = {**spawn.env, PASS_FD_ENV: str(self._pass_fd_at(spawn))}
        try:
            t0 = time.perf_counter()
            proto = _Protocol(limits.max_output_bytes)
            try:
                transport = await self._start(spawn, proto, stdin is not None)
            finally:
                if spawn.status_w is not None:
                    os.close(spawn.status_w)  # the child has its copy; ours would keep the pipe open for ever
            try:
                if stdin is not None:
                    w = transport.get_pipe_transport(0)
                    w.write(stdin)  # buffered by the transport; a program that never reads just times out
                    w.write_eof()
                await asyncio.wait(
                    {proto.exited, proto.overflow}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
                )
                status = "output_limit" if proto.overflow.done() else "ok" if proto.exited.done() else "timeout"
            finally:
                # Always kill: at the deadline, on overflow, on cancellation, and after a normal exit to
                # take background children with it. (Safe after the leader is reaped: Linux does not
                # reuse a pid while it is still some live process group's id.)
                self._kill(transport, wd)
                try:
                    await _settle(proto)
                finally:  # even if cancelled while settling
                    transport.close()
            wall = time.perf_counter() - t0
            code = transport.get_returncode()
            if status == "ok" and proto.truncated:
                status = "output_limit"
            stderr = proto.text(2)
            status, code, detail = self._classify(status, code, stderr, spawn, limits)
        finally:
            if spawn.status_fd is not None:
                os.close(spawn.status_fd)
        got: Mapping[str, bytes] = {}
        if collect:
            c = collect_files(
                wd.path, collect, max_file_bytes=limits.fsize_mb * MB, max_total_bytes=limits.disk_mb * MB
            )
            got, detail = c.files, "; ".join(d for d in (detail, c.detail()) if d)
        return ExecResult(
            stdout=proto.text(1),
            stderr=stderr,
            exit_code=code if status in ("ok", "killed", "oom") else None,
            status=status,
            wall_s=wall,
            truncated=proto.truncated,
            files=got,
            detail=detail,
        )


class _Session(SandboxSession):
    """One work dir kept across runs; each run is a fresh process tree in it."""

    def __init__(self, sandbox: SubprocessSandbox, limits: Limits) -> None:
        self.sandbox, self.limits = sandbox, limits
        self._wd: Workdir | None = None
        self._closed = False

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float,
        files: Mapping[str, bytes] | None = None,
        collect: Sequence[str] = (),
    ) -> ExecResult:
        argv = check_call(argv, timeout_s)
        for name in files or {}:
            check_relpath(name)
        async with self.sandbox.slots.hold():
            if self._closed:
                raise SandboxError("sandbox session is closed")
            if self._wd is None:
                self._wd = self.sandbox._open_workdir(self.limits)
            return await self.sandbox._execute(argv, self._wd, self.limits, stdin, timeout_s, files, collect)

    async def close(self) -> None:
        self._closed = True
        wd, self._wd = self._wd, None
        if wd is not None:
            self.sandbox._drop_workdir(wd)

    def __del__(self) -> None:
        # An episode that forgot close() must not leak a work dir (or a tmpfs mount).
        wd, self._wd = getattr(self, "_wd", None), None
        if wd is not None:
            try:
                self.sandbox._drop_workdir(wd)
            except Exception:  # at interpreter exit modules may be half torn down
                pass
