"""One episode's way out of the sandbox: a socket pair that leads to the recording endpoint only.

Owns: :class:`EndpointBridge`. Its far end (``fd``) is passed to the sandboxed launcher
(:mod:`agentrl.agents.relay`), which sends one connected ``AF_UNIX`` stream socket over it
(``SCM_RIGHTS``) for every connection the agent program makes; each is relayed here, byte for
byte, to the endpoint's TCP port on the host's loopback. Nothing else is reachable through it: no
address is chosen inside the sandbox, and the bridge exists only for its episode (the endpoint
still checks the episode's key). What arrives that is not such a socket is closed unread.

Does not: serve HTTP or check keys (:mod:`agentrl.agents.proxy`), run the program
(:mod:`agentrl.agents.sandboxed`).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import socket

MAX_CONNECTIONS = 64  # relayed at once per episode; more are closed (an agent needs a few)
_ANC = socket.CMSG_SPACE(4 * array.array("i").itemsize)


class EndpointBridge:
    """The bridge of one episode to the endpoint at ``host:port``. Use ``async with``: entering
    starts listening for connections, leaving closes both ends and every relayed connection."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._ours, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._ours.setblocking(False)
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.connections = 0  # relayed so far

    @property
    def fd(self) -> int:
        """The descriptor the sandboxed launcher inherits (``Sandbox.run(pass_fd=...)``)."""
        return self._theirs.fileno()

    async def __aenter__(self) -> EndpointBridge:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._ours.fileno(), self._on_readable)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._ours.fileno())
            self._loop = None
        for s in (self._ours, self._theirs):
            s.close()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _on_readable(self) -> None:
        try:
            data, anc, _flags, _addr = self._ours.recvmsg(16, _ANC, socket.MSG_CMSG_CLOEXEC)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, anc = b"", []
        raws = [raw for level, kind, raw in anc if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)]
        got = [fd for raw in raws for fd in _ints(raw)]
        if not data and not got:  # the launcher is gone
            if self._loop is not None:
                self._loop.remove_reader(self._ours.fileno())
            return
        for fd in got:
            conn = _stream_socket(fd)
            if conn is None or len(self._tasks) >= MAX_CONNECTIONS:
                if conn is not None:
                    conn.close()
                continue
            self.connections += 1
            task = asyncio.ensure_future(self._relay(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _relay(self, conn: socket.socket) -> None:
        writers = []
        try:
            inner_r, inner_w = await asyncio.open_connection(sock=conn)
            writers.append(inner_w)
            outer_r, outer_w = await asyncio.open_connection(self.host, self.port)
            writers.append(outer_w)
            pumps = [asyncio.ensure_future(_pump(inner_r, outer_w)), asyncio.ensure_future(_pump(outer_r, inner_w))]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                for p in pumps:
                    p.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except OSError:
            pass
        finally:
            if not writers:
                conn.close()
            for w in writers:
                w.close()


def _ints(raw: bytes) -> list[int]:
    out = array.array("i")
    out.frombytes(raw[: len(raw) - len(raw) % out.itemsize])
    return list(out)


def _stream_socket(fd: int) -> socket.socket | None:
    """``fd`` as a connected AF_UNIX stream socket, or None (closed) when it is anything else."""
    try:
        conn = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)  # not a socket at all
        return None
    if conn.family != socket.AF_UNIX or conn.type != socket.SOCK_STREAM:
        conn.close()
        return None
    return conn


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then end the writer's sending side (an HTTP client may wait for it)."""
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    with contextlib.suppress(OSError):
        if writer.can_write_eof():
            writer.write_eof()
