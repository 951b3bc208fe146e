"""Choosing a weight-sync path from the config: ``engine.weight_sync`` x ``engine.kind`` -> a WeightSync.

Owns :data:`SYNC_KINDS` (which engine kinds each path fits), :func:`resolve_sync_kind` (``auto`` and
bad combinations) and :func:`make_weight_sync` (the class for a resolved kind). Does not read the
config tree (``agentrl.jobs.build`` passes the fields) nor implement a path (one module each).
"""

from __future__ import annotations

from typing import Any

from agentrl.errors import ConfigError, EngineError
from agentrl.weights.base import WeightSync
from agentrl.weights.disk import DiskSync
from agentrl.weights.distributed import DistributedSync
from agentrl.weights.inprocess import InProcessSync
from agentrl.weights.object_store import ObjectStoreSync
from agentrl.weights.tensor import TensorSync

#: engine.weight_sync values -> (which engine kinds they fit)
SYNC_KINDS = {
    "inprocess": ("local",),
    "disk": ("sglang",),
    "tensor": ("sglang",),
    "distributed": ("sglang",),
    "object_store": ("sglang",),
}

#: the class of each resolved kind
SYNC_CLASSES: dict[str, type[WeightSync]] = {
    "inprocess": InProcessSync,
    "disk": DiskSync,
    "tensor": TensorSync,
    "distributed": DistributedSync,
    "object_store": ObjectStoreSync,
}


def resolve_sync_kind(weight_sync: str, engine_kind: str, device: str = "cpu") -> str:
    """``auto`` -> inprocess for the local engine, disk for SGLang on CPU, distributed (NCCL) for SGLang
    on GPUs. Raises ConfigError naming the bad combination."""
    if weight_sync == "auto":
        if engine_kind == "local":
            return "inprocess"
        return "disk" if device == "cpu" else "distributed"
    if weight_sync not in SYNC_KINDS:
        raise ConfigError(f"engine.weight_sync: {weight_sync!r} is not one of {['auto', *SYNC_KINDS]}")
    if engine_kind not in SYNC_KINDS[weight_sync]:
        raise ConfigError(
            f"engine.weight_sync: {weight_sync!r} does not work with engine.kind={engine_kind!r} "
            f"(it needs engine.kind in {list(SYNC_KINDS[weight_sync])})"
        )
    return weight_sync


def make_weight_sync(kind: str, engine: Any, **kwargs: Any) -> WeightSync:
    """The sync named ``kind`` (resolved, not ``auto``) for ``engine``; ``kwargs`` go to its class."""
    if kind not in SYNC_CLASSES:
        raise EngineError(f"unknown weight sync {kind!r}; known: {sorted(SYNC_CLASSES)}")
    return SYNC_CLASSES[kind](engine, **kwargs)
