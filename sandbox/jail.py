"""What the local backend does to a child between fork and exec, and to a sandbox uid afterwards.

Owns: the rlimits of a run, the ``preexec`` function (rlimits, mount/network namespaces, dropping
to a dedicated uid, no-new-privs, parent-death signal), the pool of dedicated uids (a block per
process, claimed with a lock file), killing every process of such a uid, mounting/unmounting
size-capped tmpfs work dirs, and exporting an unreachable Python prefix for bwrap.

The child-side namespace work (``ChildMounts``) needs root and exists for two reasons:

* the trainer's Python may live where the sandbox uid cannot reach (pyenv under a 0700 ``/root``):
  a small tmpfs goes over the first unreachable ancestor (hiding the rest of it, e.g.
  ``/root/.ssh``) and the prefix is bound read-only at its own path, so rpaths keep working;
* without bwrap, it is the isolation we can still have as root: a private mount namespace with
  tmpfs ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (``disk_mb`` each, the work dir re-bound inside),
  and empty network, IPC and UTS namespaces (no network at all, loopback down).

Does not: choose policy (``agentrl.sandbox.local`` does), or isolate processes (no pid namespace
here: that is bwrap's job; without it, ``kill_uid`` after the run catches escaped processes).
"""
from __future__ import annotations

import atexit
import ctypes
import fcntl
import math
import os
import resource
import shutil
import signal
import stat
import sys
import tempfile
import threading

from agentrl.sandbox import Limits

MB = 1 << 20
_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC, _CLONE_NEWNET = 0x00020000, 0x04000000, 0x08000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
INODES_PER_MB = 64  # tmpfs: 8 k inodes for 128 MB stops an inode flood and fits real programs
_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount_tmpfs(path: str, size_mb: int, uid: int, mode: str = "0700") -> None:
    opts = f"size={size_mb}m,nr_inodes={max(256, size_mb * INODES_PER_MB)},mode={mode},uid={uid},gid={uid}"
    _check(_LIBC.mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts.encode()), f"tmpfs on {path}")


def unmount(path: str) -> None:
    _LIBC.umount2(path.encode(), _MNT_DETACH)


def rlimits(limits: Limits, timeout_s: float, nproc: int | None) -> list[tuple[int, tuple[int, int]]]:
    cpu = math.ceil(timeout_s) + 1
    out = [(resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_FSIZE, (limits.fsize_mb * MB,) * 2),
           (resource.RLIMIT_NOFILE, (limits.nofile,) * 2), (resource.RLIMIT_CORE, (0, 0))]
    if nproc is not None:
        out.append((resource.RLIMIT_NPROC, (nproc, nproc)))
    return out + [(resource.RLIMIT_AS, (limits.memory_mb * MB,) * 2)]  # last: see preexec


def reachable(path: str, uid: int | None) -> bool:
    """Whether ``uid`` (None: ourselves) can traverse every directory down to ``path``."""
    if uid is None:
        return os.access(path, os.R_OK | os.X_OK)
    cur = os.path.realpath(path)
    while True:
        try:
            st = os.stat(cur)
        except OSError:
            return False
        bits = stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == uid else stat.S_IXOTH
        if not st.st_mode & bits:
            return False
        if cur == "/":
            return True
        cur = os.path.dirname(cur)


class ChildMounts:
    """The mount/network plan applied in the child (see the module docstring). Built once per
    sandbox; ``apply`` runs per child with that run's work dir."""

    def __init__(self, uid: int | None, *, isolate: bool, export: bool = False) -> None:
        self.prefixes: list[str] = []  # the trainer's interpreter prefixes visible to the program
        self.binds: list[tuple[str, str]] = []  # (host path the uid can reach, path in the sandbox)
        self.grafts: list[tuple[str, str]] = []  # (first unreachable ancestor, prefix)
        self.isolate = isolate and uid is not None
        for p in dict.fromkeys(os.path.realpath(x) for x in (sys.prefix, sys.base_prefix)):
            if p.startswith("/usr/") or not os.path.isdir(os.path.join(p, "bin")):
                continue
            if reachable(p, uid):
                self.binds.append((p, p))
            elif uid is None:
                continue  # not root: nothing we can do; PATH finds the system python
            elif export:
                self.binds.append((exported_prefix(p), p))
            else:
                self.grafts.append((_first_unreachable(p, uid), p))
            self.prefixes.append(p)

    @property
    def active(self) -> bool:
        return bool(self.grafts) or self.isolate

    def apply(self, workdir: str, disk_mb: int) -> None:
        """In the forked child, as root, before dropping privileges (raises OSError on failure)."""
        flags = _CLONE_NEWNS | (_CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS if self.isolate else 0)
        _check(_LIBC.unshare(flags), "unshare")
        # Private first: a new mount must never propagate back to the host's namespace.
        _check(_LIBC.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
        scratch = [d for d in _SCRATCH if self.isolate and os.path.isdir(d) and not os.path.islink(d)]
        # Open what the new tmpfs mounts will hide, in this namespace (bind sources must be ours).
        binds = [(p, p, True) for _, p in self.grafts]
        if any(workdir.startswith(d + "/") for d in scratch):
            binds.append((workdir, workdir, False))
        fds = [os.open(src, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for src, _, _ in binds]
        for d in scratch:
            mount_tmpfs(d, disk_mb, 0, mode="1777")
        for anchor in dict.fromkeys(a for a, _ in self.grafts):
            _check(_LIBC.mount(b"tmpfs", anchor.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=1m,mode=0755"),
                   f"tmpfs over {anchor}")
        for (_, dst, ro), fd in zip(binds, fds):
            os.makedirs(dst, exist_ok=True)
            _check(_LIBC.mount(f"/proc/self/fd/{fd}".encode(), dst.encode(), None, _MS_BIND | _MS_REC, None),
                   f"bind {dst}")
            if ro:
                _check(_LIBC.mount(None, dst.encode(), None,
                                   _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None), f"ro {dst}")
            os.close(fd)  # CLOEXEC anyway: a directory fd must never reach the program
        os.chdir(workdir)  # the cwd set before us now lies under the new /tmp: take the re-bound one


EXPORT_PREFIX = "agentrl-python-"
_EXPORTS: dict[str, str] = {}
_EXPORT_LOCK = threading.Lock()


def exported_prefix(prefix: str) -> str:
    """A host path the sandbox uid can reach that shows ``prefix`` read-only: a bind mount in a
    0755 temp dir, made once per process and removed at exit (or, after a crash, by the next
    LocalSandbox). For bwrap, which binds it back at ``prefix`` inside the sandbox: cheaper than
    a mount namespace per run. Needs root."""
    with _EXPORT_LOCK:
        if prefix not in _EXPORTS:
            path = tempfile.mkdtemp(prefix=f"{EXPORT_PREFIX}{os.getpid()}-")
            os.chmod(path, 0o755)
            try:
                _check(_LIBC.mount(prefix.encode(), path.encode(), None, _MS_BIND | _MS_REC, None), f"bind {prefix}")
                _LIBC.mount(None, path.encode(), None, _MS_REC | _MS_PRIVATE, None)  # no propagation to peers
                _check(_LIBC.mount(None, path.encode(), None,
                                   _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None), f"ro {path}")
            except OSError:
                unmount(path)
                os.rmdir(path)
                raise
            _EXPORTS[prefix] = path
            if len(_EXPORTS) == 1:
                atexit.register(_unexport_all)
        return _EXPORTS[prefix]


def _unexport_all() -> None:
    with _EXPORT_LOCK:
        for path in _EXPORTS.values():
            remove_mountpoint(path)
        _EXPORTS.clear()


def is_mountpoint(path: str) -> bool:
    """Whether something is mounted on ``path`` (by /proc/self/mountinfo: ``os.path.ismount`` misses
    a bind mount from the same filesystem, and an export is exactly that)."""
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            # field 5 is the mount point, with space, tab, newline, backslash as octal escapes
            if line.split()[4].decode("unicode_escape", "replace") == real:
                return True
    return False


def remove_mountpoint(path: str, *, contents: bool = False) -> None:
    """Unmount everything on ``path`` and remove the directory, with what is under it only if
    ``contents``. Never deletes through a mount that is still there: an export is a view of the
    real Python installation."""
    for _ in range(8):  # mounts may be stacked
        if not is_mountpoint(path):
            break
        unmount(path)
    else:
        return
    if contents:
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.rmdir(path)
        except OSError:
            pass


def _first_unreachable(path: str, uid: int) -> str:
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        cur = "/" + "/".join(parts[:i])
        if not reachable(cur, uid):
            return cur
    return path


def preexec(limits: list[tuple[int, tuple[int, int]]], uid: int | None, *, mounts: ChildMounts | None = None,
            workdir: str = "", disk_mb: int = 0, pdeathsig: bool = True):
    """The child's setup between fork and exec. Plain syscalls only (no locks, no logging): the
    trainer is multi-threaded and only this thread exists in the child. The rlimits come last:
    the child is still a copy of the trainer, whose address space is far over ``memory_mb``, so
    after RLIMIT_AS it must not need another byte before exec."""
    def fn() -> None:
        if mounts is not None and mounts.active:
            mounts.apply(workdir, disk_mb)
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            _check(_LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")  # setuid binaries stay inert
        if pdeathsig:  # after setuid: a credential change clears it
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for res, lim in limits:
            setrlimit(res, lim)
    setrlimit = resource.setrlimit
    return fn


_PRLIMIT_NAMES = {resource.RLIMIT_AS: "as", resource.RLIMIT_CPU: "cpu", resource.RLIMIT_FSIZE: "fsize",
                  resource.RLIMIT_NOFILE: "nofile", resource.RLIMIT_CORE: "core", resource.RLIMIT_NPROC: "nproc"}
_SETPRIV, _PRLIMIT = shutil.which("setpriv"), shutil.which("prlimit")


def launcher(limits: list[tuple[int, tuple[int, int]]], uid: int | None) -> list[str] | None:
    """The same as ``preexec`` without mounts, as a command prefix (util-linux ``setpriv`` and
    ``prlimit``), or None when those are missing. Two small execs cost ~2 ms; a ``preexec_fn``
    forces a full fork() of the trainer instead of vfork(), ~10 ms here and far more for a
    trainer with gigabytes mapped."""
    if _SETPRIV is None or _PRLIMIT is None:
        return None
    ids = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"] if uid is not None else []
    rl = [f"--{_PRLIMIT_NAMES[res]}={soft}:{hard}" for res, (soft, hard) in limits]
    return [_SETPRIV, *ids, "--pdeathsig=KILL", "--", _PRLIMIT, *rl, "--"]


# ------------------------------------------------------------------------------ dedicated uids
UID_RANGE = 1 << 16  # uids in one block; the last one is never handed out (probes use it)
UID_BLOCKS = 64
_UIDS_IN_USE: set[int] = set()
_UID_LOCK = threading.Lock()
_NEXT_UID: dict[int, int] = {}
_BLOCKS: dict[int, tuple[int, int]] = {}  # base -> (block start, fd holding its lock)


def claim_uid_block(base: int) -> int:
    """The start of a block of ``UID_RANGE`` uids from ``base`` that no other live process uses:
    a non-blocking ``flock`` on a lock file per block, held until this process exits (the kernel
    drops it even after SIGKILL). Two trainers on one host thus never share a sandbox uid (which
    would let one's ``kill -9 -1`` or uid sweep reach the other's programs)."""
    with _UID_LOCK:
        if base in _BLOCKS:
            return _BLOCKS[base][0]
        for n in range(UID_BLOCKS):
            start = base + n * UID_RANGE
            path = os.path.join(tempfile.gettempdir(), f"agentrl-uids-{start}.lock")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            _BLOCKS[base] = (start, fd)
            return start
        raise OSError(f"all {UID_BLOCKS} sandbox uid blocks from {base} are held by other processes")


def claimed_uid_ranges() -> list[range]:
    """The uid blocks this process holds (for tests and host checks)."""
    with _UID_LOCK:
        return [range(start, start + UID_RANGE) for start, _ in _BLOCKS.values()]


def take_uid(block: int) -> int:
    """A free uid of the block starting at ``block`` (one per concurrent run or session), handed
    out round-robin: killed processes of a uid may linger as zombies until their new parent
    (pid 1) reaps them, and they still count against RLIMIT_NPROC of that uid."""
    with _UID_LOCK:
        if sum(1 for u in _UIDS_IN_USE if block <= u < block + UID_RANGE) >= UID_RANGE - 1:
            raise OSError(f"all sandbox uids of the block at {block} are in use")
        off = _NEXT_UID.get(block, 0)
        while block + off in _UIDS_IN_USE:
            off = (off + 1) % (UID_RANGE - 1)
        _NEXT_UID[block] = (off + 1) % (UID_RANGE - 1)
        _UIDS_IN_USE.add(block + off)
        return block + off


def give_uid(uid: int) -> None:
    with _UID_LOCK:
        _UIDS_IN_USE.discard(uid)


def kill_uid(uid: int) -> int:
    """SIGKILL every process whose real, effective or saved uid is ``uid``, until none is left
    (they may be forking). Returns how many kills were sent. For dedicated sandbox uids only."""
    sent, key = 0, str(uid).encode()
    for _ in range(200):
        found = 0
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/status", "rb") as f:
                    status = f.read()
            except OSError:
                continue
            fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
            if fields.get(b"State", b"").strip().startswith((b"Z", b"X")):
                continue  # already dead, waiting to be reaped
            if key in fields.get(b"Uid", b"").split()[:3]:
                try:
                    os.kill(int(name), signal.SIGKILL)
                    found += 1
                except ProcessLookupError:
                    pass
        sent += found
        if not found:
            break
    return sent
