"""One event loop's connection to the local executor, and the jails it follows.

Owns: ``Conn`` (the loop's socket to the executor, read with ``loop.add_reader``: notes are
handled on the loop that waits for them, with no thread in between; requests queued and sent
without blocking, so neither side ever waits on the other; the ready jails the executor handed
this loop, by kind) and ``ExecProcess`` (one jail as ``SubprocessSandbox`` sees it: the surface of
an asyncio subprocess transport, ``get_pid``, ``get_returncode``, ``get_pipe_transport(0)``,
``close``, plus ``kill``; it feeds the same protocol calls, ``process_exited`` at the end).

A jail's end is known from the first of: its init's ``{"exit"}`` on the jail's channel (pid
namespaces: before the teardown), the executor's ``{"pid", "exit"}`` once reaped, or the
executor's connection closing (it died: the result is lost). See ``agentrl.sandbox.local.executor``.

Does not: start the executor or pick the connection (``agentrl.sandbox.local.client``).
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import socket
from collections.abc import Callable
from typing import Any

from agentrl.errors import SandboxError
from agentrl.sandbox.local import wire


class ExecProcess:
    """One jail of the executor, as the sandbox mechanics see it."""

    def __init__(self, conn: Conn, proto: Any, rid: int, argv0: str) -> None:
        self.conn, self.proto, self.rid, self.argv0 = conn, proto, rid, argv0
        self.started: asyncio.Future = conn.loop.create_future()
        self.pid: int | None = None
        self.chan: socket.socket | None = None
        self.returncode: int | None = None
        self.error: str | None = None  # why the program could not be started
        self.lost: str | None = None
        self.ended = False
        self.abandoned = False
        self.reports = False  # its init reports the end on the channel
        self.killing = False
        self.transports: list[asyncio.BaseTransport] = []
        self.stdin: asyncio.WriteTransport | None = None

    def _started(self, pid: int, chan: socket.socket | None) -> None:
        self.pid = pid
        self.conn.by_pid[pid] = self
        if chan is not None:
            self.chan, self.reports = chan, True
            self.conn.loop.add_reader(chan.fileno(), self._on_chan)
        if self.abandoned:
            self.kill()
        elif not self.started.done():
            self.started.set_result(pid)

    def _on_chan(self) -> None:
        try:
            got = wire.recv(self.chan, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except (OSError, ValueError):
            got = None
        self._unwatch()
        if got is not None:
            msg, fds = got
            for fd in fds:
                os.close(fd)
            if "exit" in msg:
                self._end({"exit": msg["exit"]})
        # at EOF without a word the executor's note tells the end

    def _unwatch(self) -> None:
        if self.chan is not None:
            if not self.conn.loop.is_closed():
                self.conn.loop.remove_reader(self.chan.fileno())
            self.chan.close()
            self.chan = None

    def _end(self, msg: dict) -> None:
        """The jail's end (the first word of it counts)."""
        if self.ended:
            return
        self.ended = True
        self._unwatch()
        if self.pid is not None and self.conn.by_pid.get(self.pid) is self:
            del self.conn.by_pid[self.pid]
        if "lost" in msg:  # the executor died: whatever the child did, its result is unknown
            self.lost = msg["lost"]
        elif "pid" in msg and self.reports and not self.killing and not msg.get("error"):
            # The executor reaped a jail whose init never reported: it was killed from outside (its
            # program may never have run), an infrastructure failure, not the program's end.
            self.lost = f"the sandbox jail of {self.argv0!r} was killed before it reported (exit {msg.get('exit')})"
        self.returncode = msg.get("exit")
        self.error = msg.get("error") or None
        if not self.started.done():  # it never had a jail (the fork failed, or the executor died)
            self.started.set_exception(SandboxError(self.lost or self.error or "the jail ended unstarted"))
            if self.abandoned:
                self.started.exception()  # nobody waits for it any more: retrieved
        self.proto.process_exited()

    def get_pid(self) -> int:
        assert self.pid is not None
        return self.pid

    def get_returncode(self) -> int | None:
        """The exit code (-signal); SandboxError if the executor died before it could tell, or
        if the program could not be started."""
        if self.lost is not None:
            raise SandboxError(self.lost)
        if self.error is not None:
            raise SandboxError(f"cannot start {self.argv0!r}: {self.error.strip()[:500]}")
        return self.returncode

    def get_pipe_transport(self, fd: int) -> asyncio.WriteTransport:
        assert fd == 0 and self.stdin is not None
        return self.stdin

    def kill(self) -> None:
        """SIGKILL the jail's process group; until its end is known also ask the executor (which
        reaches it even before it made its session). Before the jail is known: as soon as it is."""
        self.killing = True
        if self.pid is None:  # its request is on its way to the executor, which kills what it started for it
            self.abandoned = True
            if not self.ended:
                self.conn.send({"kill_id": self.rid})
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if not self.ended:
            self.conn.send({"kill": self.pid})

    def close(self) -> None:
        for t in self.transports:
            t.close()
        self._unwatch()


class Conn:
    """One event loop's connection to the executor. Used only on that loop (``close`` also after
    the loop closed)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, lost: Callable[[], str]) -> None:
        self.loop, self.sock, self._why_lost = loop, sock, lost
        self.by_rid: dict[int, ExecProcess] = {}  # sent to the executor, no jail yet
        self.by_pid: dict[int, ExecProcess] = {}
        self.ready: dict[str, list[tuple[int, socket.socket]]] = {}  # kind -> (pid, channel)
        self.out: collections.deque = collections.deque()  # (payload, fds we own, memfd)
        self.writing = False
        self.closed = False
        loop.add_reader(sock.fileno(), self._on_readable)

    # -- sending ---------------------------------------------------------------------------------
    def send(self, msg: dict, fds: list[int] | tuple[int, ...] = ()) -> None:
        """Queue ``msg`` with ``fds`` (ours to close once sent) and send what can go now."""
        self.out.append(wire.pack(msg, list(fds)))
        if len(self.out) == 1:
            self._flush()

    def _flush(self) -> None:
        while self.out:
            payload, fds, _ = self.out[0]
            try:
                wire.sendmsg_packed(self.sock, payload, fds, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if not self.writing:
                    self.loop.add_writer(self.sock.fileno(), self._flush)
                    self.writing = True
                return
            except OSError:
                pass  # the executor is gone: its EOF tells the waiting
            self.out.popleft()
            for fd in fds:
                os.close(fd)  # in flight, the kernel holds its own reference
        if self.writing:
            self.loop.remove_writer(self.sock.fileno())
            self.writing = False

    def start(self, proc: ExecProcess, request: dict, fds: list[int], kind: str | None, pidns: bool) -> None:
        """Send the request (``fds``: ours to close) to a ready jail of ``kind``, or else to the executor."""
        for pid, chan in self._take_ready(kind):
            try:  # (the jail knows its plan)
                wire.send(chan, {k: v for k, v in request.items() if k != "jail"}, fds, socket.MSG_DONTWAIT)
            except OSError:  # it died meanwhile (its exit note is on its way): the next one
                chan.close()
                continue
            for fd in fds:
                os.close(fd)
            if not pidns:
                chan.close()
            proc._started(pid, chan if pidns else None)
            return
        self.by_rid[proc.rid] = proc
        self.send(request, fds)

    def _take_ready(self, kind: str | None):  # noqa: ANN202 (a generator of (pid, channel))
        while kind is not None and self.ready.get(kind):
            yield self.ready[kind].pop()

    # -- receiving -------------------------------------------------------------------------------
    def _on_readable(self) -> None:
        while not self.closed:
            try:
                got = wire.recv(self.sock, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except ValueError:
                continue
            except OSError:
                got = None
            if got is None:
                return self._lost()
            self._dispatch(*got)

    def _dispatch(self, msg: dict, fds: list[int]) -> None:
        chan = socket.socket(fileno=fds.pop(0)) if fds else None
        for fd in fds:
            os.close(fd)
        if "ready" in msg:
            self.ready.setdefault(msg["ready"], []).append((msg["pid"], chan))
            return
        if "drop" in msg:  # the executor keeps jails ready for other loops now: unless used already
            self._forget_ready(msg["pid"])
            return
        if "id" in msg:
            p = self.by_rid.pop(msg["id"], None)
            if p is not None and "pid" in msg:
                return p._started(msg["pid"], chan)
            if chan is not None:
                chan.close()
            if p is not None:
                p._end(msg)  # the executor could not fork it
            return
        p = self.by_pid.get(msg.get("pid"))  # type: ignore[arg-type]
        if p is not None:
            return p._end(msg)
        self._forget_ready(msg.get("pid"))  # a ready jail that ended unused

    def _forget_ready(self, pid: object) -> None:
        for jails in self.ready.values():
            for entry in [j for j in jails if j[0] == pid]:
                jails.remove(entry)
                entry[1].close()

    def _lost(self) -> None:
        procs = [*self.by_rid.values(), *self.by_pid.values()]
        self.by_rid, self.by_pid = {}, {}
        self.close()
        if procs:
            why = self._why_lost()
            for p in procs:
                p._end({"lost": why})

    def close(self) -> None:
        """Stop reading and close (on the loop, or once the loop is closed)."""
        if self.closed:
            return
        self.closed = True
        if not self.loop.is_closed():
            self.loop.remove_reader(self.sock.fileno())
            if self.writing:
                self.loop.remove_writer(self.sock.fileno())
        for _, fds, _ in self.out:
            for fd in fds:
                os.close(fd)
        self.out.clear()
        for jails in self.ready.values():
            for _, chan in jails:
                chan.close()
        self.ready.clear()
        self.sock.close()

    def fds(self) -> set[int]:
        """Descriptors held by design: the socket and the ready jails' channels."""
        if self.closed:
            return set()
        return {self.sock.fileno(), *(chan.fileno() for jails in self.ready.values() for _, chan in jails)}
