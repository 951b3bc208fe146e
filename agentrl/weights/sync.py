"""Weight sync: moving the trainer's new weights into the rollout engine, one interface, four paths.

Owns the :class:`WeightSync` seam (``await push(state_dict, version) -> SyncStats``, ``close()``) and
its implementations, chosen by ``engine.weight_sync`` (:func:`make_weight_sync`):

- :class:`InProcessSync` -- the local engine: ``engine.update_weights`` copies tensors in place.
- :class:`DiskSync` -- SGLang: safetensors + the model's config/tokenizer files written atomically to
  a fresh directory, then ``/update_weights_from_disk`` on every server. Works across machines that
  share the directory; the directory is also what a restarted server reloads (``note_weights``).
- :class:`TensorSync` -- SGLang colocated: ``/update_weights_from_tensor``. SGLang unpickles each
  payload with a restricted unpickler (``MultiprocessingSerializer``, base64 over HTTP). CUDA
  tensors go by CUDA IPC handles (torch's ``ForkingPickler`` reductions: zero copy, same machine).
  CPU tensors go in-band (the plain pickle reduction: ``_rebuild_tensor_v2`` over
  ``torch.storage._load_from_bytes``, which that unpickler allows): torch's CPU sharing does not
  fit -- the ``file_descriptor`` strategy hands fds over a socket authenticated with the sending
  process tree's authkey, which the server does not share, and the ``file_system`` strategy was
  measured to leave every pushed tensor behind in /dev/shm (the server never drops its last
  reference) plus a ``torch_shm_manager`` daemon.
- :class:`agentrl.weights.distributed.DistributedSync` -- ``/init_weights_update_group`` once (trainer = rank 0 of a separate
  process group, servers ranks 1..), then per push buckets of flattened tensors, each announced by
  ``/update_weights_from_distributed`` (``load_format="flattened_bucket"``) and sent with a
  broadcast. NCCL on GPUs; the gloo backend also works on CPU (SGLang's request has ``backend``).

Every SGLang path pauses generation (SGLangEngine.pause: running requests are retracted and
continue after resume, recomputed with the new weights), updates every server with
``weight_version=str(version)`` and a cache flush (so no output after the push comes from K/V of
the old weights), sets the engine's policy version, then resumes. Does not gather weights from the
trainer (``Trainer.full_state_dict``) nor decide when to sync (the runner).
"""
from __future__ import annotations

import abc
import asyncio
import base64
import io
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.errors import EngineError

#: files of a model directory that are weights (never copied next to the new weights)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")


@dataclass
class SyncStats:
    """One push: its wall seconds, the weight bytes moved, the path, and phase timings."""

    path: str
    version: int
    seconds: float
    bytes: int
    phases: dict[str, float] = field(default_factory=dict)


def _tensors(state_dict: Mapping[str, Any]) -> list[tuple[str, Any]]:
    import torch

    if not state_dict:
        raise EngineError("weight sync: the state dict is empty")
    out = []
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor):
            raise EngineError(f"weight sync: {name!r} is a {type(t).__name__}, not a tensor")
        out.append((str(name), t.detach()))
    return out


def _nbytes(named: list[tuple[str, Any]]) -> int:
    return sum(t.numel() * t.element_size() for _, t in named)


def _buckets(named: list[tuple[str, Any]], bucket_bytes: int) -> list[list[tuple[str, Any]]]:
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


class InProcessSync(WeightSync):
    """The local engine: tensors are copied into the model in place (``LocalEngine.update_weights``)."""

    name = "inprocess"

    async def push(self, state_dict: Mapping[str, Any], version: int) -> SyncStats:
        named = _tensors(state_dict)
        t0 = time.perf_counter()
        await self.engine.update_weights(dict(named), version)
        return SyncStats(self.name, version, time.perf_counter() - t0, _nbytes(named))


class _ServerSync(WeightSync):
    """Shared by the SGLang paths: the engine must offer ``urls``, ``post_all``, ``pause``,
    ``resume`` and ``set_policy_version`` (SGLangEngine's API)."""

    async def push(self, state_dict: Mapping[str, Any], version: int) -> SyncStats:
        if not isinstance(version, int) or version < 0:
            raise EngineError(f"weight sync: version must be an int >= 0, got {version!r}")
        named = _tensors(state_dict)
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
        return SyncStats(self.name, version, time.perf_counter() - t0, _nbytes(named), phases)

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


class DiskSync(_ServerSync):
    """Safetensors in a fresh directory under ``dir`` (default: a temp dir per engine), loaded by
    every server with ``/update_weights_from_disk``. ``model_path``: the HF dir whose config and
    tokenizer files are copied beside the weights (default: the first server's ``model_path``).
    ``keep``: how many newest weight dirs to keep (the newest is what a restarted server reloads)."""

    name = "disk"

    def __init__(self, engine: Any, dir: str | Path | None = None, *, model_path: str | Path | None = None,
                 keep: int = 1) -> None:
        super().__init__(engine)
        if keep < 1:
            raise EngineError(f"DiskSync keep must be >= 1, got {keep}")
        self._own_dir = dir is None
        if dir is None:  # one dir per engine: a DiskSync made per push (Engine.update_weights) still
            # replaces the previous version's files instead of piling them up
            dir = Path(tempfile.gettempdir()) / f"agentrl-weights-{os.getpid()}-{id(engine):x}"
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model_path = Path(model_path) if model_path is not None else None
        self.keep = keep
        self._pending: Path | None = None

    async def _model_path(self) -> Path:
        if self.model_path is None:
            import httpx

            url = self.engine.urls[0]
            try:
                async with httpx.AsyncClient(timeout=30.0) as c:
                    r = await c.get(url + "/server_info")
                    r.raise_for_status()
                    self.model_path = Path(r.json()["model_path"])
            except (httpx.HTTPError, KeyError, ValueError) as e:
                raise EngineError(f"DiskSync: cannot learn the model path from {url}/server_info "
                                  f"({type(e).__name__}: {e}); pass model_path=") from e
        if not (self.model_path / "config.json").is_file():
            raise EngineError(f"DiskSync: model_path {self.model_path} has no config.json to copy beside the weights")
        return self.model_path

    def _write(self, named: list, version: int, src: Path) -> Path:
        from safetensors.torch import save_file

        final = self.dir / f"v{version:08d}"
        tmp = self.dir / f".v{version:08d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for f in src.iterdir():
            if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES):
                shutil.copy2(f, tmp / f.name)
        seen: set[int] = set()
        tensors = {}
        for name, t in named:  # safetensors refuses tensors sharing storage (tied embeddings)
            t = t.to("cpu").contiguous()
            ptr = t.untyped_storage().data_ptr()
            tensors[name] = t.clone() if ptr in seen else t
            seen.add(ptr)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "agentrl_version": str(version)})
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)  # atomic: a server never sees half a directory
        return final

    async def _prepare(self, named: list, version: int, phases: dict[str, float]) -> None:
        src = await self._model_path()
        t0 = time.perf_counter()
        self._pending = await asyncio.to_thread(self._write, named, version, src)
        phases["write_s"] = time.perf_counter() - t0

    async def _load(self, named: list, version: int, phases: dict[str, float]) -> None:
        assert self._pending is not None
        await self.engine.post_all("/update_weights_from_disk", {
            "model_path": str(self._pending), "weight_version": str(version), "flush_cache": True})
        note = getattr(self.engine, "note_weights", None)
        if note is not None:  # a restarted server reloads this directory
            note(self._pending, version)

    async def _after(self, version: int) -> None:
        dirs = sorted(p for p in self.dir.glob("v*") if p.is_dir())
        for old in dirs[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    async def close(self) -> None:
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


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


class TensorSync(_ServerSync):
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
            lambda: [serialize_named_tensors(b) for b in _buckets(named, self.bucket_bytes)])
        phases["serialize_s"] = time.perf_counter() - t0

    async def _load(self, named: list, version: int, phases: dict[str, float]) -> None:
        payloads, self._payloads = self._payloads, []

        async def calls() -> None:
            for i, p in enumerate(payloads):
                last = i == len(payloads) - 1
                await self.engine.post_all("/update_weights_from_tensor", {
                    "serialized_named_tensors": [p] * self.tp_size, "flush_cache": last,
                    "weight_version": str(version) if last else None})

        await self._session(calls)


#: engine.weight_sync values -> (which engine kinds they fit)
SYNC_KINDS = {"inprocess": ("local",), "disk": ("sglang",), "tensor": ("sglang",), "distributed": ("sglang",)}


def resolve_sync_kind(weight_sync: str, engine_kind: str, device: str = "cpu") -> str:
    """``auto`` -> inprocess for the local engine, disk for SGLang on CPU, distributed (NCCL) for SGLang
    on GPUs. Raises ConfigError naming the bad combination."""
    from agentrl.errors import ConfigError

    if weight_sync == "auto":
        if engine_kind == "local":
            return "inprocess"
        return "disk" if device == "cpu" else "distributed"
    if weight_sync not in SYNC_KINDS:
        raise ConfigError(f"engine.weight_sync: {weight_sync!r} is not one of {['auto', *SYNC_KINDS]}")
    if engine_kind not in SYNC_KINDS[weight_sync]:
        raise ConfigError(f"engine.weight_sync: {weight_sync!r} does not work with engine.kind={engine_kind!r} "
                          f"(it needs engine.kind in {list(SYNC_KINDS[weight_sync])})")
    return weight_sync


def make_weight_sync(kind: str, engine: Any, **kwargs: Any) -> WeightSync:
    """The sync named ``kind`` (resolved, not ``auto``) for ``engine``; ``kwargs`` go to its class."""
    from agentrl.weights.distributed import DistributedSync

    classes = {"inprocess": InProcessSync, "disk": DiskSync, "tensor": TensorSync, "distributed": DistributedSync}
    if kind not in classes:
        raise EngineError(f"unknown weight sync {kind!r}; known: {sorted(classes)}")
    return classes[kind](engine, **kwargs)
