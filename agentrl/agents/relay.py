"""The agent program's launcher inside the sandbox: it starts the program and is its only way out.

Runs inside the sandbox (``python -I -c <this file's source>``, standard library only: nothing of
agentrl is visible there), started by :mod:`agentrl.agents.sandboxed` with the episode's spec as
JSON on stdin (``command``, ``env``) and, at the descriptor ``$AGENTRL_PASS_FD``, its end of the
episode's bridge (a ``SOCK_SEQPACKET`` socket; the host's end is :mod:`agentrl.agents.bridge`).

Owns: listening on 127.0.0.1 (port chosen by the kernel) in the sandbox's own network namespace;
for each connection the program makes there, a new socket pair whose far end goes over the bridge
(``SCM_RIGHTS``) and whose near end is relayed to and from the connection; starting the program
(``/bin/sh -c command``, its own process group, stdin closed) with ``OPENAI_BASE_URL`` /
``ANTHROPIC_BASE_URL`` pointing at that port, ``AGENTRL_RESULT`` a file in the work dir and
``AGENTRL_WORKDIR`` the work dir (where an env's workspace files are); keeping
the tails of its stdout and stderr; and at its end one JSON line on stdout: ``{"agentrl_relay": 1,
"exit": code, "stdout": tail, "stderr": tail, "result": the result file's text or null}``.
One thread (a selector): threads would count against the sandbox's process limit and each
reserve address space against its memory limit.

Does not: check keys or record anything (the endpoint does), enforce limits (the sandbox does).
"""

from __future__ import annotations

import array
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time

TAIL = 8000  # bytes of each of the program's streams kept
RESULT_MAX = 1 << 20  # bytes of the result file read
PIPE_GRACE_S = 0.5  # after the program's exit: how long its pipes may stay open (a background child)
CHUNK = 65536


class Pair:
    """One relayed connection: the program's TCP socket and our end of the bridge socket pair."""

    def __init__(self, sel: selectors.BaseSelector, a: socket.socket, b: socket.socket) -> None:
        self.sel, self.socks = sel, (a, b)
        self.out = {a: bytearray(), b: bytearray()}  # what waits to be written to each
        self.eof = {a: False, b: False}  # each has ended its sending
        self.shut: set[socket.socket] = set()  # those we ended our sending to
        self.events = {a: 0, b: 0}  # what the selector watches on each
        self.closed = False
        for s in self.socks:
            s.setblocking(False)
        self.watch()

    def other(self, s: socket.socket) -> socket.socket:
        return self.socks[1] if s is self.socks[0] else self.socks[0]

    def on_event(self, s: socket.socket, mask: int) -> None:
        try:
            if mask & selectors.EVENT_READ and not self.eof[s]:
                data = s.recv(CHUNK)
                if data:
                    self.out[self.other(s)] += data
                else:
                    self.eof[s] = True
            for t in self.socks:
                self.flush(t)
        except OSError:
            return self.close()
        if all(self.eof.values()) and not any(self.out.values()):
            return self.close()
        self.watch()

    def flush(self, t: socket.socket) -> None:
        buf = self.out[t]
        while buf:
            try:
                n = t.send(buf)
            except BlockingIOError:
                return
            del buf[:n]
        if self.eof[self.other(t)] and t not in self.shut:
            self.shut.add(t)
            t.shutdown(socket.SHUT_WR)

    def watch(self) -> None:
        """Read a side while the other's backlog is small (one that does not read holds its sender
        back); write a side while it has a backlog."""
        for s in self.socks:
            want = 0
            if not self.eof[s] and len(self.out[self.other(s)]) <= 4 * CHUNK:
                want |= selectors.EVENT_READ
            if self.out[s]:
                want |= selectors.EVENT_WRITE
            if want == self.events[s]:
                continue
            if not want:
                self.sel.unregister(s)
            elif self.events[s]:
                self.sel.modify(s, want, self)
            else:
                self.sel.register(s, want, self)
            self.events[s] = want

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for s in self.socks:
            if self.events[s]:
                self.sel.unregister(s)
            s.close()


def main() -> int:
    spec = json.loads(sys.stdin.read())
    bridge = socket.socket(fileno=int(os.environ.pop("AGENTRL_PASS_FD")))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    result_path = os.path.join(os.getcwd(), "agentrl-result.json")
    env = {**os.environ, **spec["env"]}
    env.update(
        OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1",
        ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}",
        AGENTRL_RESULT=result_path,
        AGENTRL_WORKDIR=os.getcwd(),
    )
    proc = subprocess.Popen(
        ["/bin/sh", "-c", spec["command"]],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    sel = selectors.DefaultSelector()
    listener.setblocking(False)
    sel.register(listener, selectors.EVENT_READ, "listen")
    tails = {"stdout": bytearray(), "stderr": bytearray()}
    for name in tails:
        stream = getattr(proc, name)
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ, name)
    open_pipes, exited_at = set(tails), None
    while True:
        if exited_at is None and proc.poll() is not None:
            exited_at = time.monotonic()
        if exited_at is not None and (not open_pipes or time.monotonic() - exited_at > PIPE_GRACE_S):
            break
        for key, mask in sel.select(0.05):
            if key.data == "listen":
                _accept(sel, listener, bridge)
            elif isinstance(key.data, str):
                try:
                    data = os.read(key.fd, CHUNK)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(key.fileobj)
                    open_pipes.discard(key.data)
                    continue
                tail = tails[key.data]
                tail += data
                del tail[:-TAIL]
            else:
                key.data.on_event(key.fileobj, mask)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what it left running in its group
    except OSError:
        pass
    print(
        json.dumps(
            {
                "agentrl_relay": 1,
                "exit": proc.returncode,
                "stdout": tails["stdout"].decode("utf-8", "replace"),
                "stderr": tails["stderr"].decode("utf-8", "replace"),
                "result": _read(result_path),
            }
        ),
        flush=True,
    )
    return 0


def _accept(sel: selectors.BaseSelector, listener: socket.socket, bridge: socket.socket) -> None:
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        bridge.sendmsg([b"c"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno()]).tobytes())])
    except OSError:
        conn.close()
        ours.close()
        return
    finally:
        theirs.close()
    Pair(sel, conn, ours)


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(RESULT_MAX).decode("utf-8", "replace")
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())
