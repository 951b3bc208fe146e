"""What the local backend does to a child between fork and exec, and to a sandbox uid afterwards.

Owns: the rlimits of a run, the mount plan of a child (``ChildMounts``), the pool of dedicated
uids (a block per process, claimed with a lock file), killing every process of such a uid, and
mounting/unmounting size-capped tmpfs work dirs. The child (a jail of the executor,
``agentrl.sandbox.local.child``) applies the plan and drops to its uid, sets no-new-privs, the
parent-death signal and the rlimits, never in a fork of the trainer.

The child-side namespace work needs root and exists for two reasons:

* the trainer's Python may live where the sandbox uid cannot reach (pyenv under a 0700 ``/root``):
  a small tmpfs goes over the first unreachable ancestor (hiding the rest of it, e.g.
  ``/root/.ssh``) and the prefix is bound read-only at its own path, so rpaths keep working (a
  prefix under a scratch dir, a virtualenv in ``/tmp``, is bound back over the scratch tmpfs);
* without bwrap, it is the isolation we can still have as root: a private mount namespace with
  tmpfs ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (``disk_mb`` each; the work dir made inside, or
  the trainer's re-bound), empty network, IPC, UTS and cgroup namespaces (no network at all,
  loopback down) and a pid namespace of the run's own.

Does not: choose policy (``agentrl.sandbox.local`` does), or build bubblewrap's view
(``agentrl.sandbox.local.bwrap_view``).
"""

from __future__ import annotations

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

from agentrl.sandbox.base import Limits
from agentrl.sandbox.local.mounts import MB, mount_tmpfs, unmount

__all__ = ["mount_tmpfs", "unmount"]  # re-exported: the backend mounts work dirs with them


def rlimits(limits: Limits, timeout_s: float, nproc: int | None) -> list[tuple[int, tuple[int, int]]]:
    cpu = math.ceil(timeout_s) + 1
    out = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_FSIZE, (limits.fsize_mb * MB,) * 2),
        (resource.RLIMIT_NOFILE, (limits.nofile,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    if nproc is not None:
        out.append((resource.RLIMIT_NPROC, (nproc, nproc)))
    # RLIMIT_AS last: the child is still a copy of the executor until exec and must not need more first
    return out + [(resource.RLIMIT_AS, (limits.memory_mb * MB,) * 2)]


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
    sandbox; ``apply`` runs per child with that run's work dir. ``visible``: more host paths
    (absolute, real) the program may read, made visible like the Python prefix; ``loopback``:
    bring the private network namespace's loopback up (still no way out of it)."""

    def __init__(
        self, uid: int | None, *, isolate: bool, visible: tuple[str, ...] = (), loopback: bool = False
    ) -> None:
        self.prefixes: list[str] = []  # the trainer's interpreter prefixes visible to the program
        self.visible: list[str] = []  # the other host paths visible to the program
        self.binds: list[tuple[str, str]] = []  # (host path the uid can reach, path in the sandbox)
        self.grafts: list[tuple[str, str]] = []  # (first unreachable ancestor, prefix)
        self.isolate = isolate and uid is not None
        self.loopback = loopback
        pythons = [p for p in (os.path.realpath(x) for x in (sys.prefix, sys.base_prefix)) if _is_prefix(p)]
        for p in dict.fromkeys([*pythons, *visible]):
            if reachable(p, uid):
                self.binds.append((p, p))
            elif uid is None:
                continue  # not root: nothing we can do; PATH finds the system python
            else:
                self.grafts.append((_first_unreachable(p, uid), p))
            (self.prefixes if p in pythons else self.visible).append(p)

    @property
    def active(self) -> bool:
        return bool(self.grafts) or self.isolate

    def plan(self, workdir: str | None = None) -> dict | None:
        """What the jail applies (``agentrl.sandbox.local.mounts.isolate_host``), or None. ``workdir``:
        where the jail mounts a fresh work dir of its own (None: the trainer's is bound in)."""
        if not self.active:
            return None
        # isolate: a pid namespace too, with our own init (agentrl.sandbox.local.child)
        plan = {
            "isolate": self.isolate,
            "pidns": self.isolate,
            "grafts": [list(g) for g in self.grafts],
            # bound back if a scratch tmpfs hides one (a venv under /tmp)
            "prefixes": [*self.prefixes, *self.visible],
            **({"loopback": True} if self.loopback and self.isolate else {}),
        }
        return {**plan, "workdir": workdir} if workdir else plan

    @property
    def private_tmp(self) -> bool:
        """Whether each jail has a /tmp of its own (where it can make its work dir)."""
        return self.isolate and os.path.isdir("/tmp") and not os.path.islink("/tmp")


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
    ``contents``. Never deletes through a mount that is still there (it may be a view of a host
    directory)."""
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


def _is_prefix(path: str) -> bool:
    """A Python prefix the program needs made visible (not one under /usr, which every view shows)."""
    return not path.startswith("/usr/") and os.path.isdir(os.path.join(path, "bin"))


def _first_unreachable(path: str, uid: int) -> str:
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        cur = "/" + "/".join(parts[:i])
        if not reachable(cur, uid):
            return cur
    return path


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
