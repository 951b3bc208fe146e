"""How one ``agentrl run`` is driven from outside its step loop (a mixin of ``Runner``).

Owns: ``run`` (the attempts under a :class:`~agentrl.distributed.recovery.Supervisor`, torch's thread
count restored afterwards), ``_attempt`` (a later attempt, after a lost Ray node, resumes from the
newest checkpoint exactly once: ``_restart_state``), ``_watch`` (the backend's heartbeat: a lost node
or actor cancels the attempt, which ends as that error) and ``request_stop`` (a graceful stop:
checkpoint and return at the end of the current step; a second request cancels at once). Does not
run steps (``agentrl.jobs.run``) or build pieces (``agentrl.jobs.run.parts``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentrl.batches.ledger import rewind
from agentrl.batches.prompt_stream import PromptStream


class RunControl:
    """Attempts, heartbeat and graceful stop of ``Runner`` (uses ``cfg``, ``backend``, ``_run``,
    ``_latest_checkpoint``; sets ``stop_reason``, ``lost``, ``supervisor``)."""

    def request_stop(self, reason: str = "stop requested") -> None:
        """Stop gracefully (``agentrl run`` calls this on SIGTERM): at the end of the current step, or
        at once while waiting for rollouts, checkpoint (in-flight prompts requeued) and return with
        ``summary["stopped"]``; ``--resume`` continues exactly once. A second request cancels the run
        at once (cleanup still runs). Call from the run's event loop."""
        if self.stop_reason is not None and self._main is not None:
            self._main.cancel()
            return
        self.stop_reason = reason
        if self._stop is not None:
            self._stop.set()

    async def run(self) -> dict[str, Any]:
        import torch

        from agentrl.distributed.recovery import Supervisor

        before = torch.get_num_threads()
        restarts = self.cfg.ray.restart_on_node_loss if self.cfg.distributed == "ray" else 0
        self.supervisor = Supervisor(restarts, note=print)
        try:
            return await self.supervisor.run(self._attempt)
        finally:
            if torch.get_num_threads() != before:  # engine.cpu_threads held for this run only
                torch.set_num_threads(before)

    async def _attempt(self, n: int) -> dict[str, Any]:
        """Attempt ``n`` of the run; after a lost Ray node (n > 0) it resumes from the newest
        checkpoint, exactly once, on the actors placed again (``ray.restart_on_node_loss``)."""
        if n:
            self._restart_state()
        try:
            return await self._run()
        except asyncio.CancelledError:
            if self.lost is None:
                raise
            asyncio.current_task().uncancel()  # cancelled by the heartbeat, not by the caller
            raise self.lost from None

    def _restart_state(self) -> None:
        ckpt = self._latest_checkpoint()
        if ckpt is None:
            rewind(self.run_dir, 0)  # nothing to resume from: the attempt starts over, its logs too
        keep = int(ckpt.name.rsplit("_", 1)[-1]) if ckpt is not None else 0
        self.cfg.train.resume = True
        self.step, self.stream, self.in_flight, self.restored, self.restored_counts = 0, PromptStream(), {}, [], {}
        self.replay, self.paused, self.lost = None, None, None
        self.history = [r for r in self.history if r["step"] <= keep]

    def _watch(self) -> asyncio.Task:
        """The backend's heartbeat: a lost node or actor cancels this attempt, which ends as that error."""
        main = asyncio.current_task()

        async def beat() -> None:
            try:
                await self.backend.watch()
            except Exception as e:
                self.lost = e
                main.cancel()

        return asyncio.create_task(beat())
