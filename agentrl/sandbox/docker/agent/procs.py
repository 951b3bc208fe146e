"""The Docker executor's hygiene: processes and workspace. This file runs INSIDE the sandbox container.

Loaded by the executor's bootstrap (``agentrl.sandbox.docker.conn.executor_source``) as module
``sandbox_procs`` before ``agentrl.sandbox.docker.agent.executor`` runs. Owns: reaping every exited child
(the executor is its pid namespace's init and inherits all orphans) while keeping the exit status of
the programs it waits for (``WATCHED`` -> ``EXITED``), killing every process of the sandbox user
(``kill_all``), wiping the work dir and the shared-memory mounts and checking the container is clean
(``reset``), and the cgroup's OOM-kill counter (``oom_kills``). Standard library only; imports
cleanly on the host too (it does nothing there). Does not speak the protocol or run programs
(``agent.executor``).
"""

import os
import shutil
import signal
import time

WORKDIR = "/work"
WIPE = (WORKDIR, "/dev/shm", "/dev/mqueue")
OOM_SOURCES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
WATCHED: set = set()  # pids of the programs the executor started and waits for
EXITED: dict = {}  # their exit codes (negative: the signal), once reaped


def _oom_source():
    for path in OOM_SOURCES:
        try:
            with open(path) as f:
                if "oom_kill " in f.read():
                    return path
        except OSError:
            continue
    return None


OOM_SOURCE = _oom_source()


def oom_kills():
    """How many processes the kernel's OOM killer has killed in this container so far."""
    if OOM_SOURCE is None:
        return 0
    try:
        with open(OOM_SOURCE) as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _others():
    """Live (non-zombie) processes other than us (every process here is the sandbox user's)."""
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            found.append(int(name))
    return found


def reap():
    """Collect every exited child (as init we inherit all orphans); keep the statuses we wait for."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in WATCHED:
            EXITED[pid] = os.waitstatus_to_exitcode(status)


def kill_all():
    """SIGKILL every process but us (setsid escapees, orphans, fork bombs). A fork racing kill(-1)
    fails (the kernel aborts a fork whose parent has a fatal signal pending); loop anyway."""
    for _ in range(500):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        reap()
        if not _others():
            return True
        time.sleep(0.002)
    return False


def _wipe(root):
    """Empty ``root`` (entries the program made read-only or unlistable included)."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    for name in names:
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            for dirpath, dirnames, _ in os.walk(path):
                for d in dirnames:
                    try:
                        os.chmod(os.path.join(dirpath, d), 0o700, follow_symlinks=False)
                    except (OSError, NotImplementedError):
                        pass
            os.chmod(path, 0o700)
            shutil.rmtree(path)
        else:
            os.unlink(path)


def reset():
    """Kill every process, wipe the work dir, /dev/shm and /dev/mqueue, check nothing is left."""
    if not kill_all():
        return {"clean": False, "why": "processes of the sandbox user survived kill(-1)"}
    try:
        for root in WIPE:
            _wipe(root)
        left = [r for r in WIPE if os.path.isdir(r) and os.listdir(r)]
        if left:
            return {"clean": False, "why": f"could not empty {left}"}
        for kind in ("shm", "sem", "msg"):
            try:
                with open(f"/proc/sysvipc/{kind}") as f:
                    if len(f.read().splitlines()) > 1:
                        return {"clean": False, "why": f"System V IPC objects ({kind}) left behind"}
            except FileNotFoundError:
                pass  # gVisor has no /proc/sysvipc
    except (OSError, RecursionError) as e:
        return {"clean": False, "why": f"wipe failed: {e}"}
    return {"clean": True, "why": ""}
