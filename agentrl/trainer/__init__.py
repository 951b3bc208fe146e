"""The FSDP2 trainer: packed micro-batches, algorithm-blind loss, 1..N processes, checkpoints.

Public API::

    from agentrl.trainer import Trainer, TrainerConfig, TrainSample, MicroBatch, pack, pad

Modules: ``config`` (TrainerConfig), ``packing`` (samples -> micro-batches), ``attention`` (the
varlen_sdpa backend for packed rows), ``models`` (loading, FSDP2 sharding, per-token forwards),
``dist`` (process group, rank slices, collectives), ``checkpoint`` (HF export, save/load),
``trainer`` (the Trainer), ``protocol`` (TrainerProtocol: what a run asks of a trainer, local or Ray).
Losses live in ``agentrl.algos``; advantages are computed by the run loop.
Names are loaded lazily so that ``agentrl.config.schema`` can import TrainerConfig without torch.
"""

from agentrl.trainer.config import TrainerConfig

_LAZY = {"MicroBatch": "packing", "TrainSample": "packing", "pack": "packing", "pad": "packing", "Trainer": "trainer"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"agentrl.trainer.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'agentrl.trainer' has no attribute {name!r}")


__all__ = ["MicroBatch", "TrainSample", "Trainer", "TrainerConfig", "pack", "pad"]
