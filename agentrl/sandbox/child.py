"""What a sandboxed child does between fork and exec, for the local executor.

Owns: the libc mount primitives (also used by the trainer's side, ``agentrl.sandbox.jail``), the
mount plan's application (private mount/network/IPC/UTS namespaces, scratch tmpfs, the Python
prefix graft, or the read-only root of ``build_root``), the stages of a child (``prepare``:
session, fds, signals, namespaces; ``drop_privileges``: uid, no-new-privs, parent-death signal,
rlimits; ``enter_pid_namespace``: an init of ours as pid 1), and the warm ``python3 -`` path
(``run_python``). Imports only the standard library: the executor runs it without agentrl on
its path (see ``agentrl.sandbox.executor``).

Does not: fork, talk to the trainer, or decide any policy (the request says what to apply).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import socket
import sys

MB = 1 << 20
_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC, _CLONE_NEWNET, _CLONE_NEWPID = (
    0x00020000,
    0x04000000,
    0x08000000,
    0x40000000,
    0x20000000,
)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_MOVE, _MS_REC, _MS_PRIVATE = (
    1,
    2,
    4,
    8,
    32,
    4096,
    8192,
    16384,
    1 << 18,
)
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
    check(
        _LIBC.mount(None, path.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None),
        f"ro {path}",
    )


def make_private(path: str) -> None:
    check(_LIBC.mount(None, path.encode(), None, _MS_REC | _MS_PRIVATE, None), f"make {path} private")


def unmount(path: str) -> None:
    _LIBC.umount2(path.encode(), _MNT_DETACH)


# ------------------------------------------------------------------------------ the child's setup
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def build_root(view: dict, workdir: str, disk_mb: int) -> None:
    """Make the rest of this process's life see only ``view``, as bubblewrap's root does: a
    read-only tmpfs root with ``view["ro"]`` directories and ``view["files"]`` bound read-only at
    their paths, ``view["links"]`` ({path: target}) as symlinks, ``view["binds"]`` ([src, dst]:
    the Python prefix) read-only, a minimal ``/dev``, a ``/proc`` mount point (the pid namespace's
    init mounts it), tmpfs ``/tmp`` and ``/dev/shm`` of ``disk_mb``, and the work dir read-write at
    ``/work``; then ``chroot`` into it (the program, unprivileged and with no-new-privs, cannot
    chroot back). Needs root in a private mount namespace."""
    new = "/tmp"  # any directory will do: in our private namespace nothing of the host sees it
    sources = [workdir, *view["ro"], *view["files"], *(src for src, _ in view["binds"])]
    fds = {}
    for src in dict.fromkeys(sources):  # open them before the new tmpfs hides what lies under /tmp
        try:
            fds[src] = os.open(src, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            continue

    def at(path: str, *, directory: bool = True) -> str:
        dst = new + path
        os.makedirs(dst if directory else os.path.dirname(dst), exist_ok=True)
        if not directory and not os.path.exists(dst):
            os.close(os.open(dst, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        return dst

    def bind_fd(src: str, dst: str, readonly: bool) -> None:
        bind(f"/proc/self/fd/{fds[src]}", dst, readonly=readonly)

    check(_LIBC.mount(b"tmpfs", new.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=1m,mode=0755"), "root tmpfs")
    for d in view["ro"]:
        if d in fds:
            bind_fd(d, at(d), True)
    for link, target in view["links"].items():
        os.symlink(target, new + link)
    for f in view["files"]:
        if f in fds:
            bind_fd(f, at(f, directory=os.path.isdir(f"/proc/self/fd/{fds[f]}")), True)
    for src, dst in view["binds"]:
        bind_fd(src, at(dst), True)
    dev = at("/dev")
    check(_LIBC.mount(b"tmpfs", dev.encode(), b"tmpfs", _MS_NOSUID, b"size=64k,mode=0755"), "tmpfs /dev")
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            bind(f"/dev/{name}", at(f"/dev/{name}", directory=False), readonly=False)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{dev}/{name}")
    for scratch in ("/tmp", "/dev/shm"):
        mount_tmpfs(at(scratch), disk_mb, 0, mode="1777")
    at("/proc")
    bind_fd(workdir, at("/work"), False)
    for fd in fds.values():
        os.close(fd)
    remount_readonly(dev)
    remount_readonly(new)
    os.chdir(new)
    check(_LIBC.mount(b".", b"/", None, _MS_MOVE, None), "move the new root to /")
    check(_LIBC.chroot(b"."), "chroot")
    os.chdir("/work")


def apply_mounts(plan: dict, workdir: str, disk_mb: int) -> None:
    """In the child, as root: private mount namespace (and empty network/IPC/UTS ones when
    ``plan["isolate"]``), tmpfs scratch dirs, and the trainer's Python prefix grafted read-only
    at its own path under a tmpfs over its first unreachable ancestor (``plan["grafts"]``:
    [anchor, prefix] pairs). See ``agentrl.sandbox.jail.ChildMounts``."""
    isolate, grafts = plan["isolate"], [tuple(g) for g in plan["grafts"]]
    flags = _CLONE_NEWNS | (_CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS if isolate else 0)
    check(_LIBC.unshare(flags), "unshare")
    make_private("/")  # first: a new mount must never propagate back to the host's namespace
    if plan.get("root"):
        if isolate:
            socket.sethostname("sandbox")
        return build_root(plan["root"], workdir, disk_mb)
    scratch = [d for d in SCRATCH if isolate and os.path.isdir(d) and not os.path.islink(d)]
    # Open what the new tmpfs mounts will hide, in this namespace (bind sources must be ours).
    binds = [(p, True) for _, p in grafts]
    if any(workdir.startswith(d + "/") for d in scratch):
        binds.append((workdir, False))
    fds = [os.open(src, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for src, _ in binds]
    for d in scratch:
        mount_tmpfs(d, disk_mb, 0, mode="1777")
    for anchor in dict.fromkeys(a for a, _ in grafts):
        check(
            _LIBC.mount(b"tmpfs", anchor.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=1m,mode=0755"),
            f"tmpfs over {anchor}",
        )
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


def end_like(code: int) -> None:
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
        end_like(-int(sig) if sig.strip().isdigit() else code)
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


def run_python(env: dict, startup_modules: frozenset = frozenset()) -> int:
    """The warm path: run the program on stdin as ``python3 -`` would; returns the exit code (or
    -signal to die of). Modules not in ``startup_modules`` (what the interpreter had at start) are
    forgotten first, so the program's imports resolve as in a cold interpreter (its work dir first)."""
    import builtins
    import io
    import types

    if startup_modules:
        for name in [m for m in sys.modules if m not in startup_modules]:
            del sys.modules[name]  # our own references keep working; the program re-imports

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
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )
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
