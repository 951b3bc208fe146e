"""Probes of what a process holds, for the leak checks of the fault tests and the soak: open file
descriptors (``/proc/self/fd``), live child processes, processes of a process group, RSS, and our
labelled docker containers. Read-only; kills nothing. (Sandbox-level host state: the hostile
suite's ``host_state.host_snapshot``.)"""

from __future__ import annotations

import os

#: fds a process keeps by design until it exits: the local sandbox's uid-block lock (jail.claim_uid_block);
#: the executor's socket is recognised by its number (``_executor_fds``)
PERSISTENT_FDS = ("agentrl-uids-",)


def fds() -> dict[str, str]:
    """{fd: what it points to} of this process."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out


def _executor_fds() -> set[str]:
    """The local sandbox executor's sockets (and its ready jails' channels): held by design for the
    life of the process (its child process is ``executor().pid``; what it runs are that process's
    children)."""
    import sys

    client = sys.modules.get("agentrl.sandbox.local.client")
    return {str(fd) for fd in client.executor().fds()} if client is not None else set()


def new_fds(before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    """fds open in ``after`` that were not in ``before`` (persistent-by-design ones left out)."""
    keep = _executor_fds()
    return {
        fd: t
        for fd, t in after.items()
        if before.get(fd) != t and fd not in keep and not any(p in t for p in PERSISTENT_FDS)
    }


def _status(pid: str) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(ln.split(":", 1) for ln in f.read().splitlines() if ":" in ln)


def children(pid: int | None = None) -> set[int]:
    """Live (not zombie) processes whose parent is ``pid`` (default: this process, whose local
    sandbox executor is left out and its children, the sandboxed programs, counted instead)."""
    if pid is None:
        import sys

        client = sys.modules.get("agentrl.sandbox.local.client")
        ex = client.executor().pid if client is not None else None
        return (_children(os.getpid()) - {ex}) | (_children(ex) if ex is not None else set())
    return _children(pid)


def _children(pid: int) -> set[int]:
    out, names, busy = set(), {}, set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            st = _status(name)
        except OSError:
            continue
        names[int(name)] = st["Name"].strip()
        if names[int(name)] == "agentrl-jail":
            busy.add(int(st["PPid"]))
        if int(st["PPid"]) == pid and st["State"].strip()[:1] not in "ZX":
            out.add(int(name))
    # the executor's idle ready jails (prepared ahead of requests, replaced as used) are not programs
    return {p for p in out if names.get(p) != "agentrl-ready" or p in busy}


def in_group(pgid: int) -> set[int]:
    """Live processes of process group ``pgid``."""
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.getpgid(int(name)) == pgid and _status(name)["State"].strip()[:1] not in "ZX":
                out.add(int(name))
        except (OSError, KeyError):
            continue
    return out


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident memory (``VmHWM``: its peak) in MB."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def our_containers() -> list[str]:
    """Ids of the docker sandbox containers this process owns (by the sandbox's owner label)."""
    from agentrl.sandbox.docker.daemon import list_containers, owner_id

    me = owner_id()
    return sorted(c["id"] for c in list_containers() if c.get("owner") == me)
