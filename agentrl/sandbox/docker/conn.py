"""The host end of one container's executor: a raw, asyncio-native attach stream to the daemon.

Owns: the daemon address (``DaemonAddress``: ``DOCKER_HOST`` or the default unix socket), the
hijacked ``POST /containers/{id}/attach`` connection (HTTP upgrade, then Docker's multiplexed
stdout/stderr frames), the executor's bootstrap source (``executor_source``), and ``AgentConn``,
which speaks the request/reply protocol of ``agentrl.sandbox.docker.agent.executor`` over that stream.

Why not the docker SDK here: its attach/exec sockets are blocking with no deadline, so each
in-flight run would pin a thread. Lifecycle calls (create, start, remove, inspect) do use the
SDK, in a bounded thread pool (``agentrl.sandbox.docker.daemon``).

Does not: decide what a reply means (``agentrl.sandbox.docker`` does), retry, or trust the
executor: reply sizes are bounded by what the caller allows and a malformed reply is an error.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from agentrl.errors import ConfigError, SandboxError

_HEADER = struct.Struct(">II")
_FRAME = struct.Struct(">BxxxI")
_MAX_HEADER = 1 << 20  # a reply header is a few hundred bytes; more means a confused stream


@dataclass(frozen=True)
class DaemonAddress:
    """Where the daemon listens: a unix socket path or a plain-TCP host:port (no TLS)."""

    unix_path: str | None = None
    host: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, url: str | None = None) -> DaemonAddress:
        url = url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme in ("unix", "http+unix") and parsed.path:
            return cls(unix_path=parsed.path)
        if parsed.scheme in ("tcp", "http") and parsed.hostname and parsed.port:
            if os.environ.get("DOCKER_TLS_VERIFY"):
                raise ConfigError(f"docker_host {url!r}: TLS daemons are not supported by the docker sandbox")
            return cls(host=parsed.hostname, port=parsed.port)
        raise ConfigError(f"docker_host must be unix:///path or tcp://host:port, got {url!r}")

    @property
    def base_url(self) -> str:
        """The same address in the form ``docker.DockerClient(base_url=...)`` takes."""
        return f"unix://{self.unix_path}" if self.unix_path else f"tcp://{self.host}:{self.port}"

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.unix_path:
            return await asyncio.open_unix_connection(self.unix_path, limit=1 << 20)
        return await asyncio.open_connection(self.host, self.port, limit=1 << 20)


#: modules the executor imports, by the name it imports them under -> their file here
_HERE = Path(__file__).resolve().parent
EXECUTOR_MODULES = {"sandbox_files": _HERE.parent / "files.py", "sandbox_procs": _HERE / "agent" / "procs.py"}


def executor_source() -> str:
    """``python3 -c`` source of the executor: the :data:`EXECUTOR_MODULES` (``agentrl.sandbox.files``
    as module ``sandbox_files``, ``agent.procs`` as ``sandbox_procs``), then
    ``agent/executor.py`` as ``__main__`` (all read from disk: version-locked with this host code,
    nothing baked into the image)."""
    lines = ["import sys, types"]
    for name, path in EXECUTOR_MODULES.items():
        src = path.read_text()
        lines += [
            f"_m = types.ModuleType({name!r})",
            f"sys.modules[{name!r}] = _m",
            f"exec(compile({src!r}, {name + '.py'!r}, 'exec'), _m.__dict__)",
        ]
    agent_src = (_HERE / "agent" / "executor.py").read_text()
    lines.append(f"exec(compile({agent_src!r}, 'executor.py', 'exec'), {{'__name__': '__main__'}})")
    return "\n".join(lines) + "\n"


class AgentConn:
    """One attach stream to one container's executor. Requests are sequential (one run at a time
    per container); it is bound to the event loop that opened it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, short_id: str) -> None:
        self.reader, self.writer, self.short_id = reader, writer, short_id
        self._out = bytearray()
        self.stderr_tail = b""  # the executor's own stderr (a traceback if it crashed)
        self.hello: dict = {}

    @classmethod
    async def attach(cls, address: DaemonAddress, api_version: str, container_id: str) -> AgentConn:
        """Attach to stdin/stdout/stderr of a created (not yet started) container."""
        reader, writer = await address.connect()
        path = f"/v{api_version}/containers/{container_id}/attach?stream=1&stdin=1&stdout=1&stderr=1"
        writer.write(
            (
                f"POST {path} HTTP/1.1\r\nHost: docker\r\nUser-Agent: agentrl-sandbox\r\n"
                "Content-Type: text/plain\r\nContent-Length: 0\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            writer.close()
            raise SandboxError(f"docker attach to {container_id[:12]}: the daemon closed the connection") from e
        status_line = head.split(b"\r\n", 1)[0].decode(errors="replace")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or parts[1] not in ("101", "200"):
            body = b""
            try:
                body = await asyncio.wait_for(reader.read(4096), 2.0)
            except (TimeoutError, OSError):
                pass
            writer.close()
            raise SandboxError(
                f"docker attach to {container_id[:12]} failed: {status_line}: "
                f"{body.decode(errors='replace').strip()[:300]}"
            )
        return cls(reader, writer, container_id[:12])

    # ------------------------------------------------------------------------------- frames
    async def _fill(self, n: int) -> None:
        """Read frames until ``n`` bytes of executor stdout are buffered; EOFError when it ends."""
        while len(self._out) < n:
            try:
                kind, size = _FRAME.unpack(await self.reader.readexactly(_FRAME.size))
                data = await self.reader.readexactly(size)
            except asyncio.IncompleteReadError:
                raise EOFError(f"the stream of container {self.short_id} ended") from None
            if kind == 2:
                self.stderr_tail = (self.stderr_tail + data)[-4000:]
            else:
                self._out += data

    async def _take(self, n: int) -> bytes:
        await self._fill(n)
        data = bytes(self._out[:n])
        del self._out[:n]
        return data

    async def recv(self, max_payload: int) -> tuple[dict, bytes]:
        """One message; ProtocolError if it is malformed or bigger than ``max_payload``."""
        hlen, plen = _HEADER.unpack(await self._take(_HEADER.size))
        if hlen > _MAX_HEADER or plen > max_payload:
            raise ProtocolError(
                f"executor of {self.short_id} sent a {hlen}+{plen}-byte message (allowed {_MAX_HEADER}+{max_payload})"
            )
        try:
            header = json.loads(await self._take(hlen))
        except ValueError as e:
            raise ProtocolError(f"executor of {self.short_id} sent a malformed header: {e}") from None
        if not isinstance(header, dict):
            raise ProtocolError(f"executor of {self.short_id} sent a non-object header")
        return header, await self._take(plen)

    async def call(self, header: dict, payload: bytes, *, max_payload: int) -> tuple[dict, bytes]:
        head = json.dumps(header).encode()
        self.writer.write(_HEADER.pack(len(head), len(payload)) + head)
        if payload:
            self.writer.write(payload)
        await self.writer.drain()
        return await self.recv(max_payload)

    def close(self) -> None:
        """Drop the stream (the executor reads EOF, exits, and the container goes away)."""
        try:
            self.writer.close()
        except RuntimeError:  # its loop is closed: close the socket itself
            sock = getattr(self.writer.get_extra_info("socket"), "_sock", None)
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass


class ProtocolError(Exception):
    """The executor's reply was malformed or too big (a bug or a tampered executor)."""
