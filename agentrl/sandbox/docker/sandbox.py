"""The Docker sandbox backend: hardened containers, a warm pool, sessions, typed results.

Owns: ``DockerSandbox`` (one-shot ``run``, ``session``, ``aclose``), ``DockerSession``, and
``unavailable_reason`` (the probe ``make_sandbox("auto")`` uses). The pieces: ``run`` (one
run on a container: the request, the host-side deadline, how the executor's reply becomes an
``ExecResult``), ``daemon`` (the container spec with every isolation flag, the SDK client,
cleanup by label), ``pool`` (warm containers, the concurrency cap), ``conn`` (the
attach stream), ``agent.executor`` (the executor, pid 1 in every container), ``image`` (the offline
image build).

How a run goes: take an idle container of the run's ``Limits`` profile (or start one), send the
executor one request (files, argv, stdin, deadline, output cap, paths to collect), and get one
reply. The executor enforces the deadline and the caps inside the container and kills every
process of the sandbox user after every run; the host enforces the deadline again (no reply
by ``timeout_s + host_grace_s`` -> the container is destroyed and SandboxError is raised). In
``mode="reset"`` the same request also wipes the work dir and checks the container is clean before
it goes back to the pool; an unclean container is replaced.

What it isolates: network (none), the host filesystem (read-only image root; a tmpfs work dir of
``disk_mb``), host processes (own pid namespace), privileges (uid 1000, no capabilities,
no-new-privileges, setuid bits stripped from the image), memory (cgroup; memory+swap equal),
CPU (quota), processes (pids limit), files (fsize/nofile ulimits), the environment (nothing of the
host's), one episode from the next (reset wipes files, processes, /dev/shm, System V IPC, or a
fresh container per episode), and the sandbox from its program (the executor is its pid
namespace's init and not dumpable: ``kill -9 -1``, ``kill -STOP 1`` and ptrace cannot touch it).

gVisor (``runtime="runsc"``, registered with the daemon) puts a user-space kernel between the
program and the host's. Differences there: the pids limit becomes RLIMIT_NPROC inside gVisor (its
own threads live in the container's cgroup); running out of memory takes the whole sandbox down
(status ``oom``, container replaced); and gVisor delivers SIGKILL/SIGSTOP to pid 1 from inside, so
a program can kill or freeze the executor: that run raises SandboxError (bounded by the host
deadline), where under runc it cannot happen.

What it does NOT isolate: the kernel (runc shares it; a kernel exploit escapes; pass
``runtime="runsc"`` where gVisor is installed), disk and memory *bandwidth*, CPU cache side
channels, and information about the host visible through /proc (CPU model, kernel version, uptime,
load). Status ``oom`` comes from the container's cgroup OOM counter (or the container's OOMKilled
state), ``exit_code`` of a signalled program is ``-signal`` (exact: the executor sees the wait
status, unlike ``docker exec`` which reports 128+n). Within one session only files persist:
processes are killed after every run, as on the local backend.

Concurrency: ``max_concurrency`` programs at once per event loop (a session holds its slot from its
first run to ``close``); at most ``max_concurrency + pool_size`` containers exist. Use one
DockerSandbox per process (it is shared like ``default_sandbox``); its containers are labelled with
the owner process and removed at ``aclose`` and at interpreter exit. If the process dies (even
SIGKILL) its attach streams close, every executor reads EOF and exits, and ``auto_remove`` takes
the containers away; what is left anyway (a daemon restart) goes at the next DockerSandbox started
on this host (stale-owner sweep by label) or with ``agentrl sandbox clean``.
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections.abc import Mapping, Sequence

from agentrl.errors import ConfigError, SandboxError
from agentrl.sandbox.base import ExecResult, Limits, Sandbox, SandboxSession
from agentrl.sandbox.docker.conn import DaemonAddress, ProtocolError
from agentrl.sandbox.docker.daemon import (  # noqa: F401 - list_containers re-exported for tests and the CLI
    MB,
    Daemon,
    list_containers,
    owner_id,
    remove_containers,
    remove_stale,
    sandbox_env,
)
from agentrl.sandbox.docker.image import DEFAULT_TAG
from agentrl.sandbox.docker.pool import Box, Pool
from agentrl.sandbox.docker.run import SpawnError, check_files, execute
from agentrl.sandbox.subprocess_runner import check_call

MODES = ("reset", "fresh")


def unavailable_reason(*, image: str = DEFAULT_TAG, docker_host: str | None = None, **_ignored) -> str | None:
    """None when a Docker daemon answers and ``image`` exists, else why not (one line)."""
    try:
        import docker
    except ImportError as e:
        return f"the docker SDK is not installed ({e}); pip install docker"
    try:
        client = docker.DockerClient(base_url=DaemonAddress.parse(docker_host).base_url, timeout=5)
    except (docker.errors.DockerException, ConfigError) as e:
        return f"no Docker daemon: {e}"
    try:
        client.ping()
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return f"the sandbox image {image!r} is missing; build it with `agentrl sandbox build`"
    except Exception as e:  # noqa: BLE001 - any failure to talk to the daemon means "not available"
        return f"the Docker daemon does not answer: {type(e).__name__}: {e}"
    finally:
        client.close()
    return None


class DockerSandbox(Sandbox):
    """Programs run in hardened, pooled containers. See the module docstring.

    Args:
        image: the sandbox image (``agentrl sandbox build`` makes it offline).
        limits: default ``Limits``; ``run(limits=...)`` uses a pool of that profile.
        mode: ``"reset"`` (reuse a container after wiping it) or ``"fresh"`` (one per run/session).
        pool_size: idle containers kept started for the default profile.
        max_concurrency: programs running at once (sessions count from first run to close).
        runtime: OCI runtime, e.g. ``"runsc"`` for gVisor; it must be registered with the daemon.
        docker_host: ``unix:///path`` or ``tcp://host:port``; default ``$DOCKER_HOST`` or the unix socket.
        api_threads: threads for the SDK's blocking calls (create/start/remove/inspect).
        host_grace_s: how long after a deadline the host waits for the executor before it
            destroys the container and raises SandboxError.
        max_uses: a reused container is replaced after this many runs/sessions.
        work_exec: allow executing files from the work dir (see ``container_spec``).
    """

    name = "docker"

    def __init__(
        self,
        *,
        image: str = DEFAULT_TAG,
        limits: Limits | None = None,
        mode: str = "reset",
        pool_size: int = 2,
        max_concurrency: int = 16,
        runtime: str | None = None,
        docker_host: str | None = None,
        api_threads: int = 8,
        host_grace_s: float = 3.0,
        max_uses: int = 500,
        work_exec: bool = True,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"DockerSandbox mode must be one of {list(MODES)}, got {mode!r}")
        for field_name, value, low in (
            ("pool_size", pool_size, 0),
            ("max_concurrency", max_concurrency, 1),
            ("api_threads", api_threads, 1),
            ("max_uses", max_uses, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"DockerSandbox {field_name} must be an integer >= {low}, got {value!r}")
        if not host_grace_s > 0:
            raise ConfigError(f"DockerSandbox host_grace_s must be > 0, got {host_grace_s!r}")
        self.image, self.limits, self.mode = image, limits or Limits(), mode
        self.pool_size, self.max_concurrency, self.max_uses = pool_size, max_concurrency, max_uses
        self.host_grace_s, self.work_exec = host_grace_s, work_exec
        self.run_id = uuid.uuid4().hex[:12]
        self.daemon = Daemon(DaemonAddress.parse(docker_host), run_id=self.run_id, api_threads=api_threads)
        if runtime is not None and runtime not in self.daemon.runtimes:
            self.daemon.close()
            raise ConfigError(
                f"DockerSandbox runtime {runtime!r} is not registered with the daemon "
                f"(it has {sorted(self.daemon.runtimes)}); install gVisor and add it to daemon.json"
            )
        self.runtime = runtime
        reason = unavailable_reason(image=image, docker_host=docker_host)
        if reason is not None:
            self.daemon.close()
            raise SandboxError(reason)
        self.owner = owner_id()
        remove_stale(self.daemon.client)  # containers of trainers that died without cleaning up
        self.env = sandbox_env()
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Pool] = weakref.WeakKeyDictionary()
        self._closed = False
        #: what every run's ``execute`` is given besides the call: the environment and the host's grace
        self._host = {"env": self.env, "grace_s": host_grace_s}

    # ------------------------------------------------------------------------------ pools
    def _pool(self) -> Pool:
        if self._closed:
            raise SandboxError("the docker sandbox is closed")
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            for old_loop, old in list(self._pools.items()):
                if old_loop.is_closed():  # its streams died with it: drop those containers
                    self.daemon.pool.submit(remove_containers, self.daemon.client, old.abandon())
                    del self._pools[old_loop]
            pool = self._pools[loop] = Pool(
                self.daemon,
                image=self.image,
                runtime=self.runtime,
                work_exec=self.work_exec,
                owner=self.owner,
                mode=self.mode,
                pool_size=self.pool_size,
                max_concurrency=self.max_concurrency,
                default_limits=self.limits,
                max_uses=self.max_uses,
            )
        return pool

    def describe(self) -> dict:
        """What this backend enforces (the hostile suite and ``agentrl sandbox exec`` read it)."""
        return {
            "backend": "docker",
            "image": self.image,
            "runtime": self.runtime or "runc",
            "mode": self.mode,
            "network_isolated": True,
            "pids_enforced": True,
            "dedicated_uid": True,
            "memory_cgroup": True,
            "read_only_root": True,
            "pool_size": self.pool_size,
            "max_concurrency": self.max_concurrency,
        }

    def isolation_summary(self) -> str:
        return (
            f"docker (image {self.image}, runtime {self.runtime or 'runc'}: no network, read-only root, "
            f"all capabilities dropped, memory/pids cgroups, unprivileged user)"
        )

    async def start(self) -> None:
        """Start the warm pool now (otherwise the first runs pay for starting containers)."""
        await self._pool().warm()

    # ------------------------------------------------------------------------------ API
    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float,
        files: Mapping[str, bytes] | None = None,
        limits: Limits | None = None,
        collect: Sequence[str] = (),
    ) -> ExecResult:
        argv = check_call(argv, timeout_s)
        limits = limits or self.limits
        check_files(files, limits)
        pool = self._pool()
        async with pool.slots:
            box = await pool.acquire(limits)
            reusable = False
            try:
                res, reusable, _ = await execute(
                    self.daemon, box, argv, stdin, timeout_s, files, collect, **self._host, reset=self.mode == "reset"
                )
                return res
            finally:
                pool.release(box, reusable=reusable)

    async def session(self, *, limits: Limits | None = None) -> SandboxSession:
        return DockerSession(self, limits or self.limits)

    async def aclose(self) -> None:
        """Remove every container of this sandbox. Idempotent."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        for pool_loop, pool in list(self._pools.items()):
            if pool_loop is loop:
                await pool.close()
            else:
                pool.abandon()
        self._pools.clear()
        await loop.run_in_executor(None, self.daemon.close)


class DockerSession(SandboxSession):
    """One container for the turns of one episode: files persist across runs, processes do not.
    Runs are serialised (one container runs one program at a time). After the container dies,
    every later run raises SandboxError."""

    def __init__(self, sandbox: DockerSandbox, limits: Limits) -> None:
        self.sandbox, self.limits = sandbox, limits
        self._box: Box | None = None
        self._pool: Pool | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._dead: str | None = None

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float,
        files: Mapping[str, bytes] | None = None,
        collect: Sequence[str] = (),
    ) -> ExecResult:
        argv = check_call(argv, timeout_s)
        check_files(files, self.limits)
        async with self._lock:
            if self._closed:
                raise SandboxError("sandbox session is closed")
            if self._dead:
                raise SandboxError(f"sandbox session's container is gone: {self._dead}")
            if self._box is None:
                pool = self.sandbox._pool()
                await pool.slots.acquire()
                try:
                    self._box = await pool.acquire(self.limits)
                except BaseException:
                    pool.slots.release()
                    raise
                self._pool = pool
            ok = False
            try:
                sb = self.sandbox
                res, _, alive = await execute(
                    sb.daemon, self._box, argv, stdin, timeout_s, files, collect, **sb._host, reset=False
                )
                ok = True
            except SpawnError:
                ok = True  # the program could not start; its container is fine
                raise
            finally:
                if not ok:
                    self._dead = "it died or stopped answering"
                    self._drop(reusable=False)
            if not alive:
                self._dead = f"it died in an earlier run ({res.detail})"
                self._drop(reusable=False)
            return res

    async def close(self) -> None:
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            box = self._box
            if box is None:
                return
            clean = False
            if self.sandbox.mode == "reset":
                try:
                    reply, _ = await asyncio.wait_for(box.conn.call({"op": "reset"}, b"", max_payload=0), 10.0)
                    clean = reply.get("clean") is True
                except (TimeoutError, EOFError, ConnectionError, ProtocolError, OSError):
                    pass
            self._drop(reusable=clean)

    def _drop(self, *, reusable: bool) -> None:
        box, pool = self._box, self._pool
        self._box = self._pool = None
        if box is not None and pool is not None:
            pool.release(box, reusable=reusable)
            pool.slots.release()
