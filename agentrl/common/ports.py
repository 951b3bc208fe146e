"""TCP ports for the servers agentrl starts, and the race of choosing one.

A port found free (bind to port 0, read the number, close) and handed to a server that binds it
later can be taken in between by any other program: the server then dies with EADDRINUSE. Two
ways out, used by every server agentrl starts:

* a server that accepts a socket gets one already bound and listening (:func:`listening_socket`,
  port 0: the OS picks, nothing can come in between): ``agentrl serve``'s and the agent proxy's
  uvicorn servers, torch's TCPStore (``agentrl.trainer.dist.listening_store``);
* a server that must be told a number (``sglang.launch_server --port``, ``ray start --port``) gets
  :func:`free_port`, and its launcher starts it again on a fresh one when it reports the address
  taken (:func:`addr_in_use` reads its log or error), a bounded number of times, saying so
  (``agentrl.engine.sglang.server``).

Also :func:`listener_is_ours`: whether the socket listening on a port belongs to a given process
session, so a launcher never mistakes another program's server on "its" port for its own.

Owns none of those servers. Linux for the ownership check (/proc); elsewhere it cannot tell.
"""

from __future__ import annotations

import os
import re
import socket

#: How EADDRINUSE reads in a server's output: the OSError text ("[Errno 98] Address already in use"),
#: uvicorn's ("error while attempting to bind on address (...): address already in use"), torch's
#: TCPStore ("name: EADDRINUSE"), SGLang's own port checks ("Port is already in use",
#: "nccl_port at 1234 is not available", "is used by a process already").
ADDR_IN_USE = re.compile(
    r"address already in use|EADDRINUSE|port is already in use|_port at \d+ is not available|"
    r"is used by a process already",
    re.I,
)


def listening_socket(host: str = "127.0.0.1", port: int = 0, backlog: int = 2048) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a port the OS picks; read it back with
    ``getsockname()[1]``) and listening, to hand to a server that takes sockets. OSError if taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT of an earlier server
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` right now, for a server that must be told a number. Another program
    can take it before the server binds it: start such a server again on a fresh one when it
    reports :func:`addr_in_use`."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def addr_in_use(text: str | BaseException) -> str | None:
    """The line of ``text`` (a server's log, an error) saying its address was taken, or None."""
    for line in str(text).splitlines() or [str(text)]:
        if ADDR_IN_USE.search(line):
            return " ".join(line.split())[:300]
    if isinstance(text, OSError) and text.errno == 98:  # errno.EADDRINUSE on Linux, whatever the message
        return str(text)
    return None


def _listening_inodes(port: int) -> set[str] | None:
    """Socket inodes listening on TCP ``port`` (any address, v4 and v6); None without /proc/net."""
    found, readable = set(), False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for row in rows:
            cols = row.split()
            # local_address is HEXADDR:HEXPORT; state 0A is LISTEN; column 9 is the inode
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                found.add(cols[9])
    return found if readable else None


def _session_pids(sid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
            if int(fields[3]) == sid:  # field 6 of stat: the session id
                out.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def listener_is_ours(port: int, session: int) -> bool | None:
    """Whether a socket listening on ``port`` belongs to a process of session ``session`` (a server
    started with ``start_new_session``: its pid). False: someone listens there, none of ours; None:
    nobody listens, or this system cannot tell (no /proc, our processes' fds unreadable)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    seen = False
    for pid in _session_pids(session):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        seen = True
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return True
            except OSError:
                continue
    return False if seen else None
