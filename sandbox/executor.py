"""The local backend's executor: a small single-threaded process that forks every sandboxed program.

Owns: the executor's main loop (requests in over a Unix socket, "started"/"exit" notes out), what a
child does between fork and exec (its own session, its pipes at fds 0-2, every other fd closed,
default signal dispositions, mount/network namespaces, the dedicated uid, no-new-privs, the
parent-death signal, rlimits), the *warm* Python path, and the libc mount primitives the jail
shares with it. The client (``agentrl.sandbox.executor_client``) starts it and talks to it.

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
It saves the interpreter start-up of every call. What differs from a cold ``python3 -``: the
modules this file imports are already in ``sys.modules``, and the str hash seed is the
executor's, shared by all calls (``random`` is reseeded per call).

Does not: decide any policy (the client sends the whole plan), pick uids, make work dirs, enforce
deadlines or read output (the client does those: it holds the other ends of the pipes and kills
the child's process group). Runs as a script (``python -I executor.py FD``); nothing from agentrl
is imported here, so the jail code the trainer shares lives at the bottom of this file.
"""
from __future__ import annotations

import ctypes
import fcntl
import json
import os
import resource
import selectors
import signal
import socket
import sys

MB = 1 << 20
MAX_FDS = 8  # stdin, stdout, stderr, bwrap's status fd, a memfd holding a large request
_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC, _CLONE_NEWNET, _CLONE_NEWPID = (
    0x00020000, 0x04000000, 0x08000000, 0x40000000, 0x20000000)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
INODES_PER_MB = 64  # tmpfs: 8 k inodes for 128 MB stops an inode flood and fits real programs
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")


# ------------------------------------------------------------------------------ libc mount primitives
def check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount_tmpfs(path: str, size_mb: int, uid: int, mode: str = "0700") -> None:
    opts = f"size={size_mb}m,nr_inodes={max(256, size_mb * INODES_PER_MB)},mode={mode},uid={uid},gid={uid}"
    check(_LIBC.mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts.encode()), f"tmpfs on {path}")


def bind(src: str, dst: str, *, readonly: bool) -> None:
    check(_LIBC.mount(src.encode(), dst.encode(), None, _MS_BIND | _MS_REC, None), f"bind {dst}")
    if readonly:
        remount_readonly(dst)


def remount_readonly(path: str) -> None:
    check(_LIBC.mount(None, path.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV,
                      None), f"ro {path}")


def make_private(path: str) -> None:
    check(_LIBC.mount(None, path.encode(), None, _MS_REC | _MS_PRIVATE, None), f"make {path} private")


def unmount(path: str) -> None:
    _LIBC.umount2(path.encode(), _MNT_DETACH)


# ------------------------------------------------------------------------------ the child's setup
def apply_mounts(plan: dict, workdir: str, disk_mb: int) -> None:
    """In the child, as root: private mount namespace (and empty network/IPC/UTS ones when
    ``plan["isolate"]``), tmpfs scratch dirs, and the trainer's Python prefix grafted read-only
    at its own path under a tmpfs over its first unreachable ancestor (``plan["grafts"]``:
    [anchor, prefix] pairs). See ``agentrl.sandbox.jail.ChildMounts``."""
    isolate, grafts = plan["isolate"], [tuple(g) for g in plan["grafts"]]
    flags = _CLONE_NEWNS | (_CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS if isolate else 0)
    check(_LIBC.unshare(flags), "unshare")
    make_private("/")  # first: a new mount must never propagate back to the host's namespace
    scratch = [d for d in SCRATCH if isolate and os.path.isdir(d) and not os.path.islink(d)]
    # Open what the new tmpfs mounts will hide, in this namespace (bind sources must be ours).
    binds = [(p, True) for _, p in grafts]
    if any(workdir.startswith(d + "/") for d in scratch):
        binds.append((workdir, False))
    fds = [os.open(src, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for src, _ in binds]
    for d in scratch:
        mount_tmpfs(d, disk_mb, 0, mode="1777")
    for anchor in dict.fromkeys(a for a, _ in grafts):
        check(_LIBC.mount(b"tmpfs", anchor.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=1m,mode=0755"),
              f"tmpfs over {anchor}")
    for (dst, ro), fd in zip(binds, fds):
        os.makedirs(dst, exist_ok=True)
        bind(f"/proc/self/fd/{fd}", dst, readonly=ro)
        os.close(fd)
    os.chdir(workdir)  # the cwd set before us may now lie under the new /tmp: take the re-bound one


def prepare(req: dict, fds: list[int], err_fd: int) -> None:
    """The first stage, still as the executor's user: own session, the pipes at 0-2 (bwrap's
    status pipe at 3), every other fd closed but ``err_fd`` (> 3, for the caller's report),
    default signal dispositions, the parent-death signal, the work dir, and the namespaces."""
    os.setsid()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)  # dup2 clears CLOEXEC on the copy
    keep = 3
    if req.get("status_fd"):  # bwrap's --json-status-fd, always at 3 in the child
        os.dup2(fds[3], 3)
        keep = 4
    os.closerange(keep, err_fd)  # nothing of the executor's (its socket above all) may reach the program
    os.closerange(err_fd + 1, max(os.sysconf("SC_OPEN_MAX"), 65536))
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)  # what subprocess's restore_signals does, and ours
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.set_wakeup_fd(-1)  # the executor's wakeup pipe is closed now; its number may be reused
    if req.get("pdeathsig", True):
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.chdir(req["cwd"])
    if req.get("mounts"):
        apply_mounts(req["mounts"], req["cwd"], req["disk_mb"])


def drop_privileges(req: dict) -> None:
    """The last stage before the program: the dedicated uid, no-new-privs, the parent-death
    signal (again: a credential change clears it), the rlimits (RLIMIT_AS last, as ordered)."""
    uid = req.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        check(_LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")  # setuid binaries stay inert
    if req.get("pdeathsig", True):
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for res, soft, hard in req.get("rlimits", []):
        resource.setrlimit(res, (soft, hard))


def _wait_for(pid: int) -> int:
    """Wait for ``pid``, reaping whatever else is reparented to us meanwhile (as a pid 1 must);
    its exit code, or -signal."""
    while True:
        try:
            got, status = os.wait()
        except ChildProcessError:
            return 127
        if got == pid:
            return os.waitstatus_to_exitcode(status)


def _end_like(code: int) -> None:
    """Exit with ``code``, or die of signal ``-code``."""
    if code >= 0:
        os._exit(code)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
    os._exit(128 - code)


def enter_pid_namespace(req: dict, err_fd: int) -> int:
    """Run the rest in a new pid namespace with an init of ours. ``unshare(CLONE_NEWPID)``
    applies to the next child: it becomes pid 1, mounts a /proc that shows only the namespace,
    drops privileges and forks the program. The first process stays in the host namespace and
    ends exactly as the program did: pid 1 cannot die of a signal it sends itself, so it writes
    the program's signal to a pipe (returned: the program must close it). When pid 1 exits the
    kernel kills everything left in the namespace (``setsid`` orphans, daemons): nothing of a
    run outlives it. Returns in the program's process."""
    sig_r, sig_w = os.pipe2(os.O_CLOEXEC)
    check(_LIBC.unshare(_CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    init = os.fork()
    if init:  # stage 1, in the host namespace
        os.close(err_fd)
        os.close(sig_w)
        code = _wait_for(init)
        os.set_blocking(sig_r, False)
        try:
            sig = os.read(sig_r, 16)
        except BlockingIOError:
            sig = b""
        _end_like(-int(sig) if sig.strip().isdigit() else code)
    os.close(sig_r)  # pid 1 of the new namespace
    check(_LIBC.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None), "mount /proc")
    drop_privileges(req)
    program = os.fork()
    if program:
        os.close(err_fd)
        code = _wait_for(program)
        if code < 0:
            os.write(sig_w, str(-code).encode())
        os._exit(code if code >= 0 else 0)
    if req.get("pdeathsig", True):  # cleared by fork
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return sig_w


def run_python(env: dict) -> int:
    """The warm path: run the program on stdin as ``python3 -`` would; returns the exit code (or
    -signal to die of)."""
    import builtins
    import io
    import types

    # The dispositions a starting interpreter sets (prepare() gave the exec'd programs the defaults).
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    if "random" in sys.modules:
        sys.modules["random"].seed()
    with io.FileIO(0, "r", closefd=False) as f:
        source = f.readall()
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                                   write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                                   errors="backslashreplace", write_through=True)
    sys.argv = ["-"]
    sys.path.insert(0, "")
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    code = 0
    try:
        exec(compile(source, "<stdin>", "exec"), main.__dict__)
    except SystemExit as e:
        code = _system_exit_code(e)
    except BaseException as e:
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1  # CPython dies of SIGINT then
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()  # join non-daemon threads, as interpreter exit does
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except SystemExit as e:
        code = _system_exit_code(e)
    except BaseException:
        pass
    return code


def _system_exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    try:
        print(e.code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def _child(req: dict, fds: list[int], err_w: int) -> None:
    """In the forked child: never returns."""
    try:
        if err_w <= 3:  # the status fd goes to 3: keep the error pipe out of the way
            err_w = fcntl.fcntl(err_w, fcntl.F_DUPFD_CLOEXEC, 4)
        prepare(req, fds, err_w)
        if req.get("mounts") and req["mounts"].get("pidns"):
            os.close(enter_pid_namespace(req, err_w))  # the init's relay pipe is not the program's
        else:
            drop_privileges(req)
        if req.get("warm"):
            os.close(err_w)  # set up: the client may count it as started
            _end_like(run_python(req["env"]))
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
