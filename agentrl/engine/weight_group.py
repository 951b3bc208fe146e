"""The trainer's side of the process group that broadcasts weights to SGLang servers.

Owns: creating a process group of its own (rank 0 = this process, hosting the TCP rendezvous; the
servers' ranks join through ``/init_weights_update_group``) WITHOUT touching the default process
group (the trainer may run FSDP in one), broadcasting a tensor from rank 0, and destroying the group.
SGLang builds its side with a ``PrefixStore(group_name)`` over the ``tcp://`` rendezvous store and
torch's process-group helper; this module does the same on rank 0 so both sides meet on the same
keys. That helper is a private torch API (``_new_process_group_helper``): it is the only way to make
a group that is not the default one and not a sub-group of it. Does not talk HTTP (the caller,
``agentrl.engine.weight_sync.DistributedSync``, announces each broadcast to the servers).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from agentrl.errors import EngineError


class WeightGroup:
    """Rank 0 of a ``world_size`` process group named ``group_name`` on ``backend`` (``nccl``
    or ``gloo``). :meth:`connect` blocks until every rank joined (run it while the servers join)."""

    def __init__(self, *, master_address: str, master_port: int, world_size: int, group_name: str,
                 backend: str = "nccl", timeout_s: float = 300.0) -> None:
        if backend not in ("nccl", "gloo"):
            raise EngineError(f"weight group backend must be 'nccl' or 'gloo', got {backend!r}")
        if world_size < 2:
            raise EngineError(f"weight group world_size must be >= 2 (trainer + servers), got {world_size}")
        self.master_address, self.master_port = master_address, master_port
        self.world_size, self.group_name, self.backend = world_size, group_name, backend
        self.timeout = timedelta(seconds=timeout_s)
        self.pg: Any = None

    def connect(self) -> None:
        from torch.distributed.distributed_c10d import PrefixStore, _new_process_group_helper, rendezvous

        try:
            store, _, _ = next(rendezvous(f"tcp://{self.master_address}:{self.master_port}", 0, self.world_size,
                                          timeout=self.timeout))
            store.set_timeout(self.timeout)
            self.pg, _ = _new_process_group_helper(self.world_size, 0, [], self.backend,
                                                   PrefixStore(self.group_name, store), group_name=self.group_name,
                                                   backend_options=None, timeout=self.timeout)
        except Exception as e:  # torch raises DistStoreError/RuntimeError with the reason
            raise EngineError(f"weight group {self.group_name!r} ({self.backend}, world {self.world_size}, "
                              f"{self.master_address}:{self.master_port}) failed to form: {type(e).__name__}: {e}") from e

    def broadcast(self, tensor: Any) -> None:
        """Send ``tensor`` from rank 0 to every rank; blocks until done."""
        import torch.distributed as dist

        if self.pg is None:
            raise EngineError(f"weight group {self.group_name!r} is not connected")
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        try:
            self.pg.broadcast([tensor], opts).wait()
        except Exception as e:
            raise EngineError(f"weight group {self.group_name!r}: broadcast failed: {type(e).__name__}: {e}") from e

    def destroy(self) -> None:
        import torch.distributed as dist

        pg, self.pg = self.pg, None
        if pg is None:
            return
        try:
            dist.destroy_process_group(pg)
        except Exception:  # not registered with the default world (no default group): shut it down
            try:
                pg.shutdown()
            except Exception:
                pass
