"""The bubblewrap view of the local backend: bwrap's command line, its probe, and the same view as a jail plan.

Owns: whether bubblewrap works here (``bwrap_unavailable_reason``, probed once per uid through the
executor), the bwrap command line of a run (``bwrap_argv``: user, pid, network, IPC, UTS and cgroup
namespaces, no further user namespaces, all capabilities dropped, a read-only root showing only
``/usr``, the ``/bin``-style links, a few ``/etc`` files and the trainer's Python prefix, a private
``/proc``, a minimal ``/dev``, tmpfs ``/tmp`` and ``/dev/shm``, the work dir at ``/work``), reading
bwrap's status record (``bwrap_ran``), and ``root_view_plan``: the same view for the executor to
build itself (``agentrl.sandbox.local.mounts.build_root``), as root, without bwrap's own process.

Does not: run programs or choose when to use which (``agentrl.sandbox.local`` does).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence

from agentrl.errors import SandboxError
from agentrl.sandbox.base import Limits
from agentrl.sandbox.local.client import executor
from agentrl.sandbox.subprocess_runner import MB, WORKDIR_PREFIX

SANDBOX_UID = 1000  # the uid the program sees inside bwrap (whatever the host uid is)
STATUS_FD = 3  # where the executor puts bwrap's status pipe in the child
ETC = [
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
TOP_LINKS = ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]

_PROBES: dict[str, str | None] = {}
_PROBE_LOCK = threading.Lock()


def bwrap_unavailable_reason(uid: int | None = None) -> str | None:
    """None when bwrap can build our sandbox here (run as ``uid``), else why not. Probed once per uid."""
    key = f"bwrap:{uid}"
    with _PROBE_LOCK:
        if key not in _PROBES:
            _PROBES[key] = _probe_bwrap(uid)
    return _PROBES[key]


def _probe_bwrap(uid: int | None) -> str | None:
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap is not installed (Debian: apt-get install bubblewrap)"
    workdir = tempfile.mkdtemp(prefix=WORKDIR_PREFIX + "probe-")
    try:
        if uid is not None:
            os.chown(workdir, uid, uid)
        argv = bwrap_argv(exe, workdir, Limits(), None, []) + ["/bin/sh", "-c", "echo ok > /work/probe"]
        request = {
            "jail": {"pdeathsig": False},
            "argv": argv,
            "env": {"PATH": "/usr/bin:/bin"},
            "cwd": workdir,
            "uid": uid,
        }
        code, err = executor().run_sync(request, timeout_s=20)
        if code != 0 or not os.path.exists(os.path.join(workdir, "probe")):
            return f"bwrap does not work here (exit {code}): {err.strip()[:300]}"
        return None
    except (OSError, SandboxError) as e:
        return f"bwrap does not work here: {e}"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def bwrap_argv(
    exe: str, workdir: str, limits: Limits, status_fd: int | None, binds: list[tuple[str, str]]
) -> list[str]:
    """bwrap's command line for a run in ``workdir`` (the program's argv follows)."""
    disk = str(limits.disk_mb * MB)
    argv = [exe, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"]
    argv += ["--cap-drop", "ALL", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in TOP_LINKS:
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    for path in ETC:
        argv += ["--ro-bind-try", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", disk, "--tmpfs", "/tmp", "--size", disk]
    argv += ["--tmpfs", "/dev/shm", "--bind", workdir, "/work", "--chdir", "/work"]
    for src, dst in binds:  # after the tmpfs /tmp, which would hide a Python prefix under /tmp (a venv there)
        argv += ["--ro-bind", src, dst]
    # bwrap's own root and /dev are tmpfs without a size: read-only, or they could fill host RAM.
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    if status_fd is not None:
        argv += ["--json-status-fd", str(status_fd)]
    return argv + ["--"]


def root_view_plan(prefixes: list[str], visible: Sequence[str] = (), loopback: bool = False) -> dict:
    """The jail plan giving a run, as root, what bwrap gives it (``bwrap_argv``): its own pid,
    network, IPC, UTS, cgroup and mount namespaces, a user namespace in which no other can be made,
    and a read-only root of ``/usr``, the ``/bin``-style links, a few ``/etc`` files, the Python
    ``prefixes`` and the ``visible`` paths (as root we reach them where they are). ``loopback``:
    the network namespace's loopback up, as bwrap's is. The work dir is added per run."""
    view = {
        "ro": ["/usr"] + [t for t in TOP_LINKS if os.path.isdir(t) and not os.path.islink(t)],
        "links": {t: os.readlink(t) for t in TOP_LINKS if os.path.islink(t)},
        "files": [f for f in ETC if os.path.exists(f)],
        "binds": [[p, p] for p in prefixes],
        **({"visible": [[p, p] for p in visible]} if visible else {}),
    }
    plan = {"isolate": True, "pidns": True, "no_userns": True, "grafts": [], "root": view}
    return {**plan, "loopback": True} if loopback else plan


def bwrap_ran(fd: int) -> bool:
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
