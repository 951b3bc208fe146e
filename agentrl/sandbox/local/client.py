"""The trainer's side of the local executor: start it, ask it for jails, follow each to its exit.

Owns: ``Executor`` (one per process, started on first use by a fresh ``exec`` of
``agentrl/sandbox/local/executor.py``, restarted if it dies), one connection to it per event loop
(``agentrl.sandbox.local.conn``: read on the loop itself, no thread), and ``spawn``: the
child's pipes, the request sent to a ready jail of its kind when the executor handed this loop
one (else to the executor, which forks a cold jail), and the ``ExecProcess`` that follows it.

The trainer keeps the read ends of the child's stdout/stderr and the write end of its stdin, so
output capping and deadlines stay in ``subprocess_runner``; killing is ``killpg`` on the jail's
pid (the trainer may signal it: it is root, or the jail runs as its user) and, until the exit is
known, a kill request (the executor's own child cannot be a reused pid). A loop's connection
closes once the loop is found closed (the executor then kills whatever that loop left running).

Does not: decide what runs or how it is jailed (``agentrl.sandbox.local`` builds the request), or
read or time anything (``agentrl.sandbox.subprocess_runner`` does).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import socket
import subprocess
import sys
import threading
from typing import Any

from agentrl.errors import SandboxError
from agentrl.sandbox.local import wire
from agentrl.sandbox.local.conn import Conn, ExecProcess

EXECUTOR_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "executor.py")


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


class Executor:
    """The process-wide executor client (``executor()``). Thread-safe; usable from any event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._sock: socket.socket | None = None  # the first socket: new connections go over it
        self._proc: subprocess.Popen | None = None
        self._gen = 0
        self._codes: dict[int, int | None] = {}
        self._conns: dict[int, Conn] = {}  # id(loop) -> its connection
        self._pid_owner = os.getpid()

    # -- lifecycle -------------------------------------------------------------------------------
    def ensure_started(self) -> None:
        with self._lock:
            self._ensure_started()

    def _ensure_started(self) -> None:
        if self._sock is not None and self._pid_owner == os.getpid() and self._proc.poll() is None:
            return
        if self._sock is not None and self._pid_owner == os.getpid():
            self._codes[self._gen] = self._proc.returncode
            self._sock.close()  # it died: its connections see EOF and tell their waiting
            for c in self._conns.values():
                if c.loop.is_closed():
                    c.close()
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
        self._gen += 1
        self._conns = {}  # a forked trainer's or a dead executor's: not ours to use

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def fds(self) -> set[int]:
        """The descriptors this client holds by design (its sockets), for leak checks."""
        with self._lock:
            out = {self._sock.fileno()} if self._sock is not None else set()
            for c in self._conns.values():
                out |= c.fds()
        return out

    def _lost_why(self, gen: int) -> str:
        """Why the jails of generation ``gen`` of the executor are lost (it closed our socket: it is exiting)."""
        with self._lock:
            proc = self._proc if gen == self._gen else None
        code = self._codes.get(gen)
        if proc is not None:
            try:
                code = proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        return f"the local sandbox executor died (exit code {code})"

    def _conn(self) -> Conn:
        loop = asyncio.get_running_loop()
        with self._lock:
            self._ensure_started()
            conn = self._conns.get(id(loop))
            if conn is not None and conn.loop is loop and not conn.closed:
                return conn
            for key, c in list(self._conns.items()):
                if c.loop.is_closed() or c.closed:
                    c.close()
                    del self._conns[key]
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                wire.send(self._sock, {"connect": True}, [theirs.fileno()])
            except OSError as e:
                ours.close()
                raise SandboxError(f"cannot reach the local sandbox executor: {e}") from e
            finally:
                theirs.close()
            gen = self._gen
            conn = self._conns[id(loop)] = Conn(loop, ours, lambda: self._lost_why(gen))
            return conn

    def discard(self, path: str) -> bool:
        """Hand a work dir no process uses any more to the executor, which removes it when idle;
        False (remove it yourself) without a running event loop here."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        self._conn().send({"remove": path})
        return True

    def close(self) -> None:
        """Stop the executor (it kills what it still runs). The next spawn starts a new one."""
        with self._lock:
            sock, self._sock = self._sock, None
            conns, self._conns = self._conns, {}
        for c in conns.values():
            if c.loop.is_closed():
                c.close()  # a running loop's connection sees the executor's EOF and closes itself
        if sock is not None:
            sock.close()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()

    # -- spawning --------------------------------------------------------------------------------
    async def spawn(
        self, request: dict, proto: Any, *, stdin: bool, status_fd: int | None = None, pass_fd: int | None = None
    ) -> ExecProcess:
        """Start one child: ``request`` is the executor's request (jail, argv, env, cwd, uid,
        rlimits, warm, ...); its stdout/stderr feed ``proto``; ``stdin`` gives it a pipe (else
        /dev/null); ``status_fd`` (a write end we own) becomes its fd 3; ``pass_fd`` (a
        descriptor we own, left open) the next one: 4 after a status fd, else 3. Raises
        SandboxError when the child could not be started."""
        conn = self._conn()
        loop = conn.loop
        proc = ExecProcess(conn, proto, next(self._ids), request["argv"][0])
        request = dict(request)
        plan = request.get("jail") or {}
        kind = request.pop("kind") if "kind" in request else wire.jail_kind(plan)  # the caller may know it
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
            if pass_fd is not None:
                theirs.append(os.dup(pass_fd))
            msg = {**request, "id": proc.rid, "status_fd": status_fd is not None, "pass_fd": pass_fd is not None}
            conn.start(proc, msg, theirs, kind, bool((plan.get("mounts") or {}).get("pidns")))
            theirs = []  # the connection (or the jail) has them now
        except BaseException:
            for fd in ours + theirs:
                os.close(fd)
            raise
        # Each file object owns its descriptor; once handed to connect_*_pipe, the transport does
        # (and closes it, a loop round later, even when cancelled: never close its number again).
        files: list = [os.fdopen(fd, "rb", 0) for fd in (ours[1:] if stdin else ours)]
        if stdin:
            files.append(os.fdopen(ours[0], "wb", 0))
        try:
            for i, num in enumerate((1, 2)):
                f, files[i] = files[i], None
                t, _ = await loop.connect_read_pipe(lambda n=num: _PipeReader(proto, n), f)
                proc.transports.append(t)
            if stdin:
                f, files[2] = files[2], None
                proc.stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, f)
                proc.transports.append(proc.stdin)
            await proc.started
        except BaseException:
            proc.kill()
            for f in files:
                if f is not None:
                    f.close()
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
            except TimeoutError:
                pass
            finally:
                proc.kill()
                proc.close()
            return proc.get_returncode(), bytes(proto.err).decode("utf-8", "replace")

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, go()).result()


_EXECUTOR: Executor | None = None
_EXECUTOR_LOCK = threading.Lock()


def executor() -> Executor:
    """The process-wide executor (started on first spawn)."""
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = Executor()
        return _EXECUTOR
