"""The Docker daemon side of the sandbox: the container spec (every isolation flag in one place),
the SDK client with its bounded thread pool, and cleanup of our containers by label.

Owns: ``container_spec``, ``sandbox_env``, ``Daemon`` (the docker SDK client plus a bounded thread
pool for its blocking calls: create, start, inspect, remove), the labels and owner ids
(``owner_id``, ``owner_alive``), and cleanup (``list_containers``, ``remove_containers``,
``remove_stale``, and an atexit hook removing each live sandbox's containers).

A container, as specified here: no network (``network_mode=none``), read-only root, the work dir a
tmpfs capped at ``disk_mb`` (and ``nr_inodes``), ``/dev/shm`` private and small, all capabilities
dropped, ``no-new-privileges``, ``pids_limit``, memory with memory+swap equal to it, a CPU quota
(``nano_cpus``), ulimits nofile/fsize/core, uid:gid 1000:1000 (never root), an empty environment
(PATH/HOME/LANG/TMPDIR and two Python switches, nothing from the host), the ``none`` log driver
(nothing is logged, so nothing grows), labels naming its owner process, ``auto_remove``, and the
optional ``runsc`` (gVisor) runtime. Its pid 1 is the executor (``agentrl.sandbox.docker.agent.executor``),
which is why docker's ``--init`` is not used: the executor is the init (it reaps orphans).

Does not: isolate the kernel (runc containers share it; use ``runtime="runsc"`` for a user-space
kernel), limit disk I/O bandwidth, or hide the CPU model / host kernel version from programs.
Does not pool or run anything (``pool``, ``sandbox``).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import os
import socket
import time
import weakref

from agentrl.errors import SandboxError
from agentrl.sandbox.base import Limits
from agentrl.sandbox.docker.conn import DaemonAddress, executor_source
from agentrl.sandbox.docker.image import SANDBOX_UID, WORKDIR
from agentrl.sandbox.subprocess_runner import base_env

MB = 1 << 20
LABEL = "agentrl.sandbox"
LABEL_OWNER = "agentrl.sandbox.owner"  # host:pid:process-start-time of the trainer that made it
LABEL_RUN = "agentrl.sandbox.run"  # one id per DockerSandbox instance
LABEL_LIMITS = "agentrl.sandbox.limits"
GVISOR_HOST_PIDS = 1024  # host threads gVisor's Sentry may use (the programs' limit is RLIMIT_NPROC inside)


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def owner_id() -> str:
    """Who owns the containers this process makes: host, pid, and the pid's start time (pid reuse)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def owner_alive(owner: str) -> bool | None:
    """True/False for an owner on this host; None when it is another host's (not ours to judge)."""
    host, _, rest = owner.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    return os.path.exists(f"/proc/{pid}") and _start_time(int(pid)) == started


def sandbox_env() -> dict[str, str]:
    """The whole environment of the executor and of every program (nothing comes from the host)."""
    return base_env(WORKDIR, WORKDIR, None)


def container_spec(
    api, image: str, limits: Limits, *, labels: dict[str, str], runtime: str | None, ncpu: int, work_exec: bool = True
) -> dict:
    """Keyword arguments of ``APIClient.create_container`` for one hardened sandbox container.

    ``work_exec``: the work dir is mounted without ``noexec`` by default: agents routinely
    ``chmod +x`` a script and run it, and ``noexec`` stops no interpreter (python can map
    anonymous executable memory); the container, not the mount flag, is the boundary."""
    from docker.types import LogConfig, Ulimit

    inodes = max(1024, limits.disk_mb * 64)
    ulimits = [
        Ulimit(name="nofile", soft=limits.nofile, hard=limits.nofile),
        Ulimit(name="fsize", soft=limits.fsize_mb * MB, hard=limits.fsize_mb * MB),
        Ulimit(name="core", soft=0, hard=0),
    ]
    pids_limit = limits.pids
    if runtime is not None and "runsc" in runtime:
        # gVisor's kernel (the Sentry) runs in the container's cgroup: a pids cgroup of `pids` would
        # count its own threads and crash it on the first pipeline. Inside gVisor RLIMIT_NPROC
        # counts the sandbox's own processes (under runc it would count the uid host-wide), so the
        # program limit moves there and the cgroup only bounds the Sentry.
        ulimits.append(Ulimit(name="nproc", soft=limits.pids, hard=limits.pids))
        pids_limit = GVISOR_HOST_PIDS
    tmpfs_opts = (
        f"size={limits.disk_mb}m,nr_inodes={inodes},uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0700,"
        f"nosuid,nodev,{'exec' if work_exec else 'noexec'}"
    )
    host_config = api.create_host_config(
        network_mode="none",
        read_only=True,
        tmpfs={WORKDIR: tmpfs_opts},
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        pids_limit=pids_limit,
        mem_limit=limits.memory_mb * MB,
        memswap_limit=limits.memory_mb * MB,
        # the daemon refuses a quota above its CPU count; a bigger ask means "all of them"
        nano_cpus=int(min(limits.cpus, ncpu) * 1e9),
        ulimits=ulimits,
        log_config=LogConfig(type="none"),
        auto_remove=True,
        ipc_mode="private",
        shm_size=min(64, limits.disk_mb) * MB,
        runtime=runtime,
    )
    return dict(
        image=image,
        command=["python3", "-I", "-c", executor_source()],
        user=f"{SANDBOX_UID}:{SANDBOX_UID}",
        detach=False,
        stdin_open=True,
        tty=False,
        environment=sandbox_env(),
        working_dir=WORKDIR,
        hostname="sandbox",
        labels=labels,
        host_config=host_config,
    )


def limits_label(limits: Limits) -> str:
    return (
        f"mem={limits.memory_mb}m,cpus={limits.cpus:g},pids={limits.pids},nofile={limits.nofile},"
        f"fsize={limits.fsize_mb}m,disk={limits.disk_mb}m"
    )


# ---------------------------------------------------------------------------------- cleanup
def list_containers(client=None, *, run_id: str | None = None) -> list[dict]:
    """Every container (running or not) carrying our label, optionally only one sandbox's
    (``run_id``): ``[{"id", "name", "status", "owner", "run", "limits", "created"}]``."""
    import docker

    client = client or docker.from_env()
    label = [LABEL] if run_id is None else [LABEL, f"{LABEL_RUN}={run_id}"]
    out = []
    for c in client.api.containers(all=True, filters={"label": label}):
        labels = c.get("Labels") or {}
        out.append(
            {
                "id": c["Id"],
                "name": (c.get("Names") or ["?"])[0].lstrip("/"),
                "status": c.get("Status", ""),
                "owner": labels.get(LABEL_OWNER, ""),
                "run": labels.get(LABEL_RUN, ""),
                "limits": labels.get(LABEL_LIMITS, ""),
                "created": c.get("Created", 0),
            }
        )
    return out


def remove_containers(client, ids, *, wait_s: float = 20.0) -> int:
    """Force-remove containers by id and wait until they are gone. One whose removal is already
    under way (``auto_remove`` after its executor exited, or another process's sweep) is waited for."""
    import docker

    ids = list(ids)
    for cid in ids:
        try:
            client.api.remove_container(cid, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: its removal is already in progress
                raise
    deadline = time.monotonic() + wait_s
    for cid in ids:
        while time.monotonic() < deadline:
            try:
                client.api.inspect_container(cid)
            except docker.errors.NotFound:
                break
            time.sleep(0.05)
    return len(ids)


def remove_stale(client) -> int:
    """Remove our containers whose owner process (on this host) is gone; another host's are kept."""
    stale = [c["id"] for c in list_containers(client) if owner_alive(c["owner"]) is False]
    return remove_containers(client, stale)


_LIVE_RUNS: weakref.WeakSet[Daemon] = weakref.WeakSet()


@atexit.register
def _remove_at_exit() -> None:
    for daemon in list(_LIVE_RUNS):
        daemon.remove_run_sync()


# ---------------------------------------------------------------------------------- daemon
class Daemon:
    """The docker SDK client for one sandbox, its blocking calls run in a bounded thread pool."""

    def __init__(self, address: DaemonAddress, *, run_id: str, api_threads: int = 8, timeout_s: float = 60.0) -> None:
        import docker

        self.address, self.run_id = address, run_id
        try:
            self.client = docker.DockerClient(
                base_url=address.base_url, timeout=int(timeout_s), max_pool_size=api_threads
            )
            info = self.client.info()
        except docker.errors.DockerException as e:
            raise SandboxError(f"no Docker daemon answers at {address.base_url}: {e}") from e
        self.api_version = self.client.api.api_version
        self.ncpu = int(info.get("NCPU") or os.cpu_count() or 1)
        self.runtimes = set((info.get("Runtimes") or {}).keys())
        self.pool = concurrent.futures.ThreadPoolExecutor(api_threads, thread_name_prefix="agentrl-docker")
        _LIVE_RUNS.add(self)

    async def call(self, fn, *args, timeout: float | None = None, **kwargs):
        fut = asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))
        return await (asyncio.wait_for(fut, timeout) if timeout else fut)

    async def state(self, cid: str) -> dict | None:
        """The container's ``State`` (None when it no longer exists)."""
        import docker

        try:
            return (await self.call(self.client.api.inspect_container, cid, timeout=10.0)).get("State")
        except docker.errors.NotFound:
            return None
        except (TimeoutError, docker.errors.DockerException, OSError) as e:
            raise SandboxError(f"cannot inspect container {cid[:12]}: {e}") from e

    async def oom_event(self, cid: str, since: float) -> bool:
        """Whether the daemon's event log holds an ``oom`` event for ``cid`` since ``since`` (epoch
        seconds). The log outlives the container: ``auto_remove`` may take a container killed out of
        memory before its ``State.OOMKilled`` can be read (gVisor's sandbox dies as a whole)."""
        import docker

        def read() -> bool:
            events = self.client.events(
                since=int(since) - 1,
                until=int(time.time()) + 1,
                filters={"container": cid, "event": "oom"},
                decode=True,
            )
            try:
                return any(True for _ in events)
            finally:
                events.close()

        try:
            return await self.call(read, timeout=10.0)
        except (TimeoutError, docker.errors.DockerException, OSError) as e:
            raise SandboxError(f"cannot read the event log of container {cid[:12]}: {e}") from e

    async def remove(self, cid: str) -> None:
        try:
            await self.call(remove_containers, self.client, [cid], timeout=30.0)
        except Exception:  # noqa: BLE001 - the atexit/next-start sweep by label catches what this misses
            pass

    def remove_run_sync(self) -> None:
        try:
            remove_containers(self.client, [c["id"] for c in list_containers(self.client, run_id=self.run_id)])
        except Exception:  # noqa: BLE001 - best effort at exit; the next start removes stale ones
            pass

    def close(self) -> None:
        self.remove_run_sync()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
        _LIVE_RUNS.discard(self)
