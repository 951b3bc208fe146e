"""SGLang weights on disk: the HF directory every server loads with ``/update_weights_from_disk``.

Owns the directory format and its life: :func:`write_weights_dir` (the new tensors as one
safetensors file beside the model's config and tokenizer files, in ``v<version>`` under a parent
directory, renamed into place atomically so a server never sees half of it), :func:`prune_weights_dirs`,
:func:`server_model_path` (where the config files come from when the caller does not say), and
:func:`load_from_disk`, what :meth:`SGLangEngine.update_weights` does: the Engine seam's in-place
update for SGLang (write to a per-engine temp dir, pause, load on every server, set the version,
resume, keep only the newest directory).

The weight-sync paths (``agentrl.weights``, one layer up) drive the engine from above and reuse the
format; this module does not know them. Does not gather weights from the trainer or decide when to
push.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.engine.base import named_tensors
from agentrl.errors import EngineError

#: files of a model directory that are weights (never copied next to the new weights)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")


def default_weights_dir(engine: Any) -> Path:
    """One temp directory per engine object and process: pushes made through fresh objects per
    push still replace the previous version's files instead of piling them up."""
    return Path(tempfile.gettempdir()) / f"agentrl-weights-{os.getpid()}-{id(engine):x}"


def check_model_dir(path: Path, who: str) -> Path:
    """``path`` if it holds a ``config.json``; else EngineError (prefixed ``who``) naming it."""
    if not (path / "config.json").is_file():
        raise EngineError(f"{who}: model_path {path} has no config.json to copy beside the weights")
    return path


async def server_model_path(url: str, who: str, hint: str = "") -> Path:
    """The ``model_path`` the server at ``url`` was launched with (its ``/server_info``). EngineError
    (prefixed ``who``, ending with ``hint``) naming the URL when it cannot be learned."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=30.0) as c:
            r = await c.get(url + "/server_info")
            r.raise_for_status()
            return Path(r.json()["model_path"])
    except (httpx.HTTPError, KeyError, ValueError) as e:
        raise EngineError(
            f"{who}: cannot learn the model path from {url}/server_info ({type(e).__name__}: {e}){hint}"
        ) from e


def write_weights_dir(named: list[tuple[str, Any]], version: int, src: Path, parent: Path) -> Path:
    """Write ``parent/v<version:08d>``: ``named`` (``(name, tensor)`` pairs) as ``model.safetensors``
    plus every non-weight file of ``src`` (config, tokenizer). Built under a temp name and renamed, so
    a server never sees half a directory; returns the final path."""
    from safetensors.torch import save_file

    final = parent / f"v{version:08d}"
    tmp = parent / f".v{version:08d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES):
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


def prune_weights_dirs(parent: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest ``v*`` directories under ``parent``."""
    dirs = sorted(p for p in parent.glob("v*") if p.is_dir())
    for old in dirs[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


async def load_weights_dir(engine: Any, path: Path, version: int) -> None:
    """Every server of ``engine`` loads ``path`` (generation must be paused), stamping ``version``
    and flushing its cache; a restarted server reloads it (``engine.note_weights`` when offered)."""
    await engine.post_all(
        "/update_weights_from_disk", {"model_path": str(path), "weight_version": str(version), "flush_cache": True}
    )
    note = getattr(engine, "note_weights", None)
    if note is not None:
        note(path, version)


async def load_from_disk(engine: Any, state_dict: Mapping[str, Any], version: int) -> None:
    """``SGLangEngine.update_weights``: ``state_dict`` written to :func:`default_weights_dir` beside
    the first server's config files, then pause, load on every server, set the policy version,
    resume (always), and keep only the newest directory. EngineError names the bad input or server."""
    who = "SGLangEngine.update_weights"
    if not isinstance(version, int) or version < 0:
        raise EngineError(f"weight sync: version must be an int >= 0, got {version!r}")
    named = named_tensors(state_dict)
    parent = default_weights_dir(engine)
    parent.mkdir(parents=True, exist_ok=True)
    src = check_model_dir(await server_model_path(engine.urls[0], who), who)
    path = await asyncio.to_thread(write_weights_dir, named, version, src, parent)
    await engine.pause()
    try:
        await load_weights_dir(engine, path, version)
        engine.set_policy_version(version)
    finally:
        await engine.resume()  # also tells every server the (new) version
    prune_weights_dirs(parent, keep=1)
