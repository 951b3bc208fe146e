"""The local backend's executor: a small single-threaded process that forks every sandboxed program.

Owns: the executor's main loop (requests in over a Unix socket, "started"/"exit" notes out) and the
order of a child's stages between fork and exec or the warm run; the stages themselves (session,
fds, signals, namespaces, uid, rlimits, the pid namespace's init, the warm Python path) are in
``agentrl.sandbox.child``. The client (``agentrl.sandbox.executor_client``) starts it and talks to it.

Why a separate process: a ``preexec_fn`` forks the trainer, a process with gigabytes mapped and
dozens of threads (torch, OpenMP, the tokenizer, the reader threads of this very client): the
fork copies page tables of the whole trainer, and the child then runs Python code in a copy of a
process whose other threads may have held the allocator's or the interpreter's locks at the
fork, so it can stall. This process is started by a fresh ``exec`` (never a fork of the trainer),
imports only the standard library, never starts a thread, and holds no secrets (its environment is
a bare ``PATH``), so a fork of it is a fork of a ~20 MB single-threaded process.

Warm Python: for ``python3 -`` (the ``python`` tool), when the requested interpreter is this one,
the child does not exec: after the same jail it reads the program from stdin and runs it as
``__main__`` of its own fresh module, with ``sys.argv == ['-']``, ``''`` first on ``sys.path``, the
request's environment and UTF-8 standard streams, then exits as ``python3 -`` would (``SystemExit``
codes, a traceback and exit 1 on an uncaught exception, non-daemon threads joined, atexit run).
It saves the interpreter start-up of every call. Modules the executor imported after start-up are
dropped from ``sys.modules`` first, so the program imports them afresh (a ``json.py`` in its work
dir shadows the standard one, as with a cold interpreter). What still differs from a cold
``python3 -``: the str hash seed is the executor's, shared by all calls (``random`` is reseeded).

Does not: decide any policy (the client sends the whole plan), pick uids, make work dirs, enforce
deadlines or read output (the client does those: it holds the other ends of the pipes and kills
the child's process group). Runs as a script (``python -I executor.py FD``) with only the standard
library and its sibling ``child.py``: nothing of agentrl (nor numpy, whose import starts threads).
"""

from __future__ import annotations

import sys

STARTUP_MODULES = frozenset(sys.modules)  # what any interpreter has at start: the warm run keeps only these

import fcntl  # noqa: E402
import json
import os
import selectors
import signal
import socket
import sys

if __package__:  # imported as agentrl.sandbox.executor
    from agentrl.sandbox import child
else:  # run as a script (python -I executor.py FD): nothing of agentrl is on the path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import child

    del sys.path[0]

MAX_FDS = 8  # stdin, stdout, stderr, bwrap's status fd, a memfd holding a large request


def _child(req: dict, fds: list[int], err_w: int) -> None:
    """In the forked child: never returns."""
    try:
        if err_w <= 3:  # the status fd goes to 3: keep the error pipe out of the way
            err_w = fcntl.fcntl(err_w, fcntl.F_DUPFD_CLOEXEC, 4)
        child.prepare(req, fds, err_w)
        if req.get("mounts") and req["mounts"].get("pidns"):
            os.close(child.enter_pid_namespace(req, err_w))  # the init's relay pipe is not the program's
        else:
            child.drop_privileges(req)
        if req.get("warm"):
            os.close(err_w)  # set up: the client may count it as started
            child.end_like(child.run_python(req["env"], STARTUP_MODULES))
        os.execvpe(req["argv"][0], req["argv"], req["env"])  # err_w is CLOEXEC: closed on success
    except BaseException as e:
        try:
            os.write(err_w, f"{type(e).__name__}: {e}".encode("utf-8", "replace")[:2000])
        finally:
            os._exit(127)


# ------------------------------------------------------------------------------ the main loop
class Executor:
    """Serves one client on ``sock`` until it closes; then kills what is left and returns."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sel = selectors.DefaultSelector()
        self.children: dict[int, int] = {}  # pid -> request id
        self.errpipes: dict[int, tuple[int, int]] = {}  # read fd -> (request id, pid)
        self.pending_err: dict[int, int] = {}  # pid -> its errpipe read fd, while unread
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        self.wake_r = wake_r
        self.sel.register(sock, selectors.EVENT_READ, "sock")
        self.sel.register(wake_r, selectors.EVENT_READ, "wake")

    def send(self, msg: dict) -> None:
        try:
            self.sock.send(json.dumps(msg).encode())
        except OSError:
            pass  # the client is gone; the loop ends at its EOF

    def serve(self) -> None:
        while True:
            for key, _ in self.sel.select():
                if key.data == "sock":
                    if not self.receive():
                        return self.shutdown()
                elif key.data == "wake":
                    try:
                        while os.read(self.wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                else:
                    self.read_errpipe(key.fd)
            self.reap()

    def receive(self) -> bool:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, MAX_FDS)
        except (ConnectionError, OSError):
            return False
        if not data:
            for fd in fds:
                os.close(fd)
            return False
        try:
            req = json.loads(data)
            if req.get("memfd"):  # a request too large for one packet: the JSON is in the last fd
                with os.fdopen(fds.pop(), "rb") as f:
                    req = json.loads(f.read())
        except (ValueError, OSError) as e:
            for fd in fds:
                os.close(fd)
            self.send({"id": None, "error": f"bad request: {e}"})
            return True
        self.spawn(req, fds)
        return True

    def spawn(self, req: dict, fds: list[int]) -> None:
        rid = req.get("id")
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        try:
            pid = os.fork()
        except OSError as e:
            for fd in (err_r, err_w, *fds):
                os.close(fd)
            self.send({"id": rid, "error": f"fork failed: {e}"})
            return
        if pid == 0:
            os.close(err_r)
            _child(req, fds, err_w)
        os.close(err_w)
        for fd in fds:
            os.close(fd)  # the child has them; the client holds the other ends
        self.children[pid] = rid
        self.errpipes[err_r] = (rid, pid)
        self.pending_err[pid] = err_r
        self.sel.register(err_r, selectors.EVENT_READ, "err")

    def read_errpipe(self, fd: int) -> None:
        rid, pid = self.errpipes.pop(fd)
        self.pending_err.pop(pid, None)
        self.sel.unregister(fd)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
        if data:
            self.send({"id": rid, "error": data.decode("utf-8", "replace")})
        else:
            self.send({"id": rid, "pid": pid})

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.pending_err:  # it died before we read how its start went: that first
                self.read_errpipe(self.pending_err[pid])
            rid = self.children.pop(pid, None)
            self.send({"id": rid, "exit": os.waitstatus_to_exitcode(status)})

    def shutdown(self) -> None:
        for pid in list(self.children):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def main() -> None:
    # Signals meant for the trainer's process group are the trainer's to handle: the executor
    # lives exactly as long as its socket (the trainer's exit, even by SIGKILL, closes it).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    sock = socket.socket(fileno=int(sys.argv[1]))
    os.set_inheritable(sock.fileno(), False)
    Executor(sock).serve()


if __name__ == "__main__":
    main()
