"""The object-store weight sync: new weights reach SGLang servers on other nodes without a shared
filesystem.

Owns :class:`ObjectStoreSync` (``engine.weight_sync=object_store``) and :func:`stage_weights_dir`,
what runs on each node. A push puts the state dict in Ray's object store once (``ray.put`` in the
driver); one *stager* per node (with ``distributed: ray``: an SGLang engine actor, through its
driver-side ``ActorServer``) fetches it - Ray moves the bytes node to node - and writes the HF
weights directory (safetensors + the model's config/tokenizer files) under the same node-local path
on its own disk; then every server loads that path with ``/update_weights_from_disk``, as in the disk
path (the same directory format, ``agentrl.engine.sglang.disk``), so a restarted server reloads its
node's newest copy. Staging needs no pause; only the load does.

A stager is any object with ``node`` (its node id: one stager per node writes) and
``stage_weights(state_dict_or_ref, version, parent, keep) -> str`` (blocking; returns the written
directory). ``ObjectStoreSync`` takes them as ``stagers=`` or from the engine's ``weight_stagers``
attribute (``agentrl.distributed.compute`` sets it on the driver's SGLangEngine). Does not place
actors or gather weights from the trainer; ``disk`` stays the path for a declared shared filesystem.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.engine.sglang.disk import load_weights_dir, prune_weights_dirs, write_weights_dir
from agentrl.errors import EngineError
from agentrl.weights.base import ServerSync


def default_stage_dir() -> str:
    """A node-local parent directory, the same string on every node (each node has its own copy)."""
    return str(Path(tempfile.gettempdir()) / f"agentrl-weights-objstore-{uuid.uuid4().hex[:12]}")


def stage_weights_dir(
    named: list[tuple[str, Any]], version: int, src: str | Path, parent: str | Path, keep: int = 1
) -> Path:
    """On this node: write ``parent/v<version:08d>`` (``write_weights_dir`` format, config files from
    ``src``) through a private temp parent, so several stagers on one disk (one machine simulating
    several nodes, or two servers per node) never see or clobber each other's half-written files;
    a directory another stager finished first is kept. Keeps the ``keep`` newest versions."""
    parent = Path(parent)
    private = parent / f".stage-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        written = write_weights_dir(named, version, Path(src), private)
        final = parent / written.name
        try:
            written.rename(final)
        except OSError:
            if not (final / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(private, ignore_errors=True)
    prune_weights_dirs(parent, keep)
    return final


def one_per_node(stagers: Sequence[Any]) -> list[Any]:
    """The first stager of each node, in order (``node`` None: each counts as its own node)."""
    seen: set[str] = set()
    out = []
    for s in stagers:
        node = getattr(s, "node", None)
        if node is None or node not in seen:
            out.append(s)
            if node is not None:
                seen.add(node)
    return out


class ObjectStoreSync(ServerSync):
    """``ray.put`` once, one stager per node writes the weights to its local ``dir``, every server
    loads ``dir/v<version>``. ``dir``: the node-local parent (default: a fresh temp path, the same
    string on every node); ``keep``: newest versions kept per node."""

    name = "object_store"

    def __init__(
        self, engine: Any, dir: str | Path | None = None, *, stagers: Sequence[Any] | None = None, keep: int = 1
    ) -> None:
        super().__init__(engine)
        if keep < 1:
            raise EngineError(f"ObjectStoreSync keep must be >= 1, got {keep}")
        found = stagers if stagers is not None else getattr(engine, "weight_stagers", None)
        if not found:
            raise EngineError(
                "ObjectStoreSync: the engine has no weight_stagers (one per server, able to write on "
                "its node): engine.weight_sync=object_store needs distributed=ray with "
                "engine.kind=sglang engine actors; attached servers (engine.urls) need disk on a "
                "shared filesystem"
            )
        bad = [type(s).__name__ for s in found if not callable(getattr(s, "stage_weights", None))]
        if bad:
            raise EngineError(f"ObjectStoreSync: stagers without a stage_weights method: {bad}")
        self.stagers = list(found)
        self.dir = str(dir) if dir is not None else default_stage_dir()
        self.keep = keep
        self._path: str | None = None

    async def _prepare(self, named: list, version: int, phases: dict[str, float]) -> None:
        import ray

        t0 = time.perf_counter()
        ref = ray.put(dict(named))  # one copy; each node's stager pulls it through the object store
        phases["put_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        writers = one_per_node(self.stagers)
        paths = await asyncio.gather(
            *(asyncio.to_thread(s.stage_weights, ref, version, self.dir, self.keep) for s in writers)
        )
        if len(set(paths)) != 1:
            raise EngineError(
                f"ObjectStoreSync: stagers wrote different paths {sorted(set(paths))}; every node "
                "must write the same node-local path"
            )
        self._path = paths[0]
        phases["stage_s"] = time.perf_counter() - t1
        phases["nodes"] = float(len(writers))

    async def _load(self, named: list, version: int, phases: dict[str, float]) -> None:
        assert self._path is not None
        await load_weights_dir(self.engine, Path(self._path), version)
