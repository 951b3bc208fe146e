"""Moving the trainer's new weights into the rollout engine: the WeightSync seam (``base``), one
module per path (``inprocess``, ``disk``, ``tensor``, ``distributed``), the choice from the config
(``factory``), stand-ins for tests (``fake``, not re-exported), and drained updates (``drain``:
every turn sampled by one policy version). Re-exports the public names."""

from agentrl.weights.base import ServerSync, SyncStats, WeightSync, buckets, tensor_bytes
from agentrl.weights.disk import DiskSync
from agentrl.weights.distributed import DistributedSync, WeightGroup
from agentrl.weights.drain import DrainEngine, drained_together, weight_update_gate, with_partial_rollouts
from agentrl.weights.factory import SYNC_KINDS, make_weight_sync, resolve_sync_kind
from agentrl.weights.inprocess import InProcessSync
from agentrl.weights.tensor import TensorSync, serialize_named_tensors

__all__ = [
    "SYNC_KINDS",
    "DiskSync",
    "DistributedSync",
    "DrainEngine",
    "InProcessSync",
    "ServerSync",
    "SyncStats",
    "TensorSync",
    "WeightGroup",
    "WeightSync",
    "buckets",
    "drained_together",
    "make_weight_sync",
    "resolve_sync_kind",
    "serialize_named_tensors",
    "tensor_bytes",
    "weight_update_gate",
    "with_partial_rollouts",
]
