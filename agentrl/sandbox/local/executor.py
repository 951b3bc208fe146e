"""The local backend's executor: a small single-threaded process that forks every sandboxed program.

Owns: the executor's main loop (requests in over Unix sockets, notes out), its pool of ready jails,
and the life of each jail as the trainer sees it. What a jail does between its fork and the
program is in ``agentrl.sandbox.local.child``; the client (``agentrl.sandbox.local.client``) starts
this process and talks to it.

Why a separate process: a ``preexec_fn`` forks the trainer, a process with gigabytes mapped and
dozens of threads (torch, OpenMP, the tokenizer): the fork copies page tables of the whole
trainer, and the child then runs Python code in a copy of a process whose other threads may have
held the allocator's or the interpreter's locks at the fork, so it can stall. This process is
started by a fresh ``exec`` (never a fork of the trainer), imports only the standard library,
never starts a thread, and holds no secrets (its environment is a bare ``PATH``), so a fork of it
is a fork of a ~20 MB single-threaded process.

Ready jails: a fork of even this small process costs about a millisecond of CPU on a virtual
machine (page tables, copy-on-write faults), more than a whole ``posix_spawn``, and a jail's
namespaces cost as much again. Neither depends on the request, only on its kind (the request's
``jail``: mount plan, disk size, parent-death signal). So once a connection has asked for a kind,
the executor, when idle, prepares one jail of that kind for it (its namespaces made, its init
waiting) and hands it over: the client sends its next request of that kind straight to the jail,
and only the request's own steps are left. Only the ``MAX_READY`` (connection, kind) pairs used
most recently keep a ready jail (an env with an event loop of its own has a connection of its own:
hundreds of idle jails would be waste). Without a ready jail (a burst), the request comes here and
a cold jail is forked for it. Each jail still serves exactly one request: fresh process, fresh
namespaces, fresh work dir. A ready jail is named ``agentrl-ready`` on the host.

The messages it takes and sends are listed in ``agentrl.sandbox.local.wire``.

Warm Python: for ``python3 -`` (the ``python`` tool), when the requested interpreter is this one,
the jail does not exec: it runs the program from stdin in a fork of this warm interpreter
(``agentrl.sandbox.local.warm_python``), saving the interpreter start-up of every call.

Does not: decide any policy (the client sends the whole plan), pick uids, make host work dirs (it
removes those handed over), enforce deadlines or read output (the client holds the other ends of
the pipes and kills the jail's process group). Runs as a script (``python -I executor.py FD``) with only the standard
library and its sibling modules: nothing of agentrl (nor numpy, whose import starts threads).
"""

from __future__ import annotations

import sys

STARTUP_MODULES = frozenset(sys.modules)  # what any interpreter has at start: the warm run keeps only these

import collections  # noqa: E402
import json
import os
import selectors
import signal
import socket

if __package__:  # imported as agentrl.sandbox.local.executor
    from agentrl.sandbox.local import child, wire
else:  # run as a script (python -I executor.py FD): nothing of agentrl is on the path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import child
    import wire

    del sys.path[0]

MAX_READY = 4  # (connection, kind) pairs that keep a ready jail: the most recently used
MAX_WANTED = 64  # pairs remembered at all
REFILL_IDLE_S = 0.002  # prepare ready jails only after this long without an event: never in a request's way
WORKDIR_PREFIX = "agentrl-sbx-"  # (agentrl.sandbox.subprocess_runner's)


class Jail:
    """One forked jail: ready (``kind``, waiting for its request) or running one, for ``conn``."""

    __slots__ = ("pid", "err_r", "conn", "kind", "rid")

    def __init__(self, pid: int, err_r: int) -> None:
        self.pid, self.err_r = pid, err_r
        self.conn: Conn | None = None
        self.kind: str | None = None
        self.rid: object = None  # a cold jail's request id


class Conn:
    """A client connection: the notes waiting to go out on it, its jails, its ready ones by kind."""

    __slots__ = ("sock", "out", "jails", "ready")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.out: collections.deque = collections.deque()  # (payload, fds)
        self.jails: set[int] = set()
        self.ready: dict[str, int] = {}  # kind -> pid of the ready jail handed over


class Executor:
    """Serves its clients until the first socket closes; then kills what is left and returns."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, Conn] = {}
        self.jails: dict[int, Jail] = {}  # pid -> every jail not yet reaped
        # (connection fd, kind) -> (connection, plan), least recently used first
        self.wanted: collections.OrderedDict[tuple[int, str], tuple[Conn, dict]] = collections.OrderedDict()
        self.trash: collections.deque[str] = collections.deque()  # work dirs to remove when idle
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        self.wake_r = wake_r
        self.sel.register(control, selectors.EVENT_READ, "control")
        self.sel.register(wake_r, selectors.EVENT_READ, "wake")
        with open("/proc/self/comm", "rb") as f:
            self.name = f.read().strip()

    # -------------------------------------------------------------------------- the loop
    def serve(self) -> None:
        while True:
            refill = self._refill_due()
            events = self.sel.select(REFILL_IDLE_S if refill or self.trash else None)
            if not events:  # idle: prepare a jail for a connection's next request, or clean up
                self.refill() if refill else _remove_workdir(self.trash.popleft())
            for key, mask in events:
                if key.data == "control":
                    if not self.on_control():
                        return self.shutdown()
                elif key.data == "wake":
                    _drain(self.wake_r)
                else:
                    if mask & selectors.EVENT_WRITE:
                        self.flush(key.data)
                    if mask & selectors.EVENT_READ:
                        self.on_message(key.data)
            self.reap()

    def on_control(self) -> bool:
        try:
            got = wire.recv(self.control)
        except ValueError:
            return True
        except OSError:
            return False
        if got is None:
            return False
        msg, fds = got
        for fd in fds:
            if msg.get("connect"):
                sock = socket.socket(fileno=fd)
                conn = self.conns[fd] = Conn(sock)
                self.sel.register(sock, selectors.EVENT_READ, conn)
            else:
                os.close(fd)
        return True

    def on_message(self, conn: Conn) -> None:
        try:
            got = wire.recv(conn.sock, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except ValueError as e:
            return self.note(conn, {"id": None, "error": str(e)})
        except OSError:
            got = None
        if got is None:
            return self.drop(conn)
        req, fds = got
        if "remove" in req:  # a work dir nobody uses any more (see _remove_workdir)
            self.trash.append(req["remove"])
            return None
        if "kill" in req or "kill_id" in req:
            for fd in fds:
                os.close(fd)
            for pid in (
                [req["kill"]] if "kill" in req else [p for p in conn.jails if self.jails[p].rid == req["kill_id"]]
            ):
                if pid in conn.jails:
                    _kill_jail(pid)
            return None
        self.start(conn, req, fds)

    # -------------------------------------------------------------------------- jails
    def start(self, conn: Conn, req: dict, fds: list[int]) -> None:
        """A cold jail for ``req``; the connection will want one of its kind ready next time."""
        rid, plan = req.get("id"), req.pop("jail", None) or {}
        try:
            jail, chan = self._fork(plan, req, fds)
        except OSError as e:
            return self.note(conn, {"id": rid, "error": f"fork failed: {e}"})
        finally:
            for fd in fds:
                os.close(fd)  # the jail has them; the client holds the other ends
        jail.conn, jail.rid = conn, rid
        conn.jails.add(jail.pid)
        self.note(conn, {"id": rid, "pid": jail.pid}, [chan.detach()] if chan else [])
        kind = wire.jail_kind(plan)
        if kind is not None:
            self._used(conn, kind, plan)

    def _used(self, conn: Conn, kind: str, plan: dict) -> None:
        key = (conn.sock.fileno(), kind)
        self.wanted[key] = (conn, plan)
        self.wanted.move_to_end(key)
        while len(self.wanted) > MAX_WANTED:
            self.wanted.popitem(last=False)

    def _fork(self, plan: dict, req: dict | None, fds: list[int]) -> tuple[Jail, socket.socket | None]:
        """A cold jail for ``req``, or a ready one (``req`` None); and our end of its channel
        (a ready jail's, or one with its own pid namespace: it reports the exit there)."""
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        ours = theirs = None
        if req is None or (plan.get("mounts") or {}).get("pidns"):
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        child.set_name(child.READY_NAME if req is None else child.JAIL_NAME)  # inherited: the host can tell at once
        try:
            pid = os.fork()
        except OSError:
            child.set_name(self.name)
            for s in (ours, theirs):
                if s is not None:
                    s.close()
            for fd in (err_r, err_w):
                os.close(fd)
            raise
        if pid == 0:
            child.run_jail(plan, req, fds, theirs.detach() if theirs else None, err_w, STARTUP_MODULES)
        child.set_name(self.name)
        os.close(err_w)
        if theirs is not None:
            theirs.close()
        self.jails[pid] = jail = Jail(pid, err_r)
        return jail, ours

    def _recent(self) -> list[tuple[tuple[int, str], Conn, dict]]:
        return [(key, conn, plan) for key, (conn, plan) in list(self.wanted.items())[-MAX_READY:]]

    def _refill_due(self) -> bool:
        return any(key[1] not in conn.ready for key, conn, _ in self._recent())

    def refill(self) -> None:
        """Hand the most recently used (connection, kind) that lacks one a ready jail; let go of
        ready jails no recent pair keeps."""
        recent = self._recent()
        keep = {(conn.sock.fileno(), kind) for (_, kind), conn, _ in recent}
        for conn in self.conns.values():
            for kind, pid in list(conn.ready.items()):
                if (conn.sock.fileno(), kind) not in keep:
                    del conn.ready[kind]
                    self.jails[pid].kind = None
                    # Not killed: the client may be sending it a request right now. Unless it has,
                    # it lets go of the channel, and the jail ends at the EOF.
                    self.note(conn, {"drop": kind, "pid": pid})
        for key, conn, plan in reversed(recent):
            if key[1] in conn.ready:
                continue
            try:
                jail, chan = self._fork(plan, None, [])
            except OSError:
                self.wanted.pop(key)  # cannot fork now: requests will, and say why
                return
            jail.conn, jail.kind = conn, key[1]
            conn.jails.add(jail.pid)
            conn.ready[key[1]] = jail.pid
            # Handed over at once: a request sent before it is prepared waits in the channel.
            self.note(conn, {"ready": key[1], "pid": jail.pid}, [chan.detach()])
            return

    def reap(self) -> None:
        while self.jails:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            jail = self.jails.pop(pid, None)
            if jail is None:
                continue
            error = _read_error(jail.err_r)
            if jail.conn is None:
                continue
            conn = jail.conn
            conn.jails.discard(pid)
            if jail.kind is not None and conn.ready.get(jail.kind) == pid:
                del conn.ready[jail.kind]  # used (or lost): the next refill replaces it
                key = (conn.sock.fileno(), jail.kind)
                if error.startswith(child.UNPREPARED):
                    self.wanted.pop(key, None)  # it cannot be prepared: cold jails will say why
                elif key in self.wanted:
                    self.wanted.move_to_end(key)  # a ready jail's request never came here: its end tells
            if error == child.REPORTED:
                continue  # its init told the client already
            error = error.removeprefix(child.UNPREPARED)
            msg = {"pid": pid, "exit": os.waitstatus_to_exitcode(status)}
            self.note(conn, {**msg, "error": error} if error else msg)

    # -------------------------------------------------------------------------- notes
    def note(self, conn: Conn, msg: dict, fds: list[int] | tuple[int, ...] = ()) -> None:
        conn.out.append((json.dumps(msg).encode(), list(fds)))
        if len(conn.out) == 1:
            self.flush(conn)

    def flush(self, conn: Conn) -> None:
        """Send what the connection can take now; wait for it to drain otherwise (a client busy
        elsewhere must not stall every other one)."""
        while conn.out:
            payload, fds = conn.out[0]
            try:
                wire.sendmsg_packed(conn.sock, payload, fds, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError:
                pass  # gone: its EOF drops it
            conn.out.popleft()
            for fd in fds:
                os.close(fd)
        if conn.sock.fileno() in self.conns:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
            self.sel.modify(conn.sock, events, conn)

    def drop(self, conn: Conn) -> None:
        for key in [k for k in self.wanted if k[0] == conn.sock.fileno()]:
            del self.wanted[key]
        for pid in conn.jails:
            _kill_jail(pid)
            self.jails[pid].conn = None  # reaped silently
        for _, fds in conn.out:
            for fd in fds:
                os.close(fd)
        self.sel.unregister(conn.sock)
        self.conns.pop(conn.sock.fileno(), None)
        conn.sock.close()

    def shutdown(self) -> None:
        for pid in list(self.jails):
            _kill_jail(pid)
        while self.trash:
            _remove_workdir(self.trash.popleft())


def _remove_workdir(path: str) -> None:
    """Remove a work dir the client handed over after its run (off the run's path: ``rmdir`` on a
    busy ext4 ``/tmp`` takes milliseconds). Only a real directory named as ours."""
    import shutil
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return
    if not (os.path.isabs(path) and stat.S_ISDIR(st.st_mode) and os.path.basename(path).startswith(WORKDIR_PREFIX)):
        return
    try:
        os.rmdir(path)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


def _kill_jail(pid: int) -> None:
    """SIGKILL a jail we have not reaped (so ``pid`` is still ours) and its process group."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _read_error(fd: int) -> str:
    try:
        os.set_blocking(fd, False)
        data = os.read(fd, 4096)
    except OSError:
        data = b""
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace")


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
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
