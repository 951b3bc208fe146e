"""The Docker sandbox backend: hardened containers, a warm pool, sessions, typed results.

Owns: ``DockerSandbox`` (one-shot ``run``, ``session``, ``aclose``), ``DockerSession``, how an
executor reply becomes an ``ExecResult``, the host-side deadline, and ``unavailable_reason``
(the probe ``make_sandbox("auto")`` uses). The pieces:
``docker_daemon`` (the container spec with every isolation flag, the SDK client, cleanup by label),
``docker_pool`` (warm containers, the concurrency cap), ``docker_conn`` (the attach stream),
``docker_agent`` (the executor, pid 1 in every container), ``image`` (the offline image build).

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
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence

from agentrl.errors import ConfigError, SandboxError
from agentrl.sandbox.base import ExecResult, Limits, Sandbox, SandboxSession
from agentrl.sandbox.docker_conn import DaemonAddress, ProtocolError
from agentrl.sandbox.docker_daemon import (  # noqa: F401 - list_containers re-exported for tests and the CLI
    MB,
    Daemon,
    list_containers,
    owner_id,
    remove_containers,
    remove_stale,
    sandbox_env,
)
from agentrl.sandbox.docker_pool import Box, Pool
from agentrl.sandbox.files import check_relpath
from agentrl.sandbox.image import DEFAULT_TAG
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
        _check_files(files, limits)
        pool = self._pool()
        async with pool.slots:
            box = await pool.acquire(limits)
            reusable = False
            try:
                res, reusable, _ = await self._execute(
                    box, argv, stdin, timeout_s, files, collect, reset=self.mode == "reset"
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

    # ------------------------------------------------------------------------------ one run
    async def _execute(
        self,
        box: Box,
        argv: list[str],
        stdin: bytes | None,
        timeout_s: float,
        files: Mapping[str, bytes] | None,
        collect: Sequence[str],
        *,
        reset: bool,
    ) -> tuple[ExecResult, bool, bool]:
        """Run on ``box``: (result, clean for reuse, container still alive)."""
        limits = box.limits
        files = dict(files or {})
        collect = list(collect)
        cap, max_file, max_total = limits.max_output_bytes, limits.fsize_mb * MB, limits.disk_mb * MB
        req = {
            "op": "run",
            "argv": argv,
            "env": self.env,
            "timeout": timeout_s,
            "cap": cap,
            "files": [[k, len(v)] for k, v in files.items()],
            "stdin": stdin is not None,
            "collect": collect,
            "max_file": max_file,
            "max_total": max_total,
            "reset": reset,
        }
        payload = b"".join(bytes(v) for v in files.values()) + (stdin or b"")
        # The host deadline also allows for moving the bytes (20 MB/s is slow even on a loaded machine).
        host_deadline = timeout_s + self.host_grace_s + (len(payload) + (max_total if collect else 0)) / 20e6
        t0 = time.perf_counter()
        try:
            reply, data = await asyncio.wait_for(
                box.conn.call(req, payload, max_payload=2 * cap + max_total), host_deadline
            )
        except asyncio.TimeoutError:
            raise SandboxError(
                f"sandbox container {box.short}: no answer from its executor within the "
                f"{timeout_s:g} s deadline + {host_deadline - timeout_s:.1f} s; container destroyed"
            ) from None
        except (EOFError, ConnectionError, ProtocolError, OSError) as e:
            return await self._died(box, e, t0), False, False
        wall = time.perf_counter() - t0
        return _to_result(reply, data, wall, limits, collect, box), reply.get("clean") is True, True

    async def _died(self, box: Box, err: Exception, t0: float) -> ExecResult:
        """The stream ended mid-run. Out of memory (the kernel killed the executor too) is the
        program's doing: an ``oom`` result. Anything else (docker kill, daemon restart) is not."""
        state = await self.daemon.state(box.cid)
        if state is not None and state.get("OOMKilled"):
            return ExecResult(
                "",
                "",
                -9,
                "oom",
                time.perf_counter() - t0,
                detail=f"the container ran out of memory ({box.limits.memory_mb} MB, work dir "
                "tmpfs included) and was destroyed",
            )
        how = "removed" if state is None else f"{state.get('Status')}, exit code {state.get('ExitCode')}"
        tail = box.conn.stderr_tail.decode(errors="replace").strip()[-300:]
        raise SandboxError(
            f"sandbox container {box.short} died during the run ({how}): {err}"
            + (f"; executor stderr: {tail}" if tail else "")
        )


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
        _check_files(files, self.limits)
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
                res, _, alive = await self.sandbox._execute(
                    self._box, argv, stdin, timeout_s, files, collect, reset=False
                )
                ok = True
            except _SpawnError:
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
                except (asyncio.TimeoutError, EOFError, ConnectionError, ProtocolError, OSError):
                    pass
            self._drop(reusable=clean)

    def _drop(self, *, reusable: bool) -> None:
        box, pool = self._box, self._pool
        self._box = self._pool = None
        if box is not None and pool is not None:
            pool.release(box, reusable=reusable)
            pool.slots.release()


# ---------------------------------------------------------------------------------- helpers
class _SpawnError(SandboxError):
    """The executor could not exec argv[0] (as on the local backend: infrastructure, not a result)."""


def _check_files(files: Mapping[str, bytes] | None, limits: Limits) -> None:
    total = 0
    for name, data in (files or {}).items():
        check_relpath(name)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"content of sandbox file {name!r} must be bytes, got {type(data).__name__}")
        total += len(data)
    if total > limits.disk_mb * MB:
        raise ValueError(f"files to copy in total {total} bytes, over the {limits.disk_mb * MB}-byte cap")


def _to_result(reply: dict, data: bytes, wall: float, limits: Limits, collect: list[str], box: Box) -> ExecResult:
    """An executor reply as an ExecResult, checking it against what was asked (it is untrusted)."""
    status = reply.get("status")
    if status == "spawn_error":
        raise _SpawnError(str(reply.get("error"))[:500])
    if status == "error":
        return ExecResult("", "", None, "error", wall, detail=str(reply.get("error"))[:1000])
    cap = limits.max_output_bytes
    n_out, n_err = reply.get("out"), reply.get("err")
    sizes = reply.get("files") or []
    ok_sizes = (
        isinstance(n_out, int)
        and isinstance(n_err, int)
        and 0 <= n_out <= cap
        and 0 <= n_err <= cap
        and all(
            isinstance(s, list)
            and len(s) == 2
            and s[0] in collect
            and isinstance(s[1], int)
            and 0 <= s[1] <= limits.fsize_mb * MB
            for s in sizes
        )
        and n_out + n_err + sum(s[1] for s in sizes) == len(data)
    )
    if status not in ("ok", "timeout", "output_limit") or not ok_sizes:
        raise SandboxError(f"sandbox container {box.short}: malformed reply from its executor: {reply!r:.300}")
    stdout, stderr = data[:n_out].decode("utf-8", "replace"), data[n_out : n_out + n_err].decode("utf-8", "replace")
    got, off = {}, n_out + n_err
    for name, size in sizes:
        got[name] = data[off : off + size]
        off += size
    code, sig, truncated = reply.get("exit_code"), reply.get("signal"), bool(reply.get("truncated"))
    details = []
    if status == "ok" and truncated:
        status = "output_limit"
    if status in ("timeout", "output_limit"):
        code = None
    elif reply.get("oom") and code != 0:
        status = "oom"
        details.append(f"killed by the kernel OOM killer at the {limits.memory_mb} MB memory limit")
    elif sig:
        status = "killed"
        details.append("file size limit (RLIMIT_FSIZE)" if sig == 25 else f"died by signal {sig}")
    elif code not in (0, None) and _last_line(stderr).startswith("MemoryError"):
        status = "oom"
        details.append(f"MemoryError under the {limits.memory_mb} MB limit")
    refused = reply.get("refused") or {}
    if isinstance(refused, dict) and refused:
        details.append("not collected: " + "; ".join(f"{p!r} ({why})" for p, why in refused.items()))
    if reply.get("clean") is False:
        details.append(f"container not reused: {reply.get('why')}")
    return ExecResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=code,
        status=status,
        wall_s=wall,
        truncated=truncated,
        files=got,
        detail="; ".join(details),
    )


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""
