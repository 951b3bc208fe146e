"""The mounts and namespaces of a local sandbox child, and the libc primitives they are made of.

Owns: the libc mount primitives (also used by the trainer's side, ``agentrl.sandbox.local.jail``), entering
a child's private namespaces (mount; network, IPC, UTS and cgroup when isolated), and the two views
a child can get: the host's filesystem with private scratch dirs and a grafted Python prefix
(``isolate_host``), or a read-only root showing only what bubblewrap's view shows (``build_root``
then ``enter_root``). Either way the work dir is a size-capped tmpfs made here (one-shot runs) or
the trainer's work dir bound in (runs whose files the trainer writes or collects). Imports only the
standard library: the executor loads it without agentrl on its path (``agentrl.sandbox.local.executor``).

Does not: fork, drop privileges or decide any policy (the plan in the request says what to apply).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

MB = 1 << 20
_LIBC = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_MOVE, _MS_REC, _MS_PRIVATE = 4096, 8192, 16384, 1 << 18
_MNT_DETACH = 2
INODES_PER_MB = 64  # tmpfs: 8 k inodes for 128 MB stops an inode flood and fits real programs
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
NEW_ROOT = "/tmp"  # where build_root assembles the view: in our private namespace nothing of the host sees it


# ------------------------------------------------------------------------------ libc primitives
def check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int, what: str = "unshare") -> None:
    check(_LIBC.unshare(flags), what)


def mount_tmpfs(path: str, size_mb: int, uid: int, mode: str = "0700") -> None:
    opts = f"size={size_mb}m,nr_inodes={max(256, size_mb * INODES_PER_MB)},mode={mode},uid={uid},gid={uid}"
    check(_LIBC.mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts.encode()), f"tmpfs on {path}")


def mount_small_tmpfs(path: str, size: str, flags: int = _MS_NOSUID | _MS_NODEV) -> None:
    check(_LIBC.mount(b"tmpfs", path.encode(), b"tmpfs", flags, f"size={size},mode=0755".encode()), f"tmpfs {path}")


def mount_proc(path: str) -> None:
    check(_LIBC.mount(b"proc", path.encode(), b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None), f"proc on {path}")


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


_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def loopback_up() -> None:
    """Bring this network namespace's loopback interface up (a new namespace starts with it
    down): programs may then listen on and connect to 127.0.0.1 inside it, and reach nothing
    else. Needs CAP_NET_ADMIN in the namespace (root in it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH22x", b"lo", 0)  # struct ifreq: name, flags, padding to 40 bytes
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


# ------------------------------------------------------------------------------ namespaces
def enter_namespaces(plan: dict) -> None:
    """A private mount namespace (whose mounts never propagate back), and when ``plan["isolate"]``
    empty network (loopback down, or up with ``plan["loopback"]``: still nothing outside), IPC,
    UTS and cgroup ones. Needs root."""
    isolate = plan["isolate"]
    flags = CLONE_NEWNS | (CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP if isolate else 0)
    unshare(flags)
    make_private("/")  # first: a new mount must never propagate back to the host's namespace
    if isolate and plan.get("loopback"):
        loopback_up()
    if isolate and plan.get("root"):
        socket.sethostname("sandbox")


def _workdir(dst: str, src_fd: int | None, disk_mb: int) -> None:
    """The run's work dir at ``dst``: the trainer's work dir (``src_fd``, an ``O_PATH`` fd opened
    before any mount here could hide it) bound read-write, or else a fresh tmpfs of ``disk_mb``
    (owned by root until the run's uid takes it: ``take_workdir``)."""
    os.makedirs(dst, exist_ok=True)
    if src_fd is not None:
        bind(f"/proc/self/fd/{src_fd}", dst, readonly=False)
    else:
        mount_tmpfs(dst, disk_mb, 0)


def take_workdir(path: str, uid: int | None) -> None:
    """Give a work dir made by ``_workdir`` to the run's uid."""
    if uid is not None:
        os.chown(path, uid, uid)


def isolate_host(plan: dict, workdir: str | None, disk_mb: int) -> None:
    """The host's filesystem with tmpfs scratch dirs (``/tmp``, ``/var/tmp``, ``/dev/shm`` of
    ``disk_mb`` each, when ``plan["isolate"]``), the trainer's Python prefix grafted read-only at
    its own path under a tmpfs over its first unreachable ancestor (``plan["grafts"]``: [anchor,
    prefix] pairs; see ``agentrl.sandbox.local.jail.ChildMounts``) or, when it lies under a scratch dir
    (a virtualenv in ``/tmp``), bound read-only back over the scratch tmpfs that hid it
    (``plan["prefixes"]``), and the work dir: a new tmpfs at ``plan["workdir"]``, or the trainer's
    ``workdir`` bound back where a scratch dir hid it."""
    grafts = [tuple(g) for g in plan["grafts"]]
    scratch = [d for d in SCRATCH if plan["isolate"] and os.path.isdir(d) and not os.path.islink(d)]

    def hidden(path: str) -> bool:
        return any(path.startswith(d + "/") for d in scratch)

    prefixes = [p for _, p in grafts] + [p for p in plan.get("prefixes", ()) if hidden(p)]
    binds = [(p, True) for p in dict.fromkeys(prefixes)]
    if workdir is not None and hidden(workdir):
        binds.append((workdir, False))
    # Open what the new tmpfs mounts will hide, in this namespace (bind sources must be ours).
    fds = [os.open(src, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for src, _ in binds]
    for d in scratch:
        mount_tmpfs(d, disk_mb, 0, mode="1777")
    for anchor in dict.fromkeys(a for a, p in grafts if not hidden(p)):  # under scratch: its tmpfs hides the rest
        mount_small_tmpfs(anchor, "1m")
    for (dst, ro), fd in zip(binds, fds):
        os.makedirs(dst, exist_ok=True)
        bind(f"/proc/self/fd/{fd}", dst, readonly=ro)
        os.close(fd)
    if plan.get("workdir"):
        _workdir(plan["workdir"], None, disk_mb)


def build_root(view: dict, workdir: str | None, disk_mb: int) -> None:
    """Assemble at ``NEW_ROOT`` what bubblewrap's root shows: a read-only tmpfs root with
    ``view["ro"]`` directories and ``view["files"]`` bound read-only at their paths,
    ``view["links"]`` ({path: target}) as symlinks, ``view["binds"]`` ([src, dst]: the Python
    prefix) read-only, a minimal read-only ``/dev``, a ``/proc`` mount point (the pid namespace's
    init mounts it), tmpfs ``/tmp`` and ``/dev/shm`` of ``disk_mb``, and the work dir at ``/work``
    (the trainer's ``workdir`` bound, or a new tmpfs), then ``view["visible"]`` ([src, dst], optional:
    more host paths a program may read) read-only, after the work dir so that a path under ``/work``
    stays visible. ``enter_root`` then makes it this process's ``/``. Needs root in a private mount
    namespace."""
    new = NEW_ROOT
    visible = view.get("visible", [])
    sources = [*([workdir] if workdir else []), *view["ro"], *view["files"], *(src for src, _ in view["binds"])]
    sources += [src for src, _ in visible]
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

    mount_small_tmpfs(new, "1m")
    for d in view["ro"]:
        if d in fds:
            bind_fd(d, at(d), True)
    for link, target in view["links"].items():
        os.symlink(target, new + link)
    for f in view["files"]:
        if f in fds:
            bind_fd(f, at(f, directory=os.path.isdir(f"/proc/self/fd/{fds[f]}")), True)
    dev = at("/dev")
    mount_small_tmpfs(dev, "64k", _MS_NOSUID)
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
    for src, dst in view["binds"]:  # after the scratch tmpfs, which would hide a prefix under /tmp (a venv there)
        bind_fd(src, at(dst), True)
    at("/proc")
    _workdir(at("/work"), fds[workdir] if workdir else None, disk_mb)
    for src, dst in visible:
        if src in fds:
            bind_fd(src, at(dst, directory=os.path.isdir(f"/proc/self/fd/{fds[src]}")), True)
    for fd in fds.values():
        os.close(fd)
    remount_readonly(dev)


def enter_root() -> None:
    """Make the root ``build_root`` assembled read-only and this process's ``/`` (a mount moved
    over ``/``, then ``chroot``: the program, unprivileged and with no-new-privs, cannot chroot
    back); the cwd becomes ``/work``."""
    remount_readonly(NEW_ROOT)
    os.chdir(NEW_ROOT)
    check(_LIBC.mount(b".", b"/", None, _MS_MOVE, None), "move the new root to /")
    check(_LIBC.chroot(b"."), "chroot")
    os.chdir("/work")


def forbid_user_namespaces() -> None:
    """In a user namespace of our own (made with ``unshare(CLONE_NEWUSER)``, its maps written from
    outside: ``map_all_ids``): let nothing in it create another one, as bubblewrap's
    ``--disable-userns`` does (a nested user namespace would give the program capabilities over
    mounts of its own, a large kernel surface)."""
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")


def map_all_ids(pid: int) -> None:
    """Map every uid and gid of ``pid``'s user namespace to itself (from its parent namespace, as
    root): inside, the run keeps its host uid; nothing gains a capability outside."""
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write("0 0 4294967295")
