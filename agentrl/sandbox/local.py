"""The hardened local backend: a child process under rlimits, inside bubblewrap namespaces when available.

Owns: ``LocalSandbox`` (the default backend where Docker is absent), its bwrap command line and
probe, and how its results are classified. The process mechanics (deadline, group kill, output
caps, work dir, sessions, file copy) are shared with the plain runner in
``agentrl.sandbox.subprocess_runner``; the plan of what happens in the child before exec is in
``agentrl.sandbox.jail``, and the child is forked and jailed by the executor
(``agentrl.sandbox.executor``: a small single-threaded process, never a fork of the trainer; for
``python3 -`` of the trainer's own interpreter it runs the program in a fork of its warm
interpreter instead of exec'ing a new one).

Layers, each on when it can work here (``LocalSandbox.describe()`` says which are on):

1. Always: its own session/process group, killed as a whole at the deadline, at an output
   overflow, on cancellation and after exit; an empty environment; a fresh work dir; stdin closed
   unless given; stdout/stderr capped; rlimits: address space (``memory_mb``), CPU seconds
   (ceil(timeout)+1), file size, open files, core dumps 0; parent-death SIGKILL.
2. When the trainer runs as root (the usual case on our machines), with ``uid_base`` not None:
   the program runs as a dedicated unprivileged uid (one per concurrent run or session, from a
   block of 65536 uids this process holds alone via a lock file) with no-new-privs, never as
   root. That makes RLIMIT_NPROC (``pids``) effective (the kernel exempts root from it), keeps
   host files, the docker socket, other processes' ``/proc/*/environ`` and ``~/.ssh`` out of reach
   by plain permissions, makes ``kill -9 -1`` reach only the run's own processes, and lets us kill
   everything of that uid after the run (``setsid`` orphans, daemons; as root without bwrap the
   run's own pid namespace does that). The work dir is a tmpfs of
   ``disk_mb`` (inodes capped) mounted for the run: filling the disk or the inodes fills only
   that. A Python prefix the uid cannot reach (pyenv under a 0700 ``/root``) is made visible
   read-only at its own path. Stale mounts of a crashed trainer go at the next LocalSandbox.
3. As root without bwrap: private mount, network, IPC, UTS and pid namespaces made in the child:
   no network at all (loopback down), tmpfs ``/tmp``, ``/var/tmp``, ``/dev/shm`` of ``disk_mb``,
   an init of ours as pid 1 and a ``/proc`` that shows only the run (when the run ends its init
   exits and the kernel kills everything left in the namespace).
4. When ``bwrap`` works (probed once): user, pid, network, ipc, uts and cgroup namespaces, no
   further user namespaces, all capabilities dropped, a new terminal session; the filesystem is a
   read-only root showing only ``/usr`` (+ the ``/bin``-style links, a few ``/etc`` files, the
   trainer's Python prefix), a private ``/proc``, a minimal read-only ``/dev``, tmpfs ``/tmp``
   and ``/dev/shm`` of ``disk_mb`` each, and the work dir read-write at ``/work``. When the run
   ends the namespace's init dies and the kernel kills everything left in the namespace.
   As root, a warm ``python3 -`` gets the same view without bwrap: the executor's child builds
   it (``agentrl.sandbox.child.build_root``: private pid/network/IPC/UTS/mount namespaces, the
   read-only root, ``chroot``), then drops to its dedicated uid with no-new-privs. Differences
   from bwrap there: the program sees its host uid (not 1000), and it may still create user
   namespaces of its own (bwrap's ``--disable-userns``; nothing outside them is reachable).

What it does NOT isolate:

* Without bwrap: the filesystem view (everything world-readable on the host is readable: /etc,
  /home dirs with open permissions). As root the run's /proc shows only its own processes; not
  as root, the program sees the host's processes.
* Without root (no dedicated uid, no namespaces we can make): ``pids`` is not enforced
  (RLIMIT_NPROC would count every process of the trainer's user), the work dir is not size-capped
  (only ``fsize_mb`` per file); without bwrap as well, the network is open and the program can
  read, write and signal everything the trainer's user can (``kill -9 -1`` kills the trainer).
* Ever: the kernel is shared (a kernel exploit escapes; gVisor/Docker are the stronger choice);
  memory is an address-space limit, not a cgroup (programs that reserve large virtual memory fail
  early; tmpfs pages in /tmp, /dev/shm and the work dir are host RAM bounded only by their sizes);
  ``cpus`` is not a share (a multi-threaded program may use every core until its CPU-time limit);
  no seccomp filter; timing and cache side channels.

Statuses: ``oom`` when the program dies with a ``MemoryError`` (Python under RLIMIT_AS); other
programs meet allocation failure their own way (often SIGSEGV: ``killed``). Exceeding the CPU-time
limit (SIGXCPU) is ``timeout``. Under bwrap an exit code 129..192 is reported as death by signal
(bwrap folds the two together), and a program that could not be started (``python3`` missing from
the sandbox, say) raises SandboxError.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import sys
import tempfile
import threading

from agentrl.errors import ConfigError, SandboxError
from agentrl.sandbox import jail
from agentrl.sandbox.base import Limits
from agentrl.sandbox.docker_probe import docker_unavailable_reason
from agentrl.sandbox.executor_client import executor
from agentrl.sandbox.subprocess_runner import MB, WORKDIR_PREFIX, Spawn, SubprocessSandbox, Workdir, base_env, killpg

_SANDBOX_UID = 1000  # the uid the program sees inside bwrap (whatever the host uid is)
_ETC = [
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    *sorted(glob.glob("/etc/python3*")),
]
_TOP_LINKS = ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
_STATUS_FD = 3  # where the executor puts bwrap's status pipe in the child


# ------------------------------------------------------------------------------ probes (cached)
_PROBES: dict[str, object] = {}
_PROBE_LOCK = threading.Lock()


def bwrap_unavailable_reason(uid: int | None = None) -> str | None:
    """None when bwrap can build our sandbox here (run as ``uid``), else why not. Probed once per uid."""
    key = f"bwrap:{uid}"
    with _PROBE_LOCK:
        if key not in _PROBES:
            _PROBES[key] = _probe_bwrap(uid)
    return _PROBES[key]  # type: ignore[return-value]


def _probe_bwrap(uid: int | None) -> str | None:
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap is not installed (Debian: apt-get install bubblewrap)"
    workdir = tempfile.mkdtemp(prefix=WORKDIR_PREFIX + "probe-")
    try:
        if uid is not None:
            os.chown(workdir, uid, uid)
        argv = _bwrap_argv(exe, workdir, Limits(), None, []) + ["/bin/sh", "-c", "echo ok > /work/probe"]
        request = {"argv": argv, "env": {"PATH": "/usr/bin:/bin"}, "cwd": workdir, "uid": uid, "pdeathsig": False}
        code, err = executor().run_sync(request, timeout_s=20)
        if code != 0 or not os.path.exists(os.path.join(workdir, "probe")):
            return f"bwrap does not work here (exit {code}): {err.strip()[:300]}"
        return None
    except (OSError, SandboxError) as e:
        return f"bwrap does not work here: {e}"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _can_mount_tmpfs() -> bool:
    with _PROBE_LOCK:
        if "tmpfs" not in _PROBES:
            path = tempfile.mkdtemp(prefix=WORKDIR_PREFIX + "probe-")
            try:
                jail.mount_tmpfs(path, 1, 0)
                jail.unmount(path)
                _PROBES["tmpfs"] = True
            except OSError:
                _PROBES["tmpfs"] = False
            os.rmdir(path)
    return bool(_PROBES["tmpfs"])


# ------------------------------------------------------------------------------ bwrap
def _bwrap_argv(
    exe: str, workdir: str, limits: Limits, status_fd: int | None, binds: list[tuple[str, str]]
) -> list[str]:
    disk = str(limits.disk_mb * MB)
    argv = [
        exe,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        str(_SANDBOX_UID),
        "--gid",
        str(_SANDBOX_UID),
        "--hostname",
        "sandbox",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for top in _TOP_LINKS:
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    for path in _ETC:
        argv += ["--ro-bind-try", path, path]
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        disk,
        "--tmpfs",
        "/tmp",
        "--size",
        disk,
        "--tmpfs",
        "/dev/shm",
        "--bind",
        workdir,
        "/work",
        "--chdir",
        "/work",
    ]
    for src, dst in binds:  # after the tmpfs /tmp, which would hide a Python prefix under /tmp (a venv there)
        argv += ["--ro-bind", src, dst]
    # bwrap's own root and /dev are tmpfs without a size: read-only, or they could fill host RAM.
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    if status_fd is not None:
        argv += ["--json-status-fd", str(status_fd)]
    return argv + ["--"]


# ------------------------------------------------------------------------------ the backend
class LocalSandbox(SubprocessSandbox):
    """Runs programs as hardened local processes. See the module docstring for what is isolated.

    Args:
        limits: default ``Limits`` of a run (``run(limits=...)`` / ``session(limits=...)`` override).
        max_concurrency: programs running at once (a semaphore per event loop).
        bwrap: use bubblewrap namespaces: None = when it works here, True = required
            (ConfigError if it does not work), False = never.
        uid_base: when running as root, run programs as dedicated uids from a block at or above this
            (None: keep our uid, i.e. root: then pids is not enforced and host files are not protected).
        tmpfs: mount a ``disk_mb`` tmpfs as each work dir: None = when root, True/False to force.
        extra_env: more environment variables for the program.
    """

    name = "local"

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        max_concurrency: int = 16,
        bwrap: bool | None = None,
        uid_base: int | None = 1_600_000,
        tmpfs: bool | None = None,
        extra_env: dict[str, str] | None = None,
        max_output_bytes: int | None = None,
    ) -> None:
        super().__init__(
            limits=limits, max_concurrency=max_concurrency, max_output_bytes=max_output_bytes, extra_env=extra_env
        )
        root = os.geteuid() == 0
        top = 2**31 - 2 * jail.UID_BLOCKS * jail.UID_RANGE
        if uid_base is not None and not (isinstance(uid_base, int) and 1000 <= uid_base < top):
            raise ConfigError(f"uid_base must be an int in [1000, {top}) or None, got {uid_base!r}")
        self.uid_base = uid_base if root else None
        self.uid_block = jail.claim_uid_block(uid_base) if self.uid_base is not None else None
        probe_uid = self.uid_block + jail.UID_RANGE - 1 if self.uid_block is not None else None  # never handed out
        reason = bwrap_unavailable_reason(probe_uid) if bwrap is not False else "disabled (bwrap=False)"
        if bwrap and reason:
            raise ConfigError(f"bwrap=True but {reason}")
        self.bwrap = shutil.which("bwrap") if reason is None else None
        self.bwrap_reason = reason
        self.tmpfs = (root and _can_mount_tmpfs()) if tmpfs is None else bool(tmpfs)
        if self.tmpfs and not (root and _can_mount_tmpfs()):
            raise ConfigError("tmpfs=True needs root and a kernel that lets us mount tmpfs")
        # bwrap binds the Python prefix itself (from a host export if the uid cannot reach it); without
        # bwrap, as root, private mount/net/ipc/uts namespaces are the isolation we can still have.
        self.mounts = jail.ChildMounts(probe_uid, isolate=self.bwrap is None, export=self.bwrap is not None)
        self.prefixes = self.mounts.prefixes
        if root:
            _remove_stale_mounts()

    def describe(self) -> dict:
        """Which isolation layers are on (for logs, the CLI and the hostile-suite report)."""
        return {
            "backend": self.name,
            "bwrap": self.bwrap is not None,
            "bwrap_reason": self.bwrap_reason,
            "dedicated_uid": self.uid_base is not None,
            "pids_enforced": self.uid_base is not None,
            "tmpfs_workdir": self.tmpfs,
            "network_isolated": self.bwrap is not None or self.mounts.isolate,
            "private_tmp": self.bwrap is not None or self.mounts.isolate,
            "python_prefixes": list(self.prefixes),
        }

    def isolation_summary(self) -> str:
        d = self.describe()
        on = ["rlimits"]
        if d["dedicated_uid"]:
            on.append("a dedicated uid per run")
        if d["bwrap"] and d["dedicated_uid"]:
            on.append(
                "a read-only /usr view in its own pid, network and mount namespaces (python calls: built by "
                "the executor, warm; other programs: bubblewrap)"
            )
        elif d["bwrap"]:
            on.append("bubblewrap namespaces (user, pid, network, mount: read-only /usr view)")
        elif self.mounts.isolate:
            on.append("private pid, network and mount namespaces (host filesystem readable)")
        if d["tmpfs_workdir"]:
            on.append("a size-capped tmpfs work dir")
        more = []
        if not d["bwrap"]:
            more.append(f"bubblewrap would hide the host filesystem: {d['bwrap_reason']}")
        if not d["dedicated_uid"]:
            more.append("not root: programs run as you, with your files and network (run as root, or add bubblewrap)")
        if docker_unavailable_reason() is not None:
            more.append("Docker (apt-get install docker.io; agentrl sandbox build) is the strongest backend")
        return f"local ({', '.join(on)})" + (f"; for more isolation: {'; '.join(more)}" if more else "")

    # ------------------------------------------------------------------------------ hooks
    def _new_workdir(self, limits: Limits) -> Workdir:
        path = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")
        uid = jail.take_uid(self.uid_block) if self.uid_block is not None else None
        wd = Workdir(path, owner=(uid, uid) if uid is not None else None)
        try:
            if self.tmpfs:
                jail.mount_tmpfs(path, limits.disk_mb, uid if uid is not None else os.geteuid())
                wd.mounted = True
            elif uid is not None:
                os.chown(path, uid, uid)
        except BaseException:
            self._drop_workdir(wd)
            raise
        return wd

    def _drop_workdir(self, wd: Workdir) -> None:
        # No process of the uid is left here: every run ended in _kill (and bwrap's pid namespace).
        jail.remove_mountpoint(wd.path, contents=True)
        wd.mounted = False
        if wd.owner is not None:
            jail.give_uid(wd.owner[0])
            wd.owner = None

    def _spawn(self, argv: list[str], wd: Workdir, limits: Limits, timeout_s: float) -> Spawn:
        uid = wd.owner[0] if wd.owner is not None else None
        # bwrap's two processes (outer + namespace init) run under the same uid and count too.
        nproc = None if uid is None else limits.pids + (2 if self.bwrap else 0)
        rlimits = [[res, soft, hard] for res, (soft, hard) in jail.rlimits(limits, timeout_s, nproc)]
        python_bin = os.path.join(self.prefixes[0], "bin") if self.prefixes else None
        request = {"uid": uid, "rlimits": rlimits, "disk_mb": limits.disk_mb}
        if self.bwrap is None:  # namespaces of our own: the executor's child makes them
            env = {**base_env(wd.path, wd.path, python_bin), **self.extra_env}
            request.update(mounts=self.mounts.plan(), warm=_is_warm_python(argv, env))
            return Spawn(argv, env, wd.path, request)
        env = {**base_env("/work", "/tmp", python_bin), **self.extra_env}
        if uid is not None and _is_warm_python(argv, env):
            # As root the executor builds bwrap's view itself, so python3 - runs from its warm fork.
            request.update(mounts=self._root_view(), warm=True)
            return Spawn(argv, env, wd.path, request)
        r, w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(r, False)
        bwrap = _bwrap_argv(self.bwrap, wd.path, limits, _STATUS_FD, self.mounts.binds)
        return Spawn(bwrap + argv, env, wd.path, request, status_fd=r, status_w=w)

    def _root_view(self) -> dict:
        """The mount plan giving a warm run what bwrap gives the others (``_bwrap_argv``): its own
        pid, network, IPC, UTS and mount namespaces and a read-only root of ``/usr``, the
        ``/bin``-style links, a few ``/etc`` files and the Python prefix (``child.build_root``)."""
        ro = ["/usr"] + [t for t in _TOP_LINKS if os.path.isdir(t) and not os.path.islink(t)]
        links = {t: os.readlink(t) for t in _TOP_LINKS if os.path.islink(t)}
        view = {
            "ro": ro,
            "links": links,
            "files": [f for f in _ETC if os.path.exists(f)],
            "binds": [[dst, dst] for _, dst in self.mounts.binds],
        }  # as root we reach the prefix itself
        return {"isolate": True, "pidns": True, "grafts": [], "root": view}

    async def _start(self, spawn: Spawn, proto, with_stdin: bool):
        request = {**(spawn.request or {}), "argv": spawn.argv, "env": spawn.env, "cwd": spawn.cwd}
        try:
            return await executor().spawn(request, proto, stdin=with_stdin, status_fd=spawn.status_w)
        except SandboxError as e:
            raise SandboxError(f"cannot start {spawn.argv[0]!r}: {e}") from e

    def _kill(self, pid: int, wd: Workdir) -> None:
        # With bwrap or our own pid namespace this kills the namespace's init, and the kernel the rest.
        killpg(pid)
        if wd.owner is not None and self.bwrap is None and not self.mounts.isolate:
            jail.kill_uid(wd.owner[0])  # setsid orphans left the group but not the uid

    def _classify(
        self, status: str, code: int | None, stderr: str, spawn: Spawn, limits: Limits
    ) -> tuple[str, int | None, str]:
        if spawn.status_fd is not None and status == "ok":
            if not _bwrap_ran(spawn.status_fd) and stderr.startswith("bwrap: "):
                # The program never ran (no exit record), so all of stderr is bwrap's own.
                raise SandboxError(f"the local sandbox could not start the program: {stderr.strip()[:500]}")
            if code is not None and 128 < code <= 192:
                code = -(code - 128)  # bwrap reports death by signal N as exit 128 + N
        if status == "ok" and code is not None and code < 0:
            if -code == signal.SIGXCPU:
                return "timeout", None, "CPU-time limit (RLIMIT_CPU) reached"
            why = "file size limit (RLIMIT_FSIZE)" if -code == signal.SIGXFSZ else f"died by signal {-code}"
            return "killed", code, why
        if status == "ok" and code not in (0, None) and _died_of_memory_error(stderr):
            return "oom", code, f"MemoryError under the {limits.memory_mb} MB address-space limit"
        return status, code, ""


def _bwrap_ran(fd: int) -> bool:
    """bwrap's json status stream has an ``exit-code`` record only if the program was started."""
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    except BlockingIOError:
        pass
    for line in data.splitlines():
        try:
            if "exit-code" in json.loads(line):
                return True
        except (ValueError, TypeError):
            continue
    return False


def _died_of_memory_error(stderr: str) -> bool:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return bool(lines) and lines[-1].startswith("MemoryError")


def _remove_stale_mounts() -> None:
    """Unmount and remove work dirs and Python exports left by trainer processes that died (their
    pid is in the name)."""
    tmp = tempfile.gettempdir()
    for prefix, contents in ((WORKDIR_PREFIX, True), (jail.EXPORT_PREFIX, False)):
        for path in glob.glob(os.path.join(tmp, prefix + "*-*")):
            pid = os.path.basename(path)[len(prefix) :].split("-", 1)[0]
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                os.kill(int(pid), 0)
                continue  # alive (or a reused pid): not ours to touch
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            jail.remove_mountpoint(path, contents=contents)


def _is_warm_python(argv: list[str], env: dict[str, str]) -> bool:
    """``python3 -`` of this very interpreter: the executor can run it from its warm fork."""
    if len(argv) != 2 or argv[1] != "-":
        return False
    exe = shutil.which(argv[0], path=env.get("PATH"))
    return exe is not None and os.path.realpath(exe) == os.path.realpath(sys.executable)
