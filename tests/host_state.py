"""The host's state as the sandbox tests count it: processes of this process's sandbox uids and its children,
its sandbox work dirs and mounts, temp disk usage and (docker) its labelled containers. ``host_snapshot`` before
and after a case must match (``assert_host_unchanged``); used by the hostile suite and ``bench/bench_soak.py``."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time

from agentrl.sandbox.local.child import JAIL_NAME as _JAIL
from agentrl.sandbox.local.child import READY_NAME as _READY
from agentrl.sandbox.local.client import executor

READY_NAME, JAIL_NAME = _READY.decode(), _JAIL.decode()


def _proc_entries() -> list[tuple[int, int, int, str]]:
    """(pid, ppid, real uid, state) of every live process but the local executor's idle ready jails
    (named ``agentrl-ready`` with no running child: prepared ahead of requests, replaced as used)."""
    out, names = [], {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(ln.split(":", 1) for ln in f.read().splitlines() if ":" in ln)
        except OSError:
            continue
        names[int(name)] = fields["Name"].strip()
        out.append((int(name), int(fields["PPid"]), int(fields["Uid"].split()[0]), fields["State"].strip()[:1]))
    busy = {ppid for pid, ppid, _, _ in out if names[pid] == JAIL_NAME}
    return [e for e in out if names[e[0]] != READY_NAME or e[0] in busy]


def host_snapshot(backend: str) -> dict:
    """What must be the same before and after a case: processes of our sandbox uids (the uid block
    this process holds) and our children, our work dirs and mounts, temp disk usage, and for docker
    our containers. Other processes on the host (other test runs) are not ours to count."""
    from agentrl.sandbox.local.jail import claimed_uid_ranges

    ours = claimed_uid_ranges()
    procs = [p for p in _proc_entries() if p[3] not in "ZX"]
    tmp = tempfile.gettempdir()
    tag = f"agentrl-sbx-{os.getpid()}-"
    snap = {
        "sandbox_uid_procs": sorted(pid for pid, _, uid, _ in procs if any(uid in r for r in ours)),
        # the local backend's executor is a child by design; what it runs are its children
        "our_children": sorted(
            pid
            for pid, ppid, _, _ in procs
            if (ppid == os.getpid() and pid != executor().pid) or ppid == executor().pid
        ),
        "workdirs": sorted(glob.glob(os.path.join(tmp, tag + "*"))),
        "mounts": sorted(ln.split()[1] for ln in open("/proc/mounts") if tag in ln),
        "tmp_used_mb": shutil.disk_usage(tmp).used // (1 << 20),
    }
    if backend == "docker":
        snap["containers"] = _docker_containers()
    return snap


def _docker_containers() -> list[str]:
    """Our process's labelled containers (other processes on this host may be running their own)."""
    from agentrl.sandbox.docker.pool import list_containers, owner_id

    me = owner_id()
    return sorted(c["id"] for c in list_containers() if c.get("owner") == me)


def assert_host_unchanged(before: dict, after: dict) -> None:
    # Other engineers share /tmp: a tolerance catches GB-scale leaks without flaking on their files.
    assert abs(after.pop("tmp_used_mb") - before.pop("tmp_used_mb")) < 256, "temp disk usage changed"
    for _ in range(50):  # killed processes may take a moment to be reaped by their new parent
        if after == before:
            return
        time.sleep(0.1)
        after = {
            k: v
            for k, v in host_snapshot("docker" if "containers" in before else "local").items()
            if k != "tmp_used_mb"
        }
    assert after == before
