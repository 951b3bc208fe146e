"""The local executor's wire format: one JSON message per ``SOCK_SEQPACKET`` packet, descriptors attached.

Owns: packing a message with its descriptors (``SCM_RIGHTS``) into a packet, or into a memfd sent
as the last descriptor when the JSON is too large for one packet (``pack``/``send``), and reading
one back (``recv``: received descriptors are close-on-exec). Used by the trainer's client, the
executor, and the jails it keeps ready. Imports only the standard library (the executor loads it
without agentrl on its path).

The messages. On the executor's first socket (its fd is argv[1]): ``{"connect": true}`` with a
socket attached adds that socket as a client connection (the client keeps one per event loop);
the first socket closing stops the executor, which then kills everything it started.

From the client on a connection: a request ``{"id", "jail", "argv", "env", "cwd", "workdir",
"uid", "rlimits", "warm", "status_fd", "pass_fd"}`` with the child's stdin, stdout, stderr (then
bwrap's status pipe and the one descriptor passed to the program, when the flags say so)
attached; ``{"kill": pid}`` (or ``{"kill_id": id}``, for a request whose jail the client does not
know yet) kills that jail if it was not reaped yet (also before it made its session);
``{"remove": path}`` hands over a host work dir to remove when idle.

To the client: ``{"id", "pid"}`` once a cold jail has the request, ``{"ready": kind, "pid"}``
handing over a ready jail, each with the jail's channel attached when it has one (a ready jail
takes its request there; a jail with its own pid namespace reports ``{"exit"}`` there as soon as
its program ended, before the namespace is torn down); ``{"drop": kind, "pid"}`` asking it to let
go of a ready jail it has not used (closing the channel: the jail ends at the EOF); and ``{"pid",
"exit", "error"?}`` when a jail was reaped (``error``: why the program could not be started, if
so; the client keeps the first exit it hears). A connection closing kills its jails.

Does not: act on a message (``agentrl.sandbox.local.executor``, ``agentrl.sandbox.local.conn`` and
``agentrl.sandbox.local.child`` do).
"""

from __future__ import annotations

import array
import json
import os
import socket

INLINE_MAX = 32 * 1024  # larger messages go in a memfd (a packet is capped by the socket buffer)
MAX_FDS = 8  # stdin, stdout, stderr, bwrap's status fd, a passed fd, a memfd holding a large message, spare
PACKET = 1 << 16
_ANC = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
_RIGHTS = (socket.SOL_SOCKET, socket.SCM_RIGHTS)


def jail_kind(plan: dict) -> str | None:
    """The key of a request's ``jail`` plan under which a jail can be prepared before its request,
    or None when it cannot (a trainer-made work dir bound into private mounts: its path is the
    request's)."""
    mounts = plan.get("mounts") or {}
    if mounts and not mounts.get("workdir"):
        return None
    return json.dumps(plan, sort_keys=True)


def pack(msg: dict, fds: list[int]) -> tuple[bytes, list[int], int | None]:
    """(payload, fds to attach, a memfd the caller closes after sending or None)."""
    payload = json.dumps(msg).encode()
    if len(payload) <= INLINE_MAX:
        return payload, fds, None
    mfd = os.memfd_create("agentrl-exec-request", os.MFD_CLOEXEC)
    os.write(mfd, payload)
    os.lseek(mfd, 0, os.SEEK_SET)
    return b'{"memfd": true}', [*fds, mfd], mfd


def send(sock: socket.socket, msg: dict, fds: list[int] | tuple[int, ...] = (), flags: int = 0) -> None:
    """Send one message (blocking unless ``flags`` say otherwise); raises OSError."""
    payload, attach, mfd = pack(msg, list(fds))
    try:
        sendmsg_packed(sock, payload, attach, flags)
    finally:
        if mfd is not None:
            os.close(mfd)


def sendmsg_packed(sock: socket.socket, payload: bytes, fds: list[int], flags: int = 0) -> None:
    sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _fd_bytes(fds))] if fds else [], flags)


def recv(sock: socket.socket, flags: int = 0) -> tuple[dict, list[int]] | None:
    """One message and its descriptors; None at EOF. Raises ValueError for a malformed message
    (its descriptors closed) and OSError (BlockingIOError with ``MSG_DONTWAIT``)."""
    # (socket.recv_fds ignores its flags before Python 3.12)
    data, anc, _flags, _addr = sock.recvmsg(PACKET, _ANC, flags | socket.MSG_CMSG_CLOEXEC)
    fds = [fd for level, kind, raw in anc if (level, kind) == _RIGHTS for fd in _fds_of(raw)]
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    try:
        msg = json.loads(data)
        if msg.get("memfd"):
            with os.fdopen(fds.pop(), "rb") as f:
                msg = json.loads(f.read())
        if not isinstance(msg, dict):
            raise ValueError(f"a message must be a JSON object, got {type(msg).__name__}")
    except (ValueError, OSError, IndexError) as e:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"bad message: {e}") from e
    return msg, fds


def _fd_bytes(fds: list[int]) -> bytes:
    return array.array("i", fds).tobytes()


def _fds_of(raw: bytes) -> list[int]:
    out = array.array("i")
    out.frombytes(raw[: len(raw) - len(raw) % out.itemsize])
    return list(out)
