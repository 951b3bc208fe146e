"""Pooled containers of the Docker backend: starting one, keeping warm ones, the concurrency cap.

Owns: ``Box`` (a started container with its executor attached), ``start_box`` (create, attach,
start, wait for the executor's hello), and ``Pool`` (idle containers per ``Limits`` profile,
``reset``/``fresh`` reuse, the concurrency cap, background replacement and removal).

Does not: decide the container's isolation (``daemon.container_spec``), talk the executor
protocol beyond its hello (``conn``), or turn replies into results (``sandbox``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from agentrl.errors import SandboxError
from agentrl.sandbox.base import Limits
from agentrl.sandbox.docker.conn import AgentConn
from agentrl.sandbox.docker.daemon import (  # noqa: F401 - cleanup helpers re-exported (tests, CLI)
    LABEL,
    LABEL_LIMITS,
    LABEL_OWNER,
    LABEL_RUN,
    MB,
    Daemon,
    container_spec,
    limits_label,
    list_containers,
    owner_alive,
    owner_id,
    remove_containers,
    remove_stale,
    sandbox_env,
)

START_TIMEOUT_S = 30.0  # create + attach + start + hello; a loaded 2-core machine needs seconds


@dataclass(eq=False)
class Box:
    """A started container whose executor said hello; used by one run or session at a time."""

    cid: str
    limits: Limits
    conn: AgentConn
    uses: int = 0
    started: float = field(default_factory=time.time)  # epoch seconds, for the event log

    @property
    def short(self) -> str:
        return self.cid[:12]

    @property
    def alive(self) -> bool:
        """False once the daemon closed the attach stream (the container died while idle)."""
        return not (self.conn.reader.at_eof() or self.conn.writer.is_closing())


async def start_box(
    daemon: Daemon, image: str, limits: Limits, *, runtime: str | None, work_exec: bool, owner: str
) -> Box:
    """Create, attach to, and start one container; wait for its executor's hello."""
    import docker

    labels = {LABEL: "1", LABEL_OWNER: owner, LABEL_RUN: daemon.run_id, LABEL_LIMITS: limits_label(limits)}
    spec = container_spec(
        daemon.client.api, image, limits, labels=labels, runtime=runtime, ncpu=daemon.ncpu, work_exec=work_exec
    )
    try:
        cid = (await daemon.call(daemon.client.api.create_container, **spec, timeout=START_TIMEOUT_S))["Id"]
    except docker.errors.ImageNotFound as e:
        raise SandboxError(f"sandbox image {image!r} not found; build it with `agentrl sandbox build`") from e
    except (TimeoutError, docker.errors.DockerException, OSError) as e:
        raise SandboxError(f"cannot create a sandbox container from {image!r}: {e}") from e
    conn = None
    try:
        conn = await asyncio.wait_for(AgentConn.attach(daemon.address, daemon.api_version, cid), START_TIMEOUT_S)
        await daemon.call(daemon.client.api.start, cid, timeout=START_TIMEOUT_S)
        hello, _ = await asyncio.wait_for(conn.recv(0), START_TIMEOUT_S)
        if hello.get("op") != "hello":
            raise SandboxError(f"container {cid[:12]}: unexpected first message from the executor: {hello!r:.200}")
        conn.hello = hello
        return Box(cid, limits, conn)
    except BaseException as e:
        if conn is not None:
            conn.close()
        await asyncio.shield(daemon.remove(cid))
        if isinstance(e, (SandboxError, asyncio.CancelledError)):
            raise
        tail = conn.stderr_tail.decode(errors="replace").strip()[-500:] if conn is not None else ""
        raise SandboxError(f"cannot start sandbox container {cid[:12]}: {type(e).__name__}: {e} {tail}") from e


# ---------------------------------------------------------------------------------- pool
class Pool:
    """Warm containers per ``Limits`` profile, for one event loop (its asyncio objects and attach
    streams belong to that loop). ``slots`` caps programs running at once (sessions hold a slot
    from their first run to ``close``); at most ``max_concurrency + pool_size`` containers live.

    ``mode="reset"``: a container is reused after its executor wiped it and found it clean
    (otherwise it is replaced). ``mode="fresh"``: each run or session gets a new container,
    removed after; ``pool_size`` containers are started ahead so acquiring one stays fast."""

    def __init__(
        self,
        daemon: Daemon,
        *,
        image: str,
        runtime: str | None,
        work_exec: bool,
        owner: str,
        mode: str,
        pool_size: int,
        max_concurrency: int,
        default_limits: Limits,
        max_uses: int,
    ) -> None:
        self.daemon, self.image, self.runtime, self.work_exec, self.owner = daemon, image, runtime, work_exec, owner
        self.mode, self.pool_size, self.default_limits, self.max_uses = mode, pool_size, default_limits, max_uses
        self.slots = asyncio.Semaphore(max_concurrency)
        self.cap = max_concurrency + pool_size
        self.idle: dict[Limits, list[Box]] = {}
        self.live = 0  # started, starting, in use, or idle
        self._starting: dict[Limits, int] = {}
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self.closed = False
        self.last_error: BaseException | None = None  # of the last background start that failed

    def _background(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _notify(self) -> None:
        self._changed.set()

    async def _start(self, limits: Limits) -> Box:
        """Start one container; the caller has counted it in ``live`` and ``_starting``."""
        try:
            return await start_box(
                self.daemon, self.image, limits, runtime=self.runtime, work_exec=self.work_exec, owner=self.owner
            )
        finally:
            self._starting[limits] -= 1

    def _evict_idle(self, keep: Limits) -> bool:
        """Make room by dropping an idle container of another profile."""
        for limits, boxes in self.idle.items():
            if limits != keep and boxes:
                self.discard(boxes.pop(0))
                return True
        return False

    async def acquire(self, limits: Limits) -> Box:
        while True:
            if self.closed:
                raise SandboxError("the docker sandbox is closed")
            idle = self.idle.get(limits)
            if idle:
                box = idle.pop()
                if not box.alive:  # killed while idle: not this run's problem, take another
                    self.discard(box)
                    continue
                self.top_up()
                return box
            if self.live < self.cap or self._evict_idle(limits):
                self.live += 1
                self._starting[limits] = self._starting.get(limits, 0) + 1
                try:
                    box = await self._start(limits)
                except BaseException:
                    self.live -= 1
                    self._notify()
                    raise
                if self.closed:
                    self.discard(box)
                    raise SandboxError("the docker sandbox is closed")
                return box
            self._changed.clear()
            await self._changed.wait()

    def release(self, box: Box, *, reusable: bool) -> None:
        box.uses += 1
        if reusable and self.mode == "reset" and not self.closed and box.uses < self.max_uses:
            self.idle.setdefault(box.limits, []).append(box)
        else:
            self.discard(box)
        self._notify()
        self.top_up()

    def discard(self, box: Box) -> None:
        """Drop a container: close its stream (the executor exits) and remove it in the background."""
        self.live -= 1
        box.conn.close()
        self._background(self.daemon.remove(box.cid))
        self._notify()

    def top_up(self) -> None:
        """Start containers in the background until ``pool_size`` of the default profile are idle."""
        limits = self.default_limits
        missing = self.pool_size - len(self.idle.get(limits, ())) - self._starting.get(limits, 0)
        for _ in range(max(0, min(missing, self.cap - self.live))):
            self.live += 1
            self._starting[limits] = self._starting.get(limits, 0) + 1
            self._background(self._warm_one(limits))

    async def _warm_one(self, limits: Limits) -> None:
        try:
            box = await self._start(limits)
        except (Exception, asyncio.CancelledError) as e:  # noqa: BLE001
            self.live -= 1  # the next acquire starts one itself and raises what went wrong
            self.last_error = e
            self._notify()
            return
        if self.closed:
            self.discard(box)
            return
        self.idle.setdefault(limits, []).append(box)
        self._notify()

    async def warm(self) -> None:
        """Start the pool's containers now (otherwise the first runs start them)."""
        self.last_error = None
        self.top_up()
        while self._starting.get(self.default_limits, 0):
            self._changed.clear()
            await self._changed.wait()
        if self.pool_size and not self.idle.get(self.default_limits) and self.last_error is not None:
            raise SandboxError(f"cannot start the warm pool: {self.last_error}") from self.last_error

    async def close(self) -> None:
        self.closed = True
        for boxes in self.idle.values():
            while boxes:
                self.discard(boxes.pop())
        self._notify()
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def abandon(self) -> list[str]:
        """For a pool whose loop is gone: close streams without that loop; return container ids."""
        self.closed = True
        ids = []
        for boxes in self.idle.values():
            for box in boxes:
                box.conn.close()
                ids.append(box.cid)
            boxes.clear()
        return ids
