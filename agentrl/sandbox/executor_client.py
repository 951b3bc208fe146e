"""The trainer's side of the local executor: start it, ask it to spawn, follow each child to its exit.

Owns: ``Executor`` (one per process, started on first use by a fresh ``exec`` of
``agentrl/sandbox/executor.py``, restarted if it dies), the wire format (one JSON request per
``SOCK_SEQPACKET`` packet with the child's pipe ends attached as ``SCM_RIGHTS``; a request too
large for a packet travels in a memfd), and ``ExecProcess``, which gives ``SubprocessSandbox``
the same surface as an asyncio subprocess transport (``get_pid``, ``get_returncode``,
``get_pipe_transport(0)``, ``close``) and feeds the same protocol (``pipe_data_received``,
``pipe_connection_lost``, ``process_exited``).

A reader thread receives the executor's notes (``{"id", "pid"}`` once the child is set up,
``{"id", "error"}`` if it could not be, ``{"id", "exit"}`` when it was reaped) and hands each to
the event loop that asked. The trainer keeps the read ends of the child's stdout/stderr and the
write end of its stdin, so output capping and deadlines stay in ``subprocess_runner``; killing is
``killpg`` on the child's pid (the trainer may signal it: it is root, or the child runs as its
user).

Does not: decide what runs or how it is jailed (``agentrl.sandbox.local`` builds the request), or
read or time anything (``agentrl.sandbox.subprocess_runner`` does).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
from typing import Any

from agentrl.errors import SandboxError

EXECUTOR_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "executor.py")
_INLINE_MAX = 32 * 1024  # larger requests go in a memfd (packet size is capped by the socket buffer)


class _PipeReader(asyncio.Protocol):
    def __init__(self, proto: Any, fd: int) -> None:
        self.proto, self.fd = proto, fd

    def data_received(self, data: bytes) -> None:
        self.proto.pipe_data_received(self.fd, data)

    def eof_received(self) -> None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.proto.pipe_connection_lost(self.fd, exc)


class _Collect:
    """A protocol that keeps stderr and notes the exit (for ``run_sync``)."""

    def __init__(self) -> None:
        self.err = bytearray()
        self.exited = asyncio.get_running_loop().create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 2 and len(self.err) < 65536:
            self.err += data

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        return None

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


class ExecProcess:
    """One child of the executor, as the sandbox mechanics see it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, proto: Any) -> None:
        self.loop, self.proto = loop, proto
        self.started: asyncio.Future = loop.create_future()
        self.pid: int | None = None
        self.returncode: int | None = None
        self.abandoned = False
        self.lost: str | None = None
        self.transports: list[asyncio.BaseTransport] = []
        self.stdin: asyncio.WriteTransport | None = None

    # called on the loop by the reader thread's notes
    def _note(self, msg: dict) -> None:
        if "pid" in msg:
            self.pid = msg["pid"]
            if self.abandoned:
                _killpg(self.pid)
            elif not self.started.done():
                self.started.set_result(self.pid)
        elif "lost" in msg:  # the executor died: whatever the child did, its result is unknown
            self.lost = msg["lost"]
            if not self.started.done():
                self.started.set_exception(SandboxError(self.lost))
            self.proto.process_exited()
        elif "error" in msg:
            if not self.started.done():
                self.started.set_exception(SandboxError(msg["error"]))
        elif "exit" in msg:
            self.returncode = msg["exit"]
            if not self.started.done():  # cannot happen (pid comes first); never leave a waiter hanging
                self.started.set_exception(SandboxError(f"exited ({self.returncode}) before it started"))
            self.proto.process_exited()

    def get_pid(self) -> int:
        assert self.pid is not None
        return self.pid

    def get_returncode(self) -> int | None:
        """The exit code (-signal); SandboxError if the executor died before it could tell."""
        if self.lost is not None:
            raise SandboxError(self.lost)
        return self.returncode

    def get_pipe_transport(self, fd: int) -> asyncio.WriteTransport:
        assert fd == 0 and self.stdin is not None
        return self.stdin

    def close(self) -> None:
        for t in self.transports:
            t.close()


class Executor:
    """The process-wide executor client (``executor()``). Thread-safe; usable from any event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, ExecProcess] = {}
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._pid_owner = os.getpid()

    # -- lifecycle -------------------------------------------------------------------------------
    def ensure_started(self) -> None:
        with self._lock:
            if self._sock is not None and self._pid_owner == os.getpid():
                return
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                # A fresh exec, never a fork of this (multi-threaded) process; no secrets in its env.
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", EXECUTOR_PATH, str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),),
                    env={"PATH": os.defpath, "LANG": "C.UTF-8"},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as e:
                ours.close()
                raise SandboxError(f"cannot start the local sandbox executor ({sys.executable}): {e}") from e
            finally:
                theirs.close()
            self._sock, self._pid_owner = ours, os.getpid()
            threading.Thread(
                target=self._read, args=(ours, self._proc), name="agentrl-executor-reader", daemon=True
            ).start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _read(self, sock: socket.socket, proc: subprocess.Popen) -> None:
        while True:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            msg = json.loads(data)
            with self._lock:
                p = self._waiting.get(msg.get("id"))
                if p is not None and ("exit" in msg or "error" in msg):  # its last note
                    self._waiting.pop(msg["id"], None)
            if p is not None:
                _call(p.loop, p._note, msg)
        sock.close()
        code = proc.wait()
        with self._lock:
            if self._sock is sock:
                self._sock = None
            waiting, self._waiting = self._waiting, {}
        for p in waiting.values():
            _call(p.loop, p._note, {"lost": f"the local sandbox executor died (exit code {code})"})

    def close(self) -> None:
        """Stop the executor (it kills what it still runs). The next spawn starts a new one."""
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread's recv (a close would not)
            except OSError:
                pass
            sock.close()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()

    # -- spawning --------------------------------------------------------------------------------
    async def spawn(self, request: dict, proto: Any, *, stdin: bool, status_fd: int | None = None) -> ExecProcess:
        """Start one child: ``request`` is the executor's request (argv, env, cwd, uid, rlimits,
        mounts, warm, ...); its stdout/stderr feed ``proto``; ``stdin`` gives it a pipe (else
        /dev/null); ``status_fd`` (a write end we own) becomes its fd 3. Raises SandboxError when
        the child could not be started."""
        self.ensure_started()
        loop = asyncio.get_running_loop()
        proc = ExecProcess(loop, proto)
        ours: list[int] = []
        theirs: list[int] = []
        try:
            if stdin:
                r, w = os.pipe2(os.O_CLOEXEC)
                theirs.append(r)
                ours.append(w)
            else:
                theirs.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            for _ in (1, 2):
                r, w = os.pipe2(os.O_CLOEXEC)
                ours.append(r)
                theirs.append(w)
            if status_fd is not None:
                theirs.append(os.dup(status_fd))
            rid = next(self._ids)
            self._send({**request, "id": rid, "status_fd": status_fd is not None}, theirs, proc, rid)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)  # in flight, the kernel holds its own reference
        out = ours[1:] if stdin else ours
        try:
            for fd, num in zip(out, (1, 2)):
                t, _ = await loop.connect_read_pipe(lambda n=num: _PipeReader(proto, n), os.fdopen(fd, "rb", 0))
                proc.transports.append(t)
            out = []
            if stdin:
                proc.stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(ours[0], "wb", 0))
                proc.transports.append(proc.stdin)
            await proc.started
        except BaseException:
            proc.abandoned = True
            if proc.pid is not None:
                _killpg(proc.pid)
            for fd in out:
                os.close(fd)
            if stdin and proc.stdin is None:
                os.close(ours[0])
            proc.close()
            raise
        return proc

    def run_sync(self, request: dict, *, timeout_s: float) -> tuple[int | None, str]:
        """Run one request to its end from synchronous code (probes); (exit code or None at the
        deadline, stderr). Runs on a loop of its own in a worker thread, so it works under a
        running loop too."""

        async def go() -> tuple[int | None, str]:
            proto = _Collect()
            proc = await self.spawn(request, proto, stdin=False)
            try:
                await asyncio.wait_for(asyncio.shield(proto.exited), timeout_s)
            except asyncio.TimeoutError:
                pass
            finally:
                _killpg(proc.get_pid())
                proc.close()
            return proc.get_returncode(), bytes(proto.err).decode("utf-8", "replace")

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, go()).result()

    def _send(self, request: dict, fds: list[int], proc: ExecProcess, rid: int) -> None:
        payload = json.dumps(request).encode()
        extra: list[int] = []
        if len(payload) > _INLINE_MAX:
            mfd = os.memfd_create("agentrl-exec-request", os.MFD_CLOEXEC)
            os.write(mfd, payload)
            os.lseek(mfd, 0, os.SEEK_SET)
            extra, payload = [mfd], json.dumps({"memfd": True}).encode()
        try:
            with self._lock:
                if self._sock is None:
                    raise SandboxError("the local sandbox executor is not running")
                self._waiting[rid] = proc
                try:
                    socket.send_fds(self._sock, [payload], fds + extra)
                except OSError as e:
                    self._waiting.pop(rid, None)
                    raise SandboxError(f"cannot reach the local sandbox executor: {e}") from e
        finally:
            for fd in extra:
                os.close(fd)


def _call(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass  # that loop is closed: nobody waits for this note any more


def _killpg(pid: int) -> None:
    import signal

    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_EXECUTOR: Executor | None = None
_EXECUTOR_LOCK = threading.Lock()


def executor() -> Executor:
    """The process-wide executor (started on first spawn)."""
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = Executor()
        return _EXECUTOR
