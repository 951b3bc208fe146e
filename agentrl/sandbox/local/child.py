"""What a jail (a child of the local executor) does from its fork to the program, for the local executor.

Owns: the life of a jail (``run_jail``) in its stages: ``prepare`` (own session, the executor's
descriptors closed, default signals, the parent-death signal), the namespaces and mounts of its
plan (``agentrl.sandbox.local.mounts``), the pid namespace with an init of ours as pid 1
(``_split_pid_namespace``; as bubblewrap's view, also a user namespace of its own in which no
further one can be made), then the request: the program's descriptors at 0-2 (bwrap's status pipe
at 3), the work dir given to the run's uid, ``drop_privileges`` (uid, no-new-privs, rlimits), and
the program: exec'd, spawned by the init (``posix_spawn``: no copy of a Python process), or run
by the warm interpreter (``agentrl.sandbox.local.warm_python``).

A jail is prepared either for a request in hand (cold) or ahead of one (ready: its namespaces
made, it waits on its channel, held by the trainer's client, for the next request of its kind).
Everything a ready jail does before the request is the same for every request of that kind (the
``jail`` part of a request); everything after depends on the request. A jail with its own pid
namespace reports the program's end on its channel as soon as its init sees it (``{"exit"}``),
ahead of the namespace's teardown and the executor's reaping.

Imports only the standard library: the executor runs it without agentrl on its path.
Does not: fork the jail itself, talk to the trainer, or decide any policy (the request says what to apply).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import resource
import signal
import socket
from collections.abc import Callable
from typing import Any

if __package__:
    from agentrl.sandbox.local import mounts, wire
    from agentrl.sandbox.local.warm_python import run_python
else:  # run by the executor as a script
    import mounts
    import wire
    from warm_python import run_python

_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG, _PR_SET_NAME, _PR_SET_NO_NEW_PRIVS = 1, 15, 38
HIGH_FD = 10  # our own descriptors (error pipe, channel, relay pipes) live above the program's 0-3
# What the host sees in /proc/PID/comm: a jail waiting for its request, one running it. A pid namespace's
# first stage keeps READY_NAME throughout (renaming would cost it a wake-up): its init's name tells.
READY_NAME, JAIL_NAME = b"agentrl-ready", b"agentrl-jail"
_RESET = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)
# On the error pipe: the init told the client how the program ended; a ready jail failed before its request.
REPORTED, UNPREPARED = "\0reported", "\0unprepared: "


def run_jail(jail: dict, req: dict | None, fds: list[int], chan: int | None, err_w: int, startup: frozenset) -> None:
    """The whole life of a jail (never returns). ``req`` None: a ready jail, which waits on
    ``chan`` for its request; with a pid namespace the init reports the exit on ``chan``. A
    failure before the program runs is written to ``err_w`` and the jail exits 127 (the executor
    reads it when it reaps the jail)."""
    try:
        err_w, *rest = _raise_fds([err_w, *([chan] if chan is not None else []), *fds])
        if chan is not None:
            chan, *rest = rest
        fds = rest
        prepare(jail, keep={err_w, *fds, *([chan] if chan is not None else [])}, ready=req is None)
        plan = jail.get("mounts")
        if plan:
            host_workdir = None if plan.get("workdir") else req["workdir"]  # a cold jail's: the trainer made it
            mounts.enter_namespaces(plan)
            if plan.get("root"):
                mounts.build_root(plan["root"], host_workdir, jail["disk_mb"])
                mounts.enter_root()
            else:
                mounts.isolate_host(plan, host_workdir, jail["disk_mb"])
        pidns = plan and plan.get("pidns")
        relay = _split_pid_namespace(plan, err_w, chan, jail.get("pdeathsig", True)) if pidns else None
        if req is None:  # prepared: the request may be waiting already
            _rehearse()
            _on_channel(chan, lambda sock: None)
            got = _on_channel(chan, wire.recv)
            if got is None:
                os._exit(0)  # nobody will send a request: let go
            req, fds = got
        if relay is None and chan is not None:
            os.close(chan)
            chan = None
        start(jail, req, fds, err_w, relay, chan, startup)
    except BaseException as e:
        try:
            stage = UNPREPARED if req is None else ""
            os.write(err_w, f"{stage}{type(e).__name__}: {e}".encode("utf-8", "replace")[:2000])
        finally:
            os._exit(127)


_SAMPLE = {
    "argv": ["true"],
    "env": {"PATH": "/usr/bin:/bin", "HOME": "/work", "TMPDIR": "/tmp", "LANG": "C.UTF-8"},
    "cwd": "/work",
    "workdir": None,
    "uid": 1,
    "rlimits": [[0, 1, 2]],
    "warm": False,
    "status_fd": False,
    "pass_fd": False,
    "id": 1,
}


def _rehearse() -> None:
    """Walk the request's path once without its effects, while a ready jail waits: a fresh fork
    shares every page with its parent, and the first write to each (a reference count) costs a
    copy-on-write fault (~3 us on a virtual machine); taken now, they are not taken under a request."""
    req = wire.json.loads(wire.json.dumps(_SAMPLE))
    for name in ("argv", "env", "cwd", "workdir", "uid", "rlimits", "warm", "status_fd", "pass_fd", "id"):
        req.get(name)
    touched = (os.dup2, os.closerange, os.chown, os.chdir, os.setgroups, os.setresgid, os.setresuid)
    touched += (os.posix_spawn, os.wait, os.waitstatus_to_exitcode, os.write, os.fork, resource.setrlimit)
    _LIBC.prctl(16, ctypes.create_string_buffer(16), 0, 0, 0)  # PR_GET_NAME: the ctypes call path
    _which("true", "/usr/bin:/bin")
    wire.pack({"exit": 0}, [])
    for fn in (start, drop_privileges, _run_as_init, _wait_for, _close_all_but, set_name, _on_channel, os.execvpe):
        touched += (fn.__code__, *fn.__code__.co_consts)  # what a call takes a reference to
    del touched


def _on_channel(chan: int, use: Callable[[socket.socket], Any]) -> Any:
    """``use(socket)`` on the channel's descriptor, which stays open."""
    sock = socket.socket(fileno=chan)
    try:
        return use(sock)
    finally:
        sock.detach()


def _raise_fds(fds: list[int]) -> list[int]:
    """The same descriptors moved to ``HIGH_FD`` and above (close-on-exec), out of the way of 0-3."""
    out = []
    for fd in fds:
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD)
        os.close(fd)
        out.append(high)
    return out


def _close_all_but(keep: set[int]) -> None:
    low = 0
    for fd in sorted(keep):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, max(os.sysconf("SC_OPEN_MAX"), 65536))


def set_name(name: bytes) -> None:
    _LIBC.prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def prepare(jail: dict, keep: set[int], ready: bool) -> None:
    """The first stage, still as the executor's user: own session, a name the host can tell
    (``READY_NAME`` while it waits for a request), every descriptor but ``keep`` and 0-2 closed
    (nothing of the executor's, its socket above all, may reach the program), default signal
    dispositions, the parent-death signal."""
    os.setsid()
    set_name(READY_NAME if ready else JAIL_NAME)
    for sig in _RESET:
        signal.signal(sig, signal.SIG_DFL)  # what subprocess's restore_signals does, and ours
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.set_wakeup_fd(-1)  # before the executor's wakeup pipe is closed: its number may be reused
    _close_all_but({0, 1, 2, *keep})
    if jail.get("pdeathsig", True):
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def start(
    jail: dict, req: dict, fds: list[int], err_w: int, relay: int | None, chan: int | None, startup: frozenset
) -> None:
    """Apply the request and run the program (never returns): its descriptors at 0-2 (then bwrap's
    status pipe, then the one descriptor the request passes, each at the next number),
    the work dir made for the run given to its uid, then as the program (no pid namespace) or as
    the namespace's init (``relay``: the pipe to the first stage; ``chan``: where to report)."""
    set_name(JAIL_NAME)  # (a pid namespace's first stage keeps READY_NAME: the host tells by its init's)
    inherited = 3 + bool(req.get("status_fd")) + bool(req.get("pass_fd"))  # 0-2, bwrap's status, the passed one
    for target, fd in enumerate(fds[:inherited]):
        os.dup2(fd, target)  # dup2 clears CLOEXEC on the copy
    _close_all_but({*range(inherited), err_w, *(fd for fd in (relay, chan) if fd is not None)})
    plan = jail.get("mounts") or {}
    if plan.get("workdir"):
        mounts.take_workdir(plan["workdir"], req.get("uid"))
    os.chdir(req["cwd"])
    drop_privileges(req, jail.get("pdeathsig", True))
    if relay is None:  # this process becomes the program
        if req.get("warm"):
            os.close(err_w)
            end_like(run_python(req["env"], startup))
        os.execvpe(req["argv"][0], req["argv"], req["env"])  # err_w is CLOEXEC: closed on success
    _run_as_init(req, err_w, relay, chan, startup)


def drop_privileges(req: dict, pdeathsig: bool = True) -> None:
    """The last stage before the program: the dedicated uid, no-new-privs, the parent-death
    signal (again: a credential change clears it), the rlimits (RLIMIT_AS last, as ordered)."""
    uid = req.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        mounts.check(_LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")  # setuid binaries stay inert
    if pdeathsig:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for res, soft, hard in req.get("rlimits", []):
        resource.setrlimit(res, (soft, hard))


# ------------------------------------------------------------------------------ the pid namespace
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


def _split_pid_namespace(plan: dict, err_w: int, chan: int | None, jail_pdeathsig: bool = True) -> int:
    """Run the rest in a new pid namespace with an init of ours. ``unshare(CLONE_NEWPID)``
    applies to the next child: it becomes pid 1 and mounts a /proc that shows only the namespace.
    The first process stays in the host namespace, for the executor to wait on and the trainer to
    signal, and ends exactly as the program did: pid 1 cannot die of a signal it sends itself, so
    it writes the program's signal to the relay pipe. When pid 1 exits the kernel kills everything
    left in the namespace (``setsid`` orphans, daemons): nothing of a run outlives it. With
    ``plan["no_userns"]`` the init then enters a user namespace of its own, all ids mapped to
    themselves by the first process, in which no other can be made. Returns in pid 1: the relay
    pipe's write end."""
    up_r, up_w = os.pipe2(os.O_CLOEXEC)
    ack_r, ack_w = os.pipe2(os.O_CLOEXEC)
    up_w, ack_r = _raise_fds([up_w, ack_r])
    mounts.unshare(mounts.CLONE_NEWPID, "unshare(CLONE_NEWPID)")
    init = os.fork()
    if init:  # the first stage, in the host's pid namespace: it keeps nothing of the run's (its pipes above all)
        _close_all_but({up_r, ack_w})
        _first_stage(init, up_r, ack_w)
    if jail_pdeathsig:  # cleared by fork: a ready init must not outlive its first stage (nor run a request then);
        # had the first stage died before this, the write to it below kills us (SIGPIPE)
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.close(up_r)
    os.close(ack_w)
    mounts.mount_proc("/proc")
    if plan.get("no_userns"):
        mounts.unshare(mounts.CLONE_NEWUSER, "unshare(CLONE_NEWUSER)")
        os.write(up_w, b"u")
        if os.read(ack_r, 1) != b"k":
            raise OSError(errno.EPERM, "the first stage did not map our user namespace")
        mounts.forbid_user_namespaces()
    else:
        os.write(up_w, b"-")  # nothing to map: the first stage goes on to wait
    os.close(ack_r)
    return up_w


def _first_stage(init: int, up_r: int, ack_w: int) -> None:
    """Serve the init (map its user namespace when it asks), then end as it did."""
    if os.read(up_r, 1) == b"u":
        try:
            mounts.map_all_ids(1)  # our /proc is the namespace's, mounted by the init
            os.write(ack_w, b"k")
        except OSError:
            pass  # the init fails with the reason; we end with it
    os.close(ack_w)
    code = _wait_for(init)
    os.set_blocking(up_r, False)
    try:
        sig = os.read(up_r, 16)
    except BlockingIOError:
        sig = b""
    end_like(-int(sig) if sig.strip().isdigit() else code)


def _run_as_init(req: dict, err_w: int, relay_w: int, chan: int | None, startup: frozenset) -> None:
    """As pid 1: start the program, let go of its pipes, wait for it (reaping orphans), report how
    it ended on ``chan`` and relay it to the first stage."""
    argv, env = req["argv"], req["env"]
    program = None
    if not req.get("warm"):
        try:
            program = os.posix_spawn(
                _which(argv[0], env.get("PATH", os.defpath)), argv, env, setsigdef=_RESET, setsigmask=()
            )
        except OSError as e:
            if e.errno != errno.ENOMEM:  # ENOMEM: this process is over RLIMIT_AS; a fork does not need more
                raise
    if program is None:
        program = _fork_program(req, relay_w, chan, err_w, startup)
    _close_all_but({err_w, relay_w, *([chan] if chan is not None else [])})  # the pipes close when the program's do
    code = _wait_for(program)
    if chan is not None:
        try:
            _on_channel(chan, lambda sock: wire.send(sock, {"exit": code}, flags=socket.MSG_DONTWAIT))
            os.write(err_w, REPORTED.encode())  # the executor need not tell the client again
        except OSError:
            pass  # the client is gone, or busy: the executor's note tells it
    if code < 0:
        os.write(relay_w, str(-code).encode())
    os._exit(code if code >= 0 else 0)


def _fork_program(req: dict, relay_w: int, chan: int | None, err_w: int, startup: frozenset) -> int:
    """The program in a fork of the init (the warm run, or an exec when posix_spawn cannot); an
    exec that fails raises here, as posix_spawn's would."""
    argv, env = req["argv"], req["env"]
    x_r, x_w = os.pipe2(os.O_CLOEXEC)
    program = os.fork()
    if program == 0:
        try:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # cleared by fork
            for fd in (x_r, relay_w, err_w, *([chan] if chan is not None else [])):
                os.close(fd)
            if req.get("warm"):
                os.close(x_w)
                end_like(run_python(env, startup))
            os.execvpe(argv[0], argv, env)
        except BaseException as e:
            try:
                os.write(x_w, f"{type(e).__name__}: {e}".encode("utf-8", "replace")[:2000])
            except OSError:
                pass
        finally:
            os._exit(127)
    os.close(x_w)
    with os.fdopen(x_r, "rb") as f:
        failed = f.read()  # EOF at a successful exec (or as the warm run starts)
    if failed:
        _wait_for(program)
        raise OSError(errno.ENOEXEC, failed.decode("utf-8", "replace"))
    return program


def _which(name: str, path: str) -> str:
    """Where ``execvp`` would find ``name`` on ``path`` (the program's PATH, not ours)."""
    if "/" in name:
        return name
    for d in path.split(os.pathsep):
        cand = os.path.join(d or ".", name)
        if os.access(cand, os.X_OK) and not os.path.isdir(cand):
            return cand
    raise FileNotFoundError(errno.ENOENT, f"No such file or directory: {name!r}")
