"""The tensor weight sync: ``/update_weights_from_tensor`` on SGLang servers on this machine.

Owns :class:`TensorSync` (``engine.weight_sync=tensor``) and :func:`serialize_named_tensors`, the
payload format. SGLang unpickles each payload with a restricted unpickler
(``MultiprocessingSerializer``, base64 over HTTP). CUDA tensors go by CUDA IPC handles (torch's
``ForkingPickler`` reductions: zero copy, same machine). CPU tensors go in-band (the plain pickle
reduction: ``_rebuild_tensor_v2`` over ``torch.storage._load_from_bytes``, which that unpickler
allows): torch's CPU sharing does not fit -- the ``file_descriptor`` strategy hands fds over a
socket authenticated with the sending process tree's authkey, which the server does not share, and
the ``file_system`` strategy was measured to leave every pushed tensor behind in /dev/shm (the
server never drops its last reference) plus a ``torch_shm_manager`` daemon. Does not reach servers
on other machines (``disk``, ``distributed``).
"""

from __future__ import annotations

import asyncio
import base64
import io
import pickle
import time
from typing import Any

from agentrl.errors import EngineError
from agentrl.weights.base import ServerSync, buckets


def serialize_named_tensors(named: list[tuple[str, Any]]) -> str:
    """One ``serialized_named_tensors`` entry for SGLang: base64 of a pickle its restricted
    unpickler accepts. CUDA tensors by IPC handle (ForkingPickler), CPU tensors in-band."""
    import torch

    if any(t.is_cuda for _, t in named):
        from multiprocessing.reduction import ForkingPickler

        import torch.multiprocessing  # registers torch's reductions with ForkingPickler

        buf = io.BytesIO()
        ForkingPickler(buf).dump([(n, t.contiguous()) for n, t in named])
        data = buf.getvalue()
    else:
        data = pickle.dumps([(n, t.contiguous().to(torch.device("cpu"))) for n, t in named], protocol=4)
    return base64.b64encode(data).decode("ascii")


class TensorSync(ServerSync):
    """``/update_weights_from_tensor`` on every server, ``bucket_bytes`` of tensors per call
    (colocated: CUDA tensors travel as IPC handles; CPU tensors in the request body, see the module
    docstring). ``tp_size``: the servers' tensor-parallel size (one payload per rank)."""

    name = "tensor"

    def __init__(self, engine: Any, *, bucket_bytes: int = 512 << 20, tp_size: int = 1) -> None:
        super().__init__(engine)
        if bucket_bytes < 1 or tp_size < 1:
            raise EngineError(f"TensorSync: bucket_bytes ({bucket_bytes}) and tp_size ({tp_size}) must be >= 1")
        self.bucket_bytes, self.tp_size = bucket_bytes, tp_size
        self._payloads: list[str] = []

    async def _prepare(self, named: list, version: int, phases: dict[str, float]) -> None:
        t0 = time.perf_counter()
        self._payloads = await asyncio.to_thread(
            lambda: [serialize_named_tensors(b) for b in buckets(named, self.bucket_bytes)]
        )
        phases["serialize_s"] = time.perf_counter() - t0

    async def _load(self, named: list, version: int, phases: dict[str, float]) -> None:
        payloads, self._payloads = self._payloads, []

        async def calls() -> None:
            for i, p in enumerate(payloads):
                last = i == len(payloads) - 1
                await self.engine.post_all(
                    "/update_weights_from_tensor",
                    {
                        "serialized_named_tensors": [p] * self.tp_size,
                        "flush_cache": last,
                        "weight_version": str(version) if last else None,
                    },
                )

        await self._session(calls)
