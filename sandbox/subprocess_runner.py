"""A plain subprocess runner: deadline, process-group kill, empty env, temp dir, output caps.

THIS IS NOT A SECURITY BOUNDARY. The program runs as the same user as the trainer, with full
network access, the whole filesystem readable and writable, no memory/CPU/pid limits, and the
ability to signal any process of that user (``kill -9 -1`` would take the trainer down). Use it
for trusted workloads, tests and benchmarks; the hardened local backend (rlimits + bubblewrap)
and the Docker backend are separate and plug into the same ``Sandbox`` interface.

What it does guarantee:

* each run gets a fresh temp working dir (``HOME`` and ``TMPDIR`` point there), removed after;
* the environment is empty except ``PATH`` (this interpreter's bin dir first, so ``python3`` is
  the trainer's Python), ``LANG``, ``HOME``, ``TMPDIR`` and ``PYTHONDONTWRITEBYTECODE``/``UNBUFFERED``;
* the program leads its own session/process group; at the deadline, at an output overflow, on
  cancellation, and after a normal exit (to reap background children such as ``sleep 1000 &``)
  the whole group gets SIGKILL. A child that calls ``setsid`` itself escapes the group: only a
  pid-namespace backend can catch it; we stop reading its pipes after a short grace instead;
* stdout and stderr are each capped (``max_output_bytes``, 64 KiB by default). Going over the
  cap kills the program with status ``output_limit``: reading and discarding a 1 GB flood would
  burn the deadline for output nobody will read;
* at most ``max_concurrency`` programs run at once (a semaphore per event loop).

Status ``oom`` is never reported here (no memory limit is set).
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
from pathlib import PurePosixPath

from agentrl.errors import SandboxError
from agentrl.sandbox import ExecResult, Sandbox

_PIPE_GRACE_S = 0.5  # how long to wait for pipes held open by escaped (setsid) children
_EXIT_GRACE_S = 5.0  # after SIGKILL a process is gone in microseconds; this only bounds a wedged kernel


def _base_env(workdir: str) -> dict[str, str]:
    bindir = os.path.dirname(sys.executable)
    return {
        "PATH": os.pathsep.join([bindir, "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def _safe_relpath(name: str) -> PurePosixPath:
    p = PurePosixPath(name)
    if not name or p.is_absolute() or ".." in p.parts:
        raise ValueError(f"sandbox file name must be a relative path without '..', got {name!r}")
    return p


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


class _Protocol(asyncio.SubprocessProtocol):
    """Counts and caps output as it arrives and signals exit without waiting for pipes to close
    (a background child may hold them open for ever)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.bufs = {1: bytearray(), 2: bytearray()}
        self.seen = {1: 0, 2: 0}
        self.exited = asyncio.get_running_loop().create_future()
        self.overflow = asyncio.get_running_loop().create_future()
        self.pipes_closed = asyncio.get_running_loop().create_future()
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
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout=grace)
        except asyncio.TimeoutError:
            pass


class SubprocessSandbox(Sandbox):
    """Runs programs as plain child processes. See the module docstring: not a security boundary."""

    def __init__(self, *, max_output_bytes: int = 64 * 1024, max_concurrency: int = 16,
                 extra_env: dict[str, str] | None = None) -> None:
        if max_output_bytes < 1 or max_concurrency < 1:
            raise ValueError("max_output_bytes and max_concurrency must be >= 1")
        self.max_output_bytes = max_output_bytes
        self.max_concurrency = max_concurrency
        self.extra_env = dict(extra_env or {})
        # asyncio primitives bind to the loop that first waits on them; keep one per loop so the
        # same sandbox works from a sync env's private loop and from the trainer's loop.
        self._sems: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Semaphore]] = {}

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        entry = self._sems.get(id(loop))
        if entry is None or entry[0] is not loop:
            self._sems = {k: v for k, v in self._sems.items() if not v[0].is_closed()}
            entry = self._sems[id(loop)] = (loop, asyncio.Semaphore(self.max_concurrency))
        return entry[1]

    async def run(self, argv: list[str], *, stdin: bytes | None = None, timeout_s: float,
                  files: dict[str, bytes] | None = None) -> ExecResult:
        if not argv:
            raise ValueError("argv must not be empty")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        paths = {_safe_relpath(k): v for k, v in (files or {}).items()}
        async with self._semaphore():
            try:
                workdir = tempfile.mkdtemp(prefix="agentrl-sbx-")
            except OSError as e:
                raise SandboxError(f"cannot create a sandbox work dir: {e}") from e
            try:
                for rel, data in paths.items():
                    dest = os.path.join(workdir, *rel.parts)
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    with open(dest, "wb") as f:
                        f.write(data)
                return await self._run_in(argv, workdir, stdin, timeout_s)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)

    async def _run_in(self, argv: list[str], workdir: str, stdin: bytes | None, timeout_s: float) -> ExecResult:
        env = {**_base_env(workdir), **self.extra_env}
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        try:
            transport, proto = await loop.subprocess_exec(
                lambda: _Protocol(self.max_output_bytes), *argv, cwd=workdir, env=env, start_new_session=True,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )
        except OSError as e:
            raise SandboxError(f"cannot start {argv[0]!r}: {e}") from e
        pid = transport.get_pid()
        try:
            if stdin is not None:
                w = transport.get_pipe_transport(0)
                w.write(stdin)  # buffered by the transport; a program that never reads just times out
                w.write_eof()
            await asyncio.wait({proto.exited, proto.overflow}, timeout=timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
            if proto.overflow.done():
                status = "output_limit"
            elif proto.exited.done():
                status = "ok"
            else:
                status = "timeout"
        finally:
            # Always kill the group: at the deadline, on overflow, on cancellation, and after a
            # normal exit to take background children with it. (Safe after the leader is reaped:
            # Linux does not reuse a pid while it is still some live process group's id.)
            _killpg(pid)
            try:
                await _settle(proto)
            finally:  # even if cancelled while settling
                transport.close()
        wall = time.perf_counter() - t0
        code = transport.get_returncode()
        if status == "ok":
            if code is not None and code < 0:
                status = "killed"
            elif proto.truncated:
                status = "output_limit"
        return ExecResult(
            stdout=proto.text(1), stderr=proto.text(2),
            exit_code=code if status in ("ok", "killed") else None,
            status=status, wall_s=wall, truncated=proto.truncated,
        )
