"""The trainer seam: what a run asks of its trainer, whichever process holds it.

Owns :class:`TrainerProtocol`: the policy ``version`` and the methods the run loop
(``agentrl.jobs.run``), its checkpoints and its weight pushes call. The in-process
``agentrl.trainer.trainer.Trainer`` has them; the Ray driver's ``agentrl.distributed.adapters.RayTrainer``
declares them over its ranks. Sits in the trainer's layer so both sides import it without an upward import.
Does not train (``agentrl.trainer.trainer``) or say where training runs (the compute: ``agentrl.distributed``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # typing only: packing imports torch
    from agentrl.trainer.packing import TrainSample


class TrainerProtocol(Protocol):
    """A trainer as the run drives it. ``version``: the policy version of its current weights (one
    more per ``train_step``, restored by ``load``)."""

    version: int

    def train_step(self, samples: list[TrainSample], interrupt: threading.Event | None = None) -> dict[str, float]:
        """One policy version from ``samples``; the step's metrics. ``interrupt`` set: the step may stop
        at its next micro-batch (``StepInterrupted``, nothing trained)."""
        ...

    def values(self, samples: list[TrainSample]) -> list[list[float]]:
        """The critic's per-token values."""
        ...

    def logprobs(self, samples: list[TrainSample]) -> list[list[float]]:
        """The policy's per-token log-probabilities."""
        ...

    def ref_logprobs(self, samples: list[TrainSample]) -> list[list[float]]:
        """The frozen reference model's per-token log-probabilities."""
        ...

    def full_state_dict(self) -> dict[str, Any]:
        """The gathered weights (what a weight push sends to the engine)."""
        ...

    def save(self, path: str | Path, *, extra: dict | None = None, files: dict[str, str] | None = None) -> None:
        """A checkpoint at ``path`` with the run's ``extra`` state and extra ``files`` (name -> text)."""
        ...

    def load(self, path: str | Path) -> dict:
        """Restore a checkpoint; its ``extra`` state."""
        ...

    def close(self) -> None:
        """Release the process group (safe to call twice)."""
        ...
