"""The WeightSync seam: moving the trainer's new weights into the rollout engine.

Owns the interface (:class:`WeightSync`: ``await push(state_dict, version) -> SyncStats``,
``close()``), its record (:class:`SyncStats`), :class:`ServerSync` -- the push skeleton every SGLang
path shares -- and the helpers the paths share (:func:`tensor_bytes`, :func:`buckets`; the state-dict
check is the engine seam's :func:`agentrl.engine.base.named_tensors`).

The paths, one module each: ``inprocess`` (the local engine), ``disk``, ``tensor`` and
``distributed`` (SGLang); ``factory`` picks one from ``engine.weight_sync``; ``fake`` holds stand-ins
for tests; ``drain`` gates generation around a push (``partial_rollouts=false``).

Every SGLang path (:class:`ServerSync`) prepares what needs no pause (serializing, writing files),
then pauses generation (SGLangEngine.pause: running requests are retracted and continue after
resume, recomputed with the new weights), updates every server with ``weight_version=str(version)``
and a cache flush (so no output after the push comes from K/V of the old weights), sets the
engine's policy version, then resumes -- always, also after a failed load. Does not gather weights
from the trainer (``Trainer.full_state_dict``) nor decide when to sync (the runner).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl.engine.base import named_tensors
from agentrl.errors import EngineError


@dataclass
class SyncStats:
    """One push: its wall seconds, the weight bytes moved, the path, and phase timings."""

    path: str
    version: int
    seconds: float
    bytes: int
    phases: dict[str, float] = field(default_factory=dict)


def tensor_bytes(named: list[tuple[str, Any]]) -> int:
    """Bytes of the tensors in ``named`` (``(name, tensor)`` pairs)."""
    return sum(t.numel() * t.element_size() for _, t in named)


def buckets(named: list[tuple[str, Any]], bucket_bytes: int) -> list[list[tuple[str, Any]]]:
    """Consecutive groups of at most ``bucket_bytes`` (a larger tensor is a bucket of its own)."""
    out: list[list[tuple[str, Any]]] = [[]]
    size = 0
    for name, t in named:
        n = t.numel() * t.element_size()
        if out[-1] and size + n > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append((name, t))
        size += n
    return out


class WeightSync(abc.ABC):
    """Pushes new weights into an engine and makes it stamp tokens with the new version."""

    name: str = ""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @abc.abstractmethod
    async def push(self, state_dict: Mapping[str, Any], version: int) -> SyncStats:
        """Load ``state_dict`` (HF names -> tensors) into the engine; tokens sampled afterwards are
        stamped ``version``. Raises EngineError (naming the server and its message) on failure."""

    async def close(self) -> None:
        """Release what the sync holds (process groups, temp dirs it owns). Idempotent."""


class ServerSync(WeightSync):
    """Shared by the SGLang paths: the engine must offer ``urls``, ``post_all``, ``pause``,
    ``resume`` and ``set_policy_version`` (SGLangEngine's API; ``agentrl.weights.fake`` has a
    stand-in). Subclasses fill :meth:`_prepare`, :meth:`_load` and :meth:`_after`."""

    async def push(self, state_dict: Mapping[str, Any], version: int) -> SyncStats:
        if not isinstance(version, int) or version < 0:
            raise EngineError(f"weight sync: version must be an int >= 0, got {version!r}")
        named = named_tensors(state_dict)
        phases: dict[str, float] = {}
        t0 = time.perf_counter()
        await self._prepare(named, version, phases)
        t1 = time.perf_counter()
        await self.engine.pause()
        phases["pause_s"] = time.perf_counter() - t1
        try:
            t2 = time.perf_counter()
            await self._load(named, version, phases)
            phases["load_s"] = time.perf_counter() - t2
            self.engine.set_policy_version(version)
        finally:
            t3 = time.perf_counter()
            await self.engine.resume()  # also tells every server the (new) version
            phases["resume_s"] = time.perf_counter() - t3
        await self._after(version)
        return SyncStats(self.name, version, time.perf_counter() - t0, tensor_bytes(named), phases)

    async def _prepare(self, named: list, version: int, phases: dict[str, float]) -> None:
        """Work that does not need generation paused (serializing, writing files)."""

    @abc.abstractmethod
    async def _load(self, named: list, version: int, phases: dict[str, float]) -> None:
        """Make every server load the weights (generation is paused)."""

    async def _after(self, version: int) -> None:
        """Clean-up once the servers serve ``version``."""

    async def _session(self, calls) -> None:
        """Run ``calls`` (an async callable) inside SGLang's begin/end weight-update session."""
        await self.engine.post_all("/begin_weight_update", {})
        try:
            await calls()
        finally:
            await self.engine.post_all("/end_weight_update", {})
