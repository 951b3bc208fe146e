"""The disk weight sync: SGLang servers load a fresh HF directory with ``/update_weights_from_disk``.

Owns :class:`DiskSync` (``engine.weight_sync=disk``, the ``auto`` choice for SGLang on CPU): where
the directories go, how many are kept, and the push's phases. The directory format (safetensors +
the model's config/tokenizer files, written atomically) is the engine's,
``agentrl.engine.sglang.disk``. Works across machines that share the directory; the newest directory
is also what a restarted server reloads (``note_weights``). Does not decide when to push.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

from agentrl.engine.sglang.disk import (
    check_model_dir,
    default_weights_dir,
    load_weights_dir,
    prune_weights_dirs,
    server_model_path,
    write_weights_dir,
)
from agentrl.errors import EngineError
from agentrl.weights.base import ServerSync


class DiskSync(ServerSync):
    """Safetensors in a fresh directory under ``dir`` (default: a temp dir per engine), loaded by
    every server with ``/update_weights_from_disk``. ``model_path``: the HF dir whose config and
    tokenizer files are copied beside the weights (default: the first server's ``model_path``).
    ``keep``: how many newest weight dirs to keep (the newest is what a restarted server reloads)."""

    name = "disk"

    def __init__(
        self, engine: Any, dir: str | Path | None = None, *, model_path: str | Path | None = None, keep: int = 1
    ) -> None:
        super().__init__(engine)
        if keep < 1:
            raise EngineError(f"DiskSync keep must be >= 1, got {keep}")
        self._own_dir = dir is None
        self.dir = Path(dir) if dir is not None else default_weights_dir(engine)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model_path = Path(model_path) if model_path is not None else None
        self.keep = keep
        self._pending: Path | None = None

    async def _model_path(self) -> Path:
        if self.model_path is None:
            self.model_path = await server_model_path(self.engine.urls[0], "DiskSync", "; pass model_path=")
        return check_model_dir(self.model_path, "DiskSync")

    async def _prepare(self, named: list, version: int, phases: dict[str, float]) -> None:
        src = await self._model_path()
        t0 = time.perf_counter()
        self._pending = await asyncio.to_thread(write_weights_dir, named, version, src, self.dir)
        phases["write_s"] = time.perf_counter() - t0

    async def _load(self, named: list, version: int, phases: dict[str, float]) -> None:
        assert self._pending is not None
        await load_weights_dir(self.engine, self._pending, version)

    async def _after(self, version: int) -> None:
        prune_weights_dirs(self.dir, self.keep)

    async def close(self) -> None:
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
