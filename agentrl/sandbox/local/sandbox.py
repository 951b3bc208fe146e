"""The hardened local backend: a child process under rlimits, inside bubblewrap namespaces when available.

Owns: ``LocalSandbox`` (the default backend where Docker is absent): which isolation it uses
here, the request each run sends the executor, and how its results are classified. The process
mechanics (deadline, group kill, output caps, work dir, sessions, file copy) are shared with the
plain runner in ``agentrl.sandbox.subprocess_runner``; bubblewrap's command line, probe and view
are in ``agentrl.sandbox.local.bwrap_view``; the plan of what happens in the child before the program
is in ``agentrl.sandbox.local.jail``, and the child (a jail) is forked and set up by the executor
(``agentrl.sandbox.local.executor``: a small single-threaded process, never a fork of the trainer,
which prepares jails ahead of requests; for ``python3 -`` of the trainer's own interpreter it
runs the program in a fork of its warm interpreter instead of exec'ing a new one).

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
   run's own pid namespace does that). The work dir is a tmpfs of ``disk_mb`` (inodes capped)
   mounted for the run (inside the run's own mount namespace for a one-shot run whose files the
   trainer neither writes nor collects): filling the disk or the inodes fills only that. A Python
   prefix the uid cannot reach (pyenv under a 0700 ``/root``) is made visible read-only at its own
   path, and so is one a private ``/tmp`` below would hide (a virtualenv under ``/tmp``). Stale
   mounts of a crashed trainer go at the next LocalSandbox.
3. As root without bwrap: private mount, network, IPC, UTS, cgroup and pid namespaces made in the child:
   no network at all (loopback down), tmpfs ``/tmp``, ``/var/tmp``, ``/dev/shm`` of ``disk_mb``,
   an init of ours as pid 1 and a ``/proc`` that shows only the run (when the run ends its init
   exits and the kernel kills everything left in the namespace).
4. When ``bwrap`` works (probed once): user, pid, network, ipc, uts and cgroup namespaces, no
   further user namespaces, all capabilities dropped, a new terminal session; the filesystem is a
   read-only root showing only ``/usr`` (+ the ``/bin``-style links, a few ``/etc`` files, the
   trainer's Python prefix), a private ``/proc``, a minimal read-only ``/dev``, tmpfs ``/tmp``
   and ``/dev/shm`` of ``disk_mb`` each, and the work dir read-write at ``/work``. When the run
   ends the namespace's init dies and the kernel kills everything left in the namespace.
   As root (with a dedicated uid) every run gets the same view without bwrap's own process: the
   executor's jail builds it (``agentrl.sandbox.local.mounts.build_root``: private pid, network,
   IPC, UTS, cgroup and mount namespaces, the read-only root, ``chroot``, then a user namespace
   of its own, every id mapped to itself, in which no further one can be made, as bwrap's
   ``--disable-userns``), then drops to its dedicated uid with no-new-privs. The one difference
   from bwrap: the program sees its host uid (not 1000).

For a caller that gives a program one way out (sandboxed agent programs, ``agentrl.agents.sandboxed``):
``run(pass_fd=...)`` passes one descriptor of the caller's (its number in ``$AGENTRL_PASS_FD``),
``loopback=True`` brings the loopback of the program's own network namespace up (127.0.0.1 inside
it, nothing outside), and ``visible`` shows more host paths read-only at their own paths.

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
limit (SIGXCPU) is ``timeout``. Under the bwrap program an exit code 129..192 is reported as death
by signal (bwrap folds the two together). A program that could not be started (``python3`` missing
from the sandbox, say) raises SandboxError.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence

from agentrl.errors import ConfigError, SandboxError
from agentrl.sandbox.base import Limits
from agentrl.sandbox.local import jail
from agentrl.sandbox.local.bwrap_view import STATUS_FD, bwrap_argv, bwrap_ran, bwrap_unavailable_reason, root_view_plan
from agentrl.sandbox.local.client import executor
from agentrl.sandbox.local.wire import jail_kind
from agentrl.sandbox.probe import docker_unavailable_reason
from agentrl.sandbox.subprocess_runner import WORKDIR_PREFIX, Spawn, SubprocessSandbox, Workdir, base_env

__all__ = ["LocalSandbox", "bwrap_unavailable_reason"]
_PROBES: dict[str, bool] = {}
_PROBE_LOCK = threading.Lock()
_JAIL_WORKDIR = f"/tmp/{WORKDIR_PREFIX}work"  # a one-shot run's own work dir, in its private /tmp
_OLD_EXPORT_PREFIX = "agentrl-python-"  # read-only binds of the Python prefix made by earlier versions


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
    return _PROBES["tmpfs"]


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
        visible: more host paths (absolute) every program may read: shown read-only at their own
            paths (bubblewrap's view and the root view show nothing else of the host; without them
            the host's files are readable anyway, and these are bound back where a private /tmp
            hides them).
        loopback: bring up the loopback interface of the program's own network namespace (it may
            then listen on and connect to 127.0.0.1 there: still nothing outside the sandbox).
            bubblewrap's namespace has it up anyway.
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
        visible: Sequence[str] = (),
        loopback: bool = False,
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
        # Without bwrap, as root, private mount/net/ipc/uts/pid namespaces are the isolation we can still
        # have; with it, as root, the executor builds bwrap's view itself (root_view_plan).
        for path in visible:
            if not os.path.isabs(path) or not os.path.exists(path):
                raise ConfigError(f"visible paths must be absolute paths that exist, got {path!r}")
        visible = tuple(os.path.realpath(p) for p in visible)
        self.mounts = jail.ChildMounts(probe_uid, isolate=self.bwrap is None, visible=visible, loopback=loopback)
        self.prefixes = self.mounts.prefixes
        self.visible, self.loopback = list(visible), loopback
        root_view = self.bwrap and self.uid_base is not None
        self.root_view = root_view_plan(self.prefixes, self.mounts.visible, loopback) if root_view else None
        # Where a one-shot run's jail makes its own work dir (None: the trainer makes one on the host).
        self.jail_workdir = "/work" if self.root_view else _JAIL_WORKDIR if self.mounts.private_tmp else None
        self._jails: dict[tuple[int, str | None], dict] = {}
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
            "visible": list(self.visible),
            "loopback": self.loopback and (self.bwrap is not None or self.mounts.isolate),
        }

    def isolation_summary(self) -> str:
        d = self.describe()
        on = ["rlimits"]
        if d["dedicated_uid"]:
            on.append("a dedicated uid per run")
        if self.root_view:
            on.append("a read-only /usr view in its own pid, network and mount namespaces (bubblewrap's view)")
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
    def _new_workdir(self, limits: Limits, one_shot: bool = False) -> Workdir:
        uid = jail.take_uid(self.uid_block) if self.uid_block is not None else None
        owner = (uid, uid) if uid is not None else None
        if one_shot and self.jail_workdir:  # the run's jail makes it in its own mount namespace
            return Workdir(self.jail_workdir, owner=owner, private=True)
        path = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")
        wd = Workdir(path, owner=owner)
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
        # No process of the uid is left here: every run ended in _kill (and its pid namespace).
        if wd.mounted:  # (only we mount on a host work dir: a program's mounts stay in its namespace)
            jail.remove_mountpoint(wd.path, contents=True)
        elif wd.private:
            pass  # a jail's own work dir went with its mount namespace
        elif wd.owner is not None or not executor().discard(wd.path):  # (no dedicated uid: off the run's path)
            try:
                os.rmdir(wd.path)  # the common case: left empty
            except OSError:
                shutil.rmtree(wd.path, ignore_errors=True)
        wd.mounted = False
        if wd.owner is not None:
            jail.give_uid(wd.owner[0])
            wd.owner = None

    def _spawn(self, argv: list[str], wd: Workdir, limits: Limits, timeout_s: float) -> Spawn:
        uid = wd.owner[0] if wd.owner is not None else None
        # bwrap's two processes (outer + namespace init; the executor's view: init) run under the uid and count too.
        nproc = None if uid is None else limits.pids + (2 if self.bwrap else 0)
        rlimits = [[res, soft, hard] for res, (soft, hard) in jail.rlimits(limits, timeout_s, nproc)]
        python_bin = os.path.join(self.prefixes[0], "bin") if self.prefixes else None
        request: dict = {"uid": uid, "rlimits": rlimits}
        own = self.jail_workdir if wd.private else None
        if self.bwrap is None or self.root_view:  # the executor's jail makes the namespaces
            home = "/work" if self.root_view else wd.path
            env = {**base_env(home, "/tmp" if self.root_view else home, python_bin), **self.extra_env}
            request.update(self._jail(limits.disk_mb, own), workdir=None if own else wd.path)
            request["warm"] = _is_warm_python(argv, env)
            return Spawn(argv, env, home, request)
        env = {**base_env("/work", "/tmp", python_bin), **self.extra_env}
        r, w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(r, False)
        request.update(self._jail(limits.disk_mb, None))
        bwrap = bwrap_argv(self.bwrap, wd.path, limits, STATUS_FD, self.mounts.binds)
        return Spawn(bwrap + argv, env, wd.path, request, status_fd=r, status_w=w)

    def _jail(self, disk_mb: int, own: str | None) -> dict:
        """The request's jail plan and its kind (the same for every run of these limits: cached)."""
        key = (disk_mb, own)
        if key not in self._jails:
            if self.bwrap is not None and not self.root_view:  # the bwrap program makes the namespaces
                plan: dict = {"disk_mb": disk_mb}
            else:
                mounts = {**self.root_view, "workdir": own} if self.root_view else self.mounts.plan(workdir=own)
                plan = {"mounts": mounts, "disk_mb": disk_mb}
            self._jails[key] = {"jail": plan, "kind": jail_kind(plan)}
        return self._jails[key]

    async def _start(self, spawn: Spawn, proto, with_stdin: bool):
        request = {**(spawn.request or {}), "argv": spawn.argv, "env": spawn.env, "cwd": spawn.cwd}
        try:
            return await executor().spawn(
                request, proto, stdin=with_stdin, status_fd=spawn.status_w, pass_fd=spawn.pass_fd
            )
        except SandboxError as e:
            raise SandboxError(f"cannot start {spawn.argv[0]!r}: {e}") from e

    def _pass_fd_at(self, spawn: Spawn) -> int:
        return 4 if spawn.status_w is not None else 3  # after bwrap's status pipe, if any (Executor.spawn)

    def _kill(self, transport, wd: Workdir) -> None:
        # With a pid namespace (bwrap's or our own) this kills the namespace's init, and the kernel the rest.
        transport.kill()
        if wd.owner is not None and self.bwrap is None and not self.mounts.isolate:
            jail.kill_uid(wd.owner[0])  # setsid orphans left the group but not the uid

    def _classify(
        self, status: str, code: int | None, stderr: str, spawn: Spawn, limits: Limits
    ) -> tuple[str, int | None, str]:
        if spawn.status_fd is not None and status == "ok":
            if not bwrap_ran(spawn.status_fd) and stderr.startswith("bwrap: "):
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


def _died_of_memory_error(stderr: str) -> bool:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return bool(lines) and lines[-1].startswith("MemoryError")


def _remove_stale_mounts() -> None:
    """Unmount and remove work dirs and Python exports left by trainer processes that died (their
    pid is in the name)."""
    tmp = tempfile.gettempdir()
    for prefix, contents in ((WORKDIR_PREFIX, True), (_OLD_EXPORT_PREFIX, False)):
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
    return len(argv) == 2 and argv[1] == "-" and _is_us(argv[0], env.get("PATH"))


@functools.lru_cache(maxsize=64)
def _is_us(name: str, path: str | None) -> bool:
    exe = shutil.which(name, path=path)
    return exe is not None and os.path.realpath(exe) == os.path.realpath(sys.executable)
