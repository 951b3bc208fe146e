"""How one ``agentrl run`` is driven from outside its step loop: :class:`Control`.

Owns the run's control state (``stop_reason``, the attempt's stop event and main task, what the
heartbeat found ``lost``, the :class:`~agentrl.distributed.recovery.Supervisor`) and what acts on it:
``run`` (the attempts under the Supervisor, torch's thread count restored afterwards; an attempt
that the heartbeat cancelled ends as the error it found, so a lost Ray node restarts the run),
``watch`` (the compute's heartbeat: a lost node or actor cancels the attempt) and ``request_stop``
(a graceful stop: checkpoint and return at the end of the current step; a second request cancels at
once). Does not run steps or restore state for a restarted attempt (``agentrl.jobs.run.loop``:
``Runner._restart_state``) or build pieces (``agentrl.jobs.run.parts``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from agentrl.distributed.recovery import Supervisor


class Heartbeat(Protocol):
    """What ``watch`` needs of the compute (LocalCompute, RayCompute): returns or raises when lost."""

    async def watch(self) -> None: ...


class Control:
    """Stop requests, attempts and heartbeat of one run. ``restarts``: how many times a lost Ray
    node or actor restarts the run from its newest checkpoint (``ray.restart_on_node_loss``)."""

    def __init__(self, restarts: int) -> None:
        self.restarts = restarts
        self.stop_reason: str | None = None  # request_stop(): checkpoint and return early
        self.stop: asyncio.Event | None = None  # set on a stop request; the attempt's (begin())
        self.main: asyncio.Task | None = None  # the attempt's task: a second request cancels it
        self.lost: BaseException | None = None  # what the heartbeat found lost (Ray node or actor)
        self.supervisor: Supervisor | None = None  # made by run()

    def request_stop(self, reason: str = "stop requested") -> None:
        """Stop gracefully (``agentrl run`` calls this on SIGTERM): at the end of the current step, or
        at once while waiting for rollouts, checkpoint (in-flight prompts requeued) and return with
        ``summary["stopped"]``; ``--resume`` continues exactly once. A second request cancels the run
        at once (cleanup still runs). Call from the run's event loop."""
        if self.stop_reason is not None and self.main is not None:
            self.main.cancel()
            return
        self.stop_reason = reason
        if self.stop is not None:
            self.stop.set()

    def begin(self) -> asyncio.Event:
        """An attempt starts in the current task: its stop event (set already if a stop was asked)."""
        self.main = asyncio.current_task()
        self.stop = asyncio.Event()
        if self.stop_reason is not None:
            self.stop.set()
        return self.stop

    async def run(self, attempt: Callable[[int], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """``attempt(n)`` under a Supervisor until one returns (a lost node restarts it, ``n`` > 0)."""
        import torch

        before = torch.get_num_threads()
        self.supervisor = Supervisor(self.restarts, note=print)
        try:
            return await self.supervisor.run(lambda n: self._attempt(n, attempt))
        finally:
            if torch.get_num_threads() != before:  # engine.cpu_threads held for this run only
                torch.set_num_threads(before)

    async def _attempt(self, n: int, attempt: Callable[[int], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        try:
            return await attempt(n)
        except asyncio.CancelledError:
            if self.lost is None:
                raise
            me = asyncio.current_task()
            assert me is not None  # awaited in a task
            me.uncancel()  # cancelled by the heartbeat, not by the caller
            raise self.lost from None

    def restarted(self) -> None:
        """A later attempt starts: what the last one lost is forgotten."""
        self.lost = None

    def stepped(self, step: int) -> None:
        """After each finished step: the Supervisor closes an open recovery."""
        assert self.supervisor is not None, "stepped() outside run()"
        self.supervisor.stepped(step)

    def recoveries(self) -> list[dict[str, Any]]:
        """The run's recoveries after lost nodes, as the summary writes them."""
        return [r.as_dict() for r in self.supervisor.recoveries] if self.supervisor is not None else []

    def watch(self, compute: Heartbeat) -> asyncio.Task:
        """The compute's heartbeat: a lost node or actor cancels this attempt, which ends as that error."""
        main = asyncio.current_task()
        assert main is not None, "watch() is called from the attempt's task"

        async def beat() -> None:
            try:
                await compute.watch()
            except Exception as e:
                self.lost = e
                main.cancel()

        return asyncio.create_task(beat())
