"""The in-process weight sync: the local engine copies the new tensors into its model in place.

Owns :class:`InProcessSync` (``engine.weight_sync=inprocess``, the ``auto`` choice for
``engine.kind=local``). The copy itself, and the check of names and shapes against the model, are
``LocalEngine.update_weights``'s; this path only times it. Does not serve SGLang (``disk``,
``tensor``, ``distributed``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from agentrl.engine.base import named_tensors
from agentrl.weights.base import SyncStats, WeightSync, tensor_bytes


class InProcessSync(WeightSync):
    """The local engine: tensors are copied into the model in place (``LocalEngine.update_weights``)."""

    name = "inprocess"

    async def push(self, state_dict: Mapping[str, Any], version: int) -> SyncStats:
        named = named_tensors(state_dict)
        t0 = time.perf_counter()
        await self.engine.update_weights(dict(named), version)
        return SyncStats(self.name, version, time.perf_counter() - t0, tensor_bytes(named))
