"""The built-in default model: a tiny Qwen2 built locally (no network) and cached.

Owns where the cache lives (``$AGENTRL_CACHE`` or ``~/.cache/agentrl``), building it once with an
atomic rename so concurrent runs never see half a model, and resolving ``model.path``. Does not
train it (the SFT warm start is a separate stage).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from agentrl.errors import ConfigError

DEFAULT_NAME = "tiny-qwen2-v1"


def cache_dir() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))


def default_model_path(name: str = DEFAULT_NAME) -> Path:
    """Path of the cached built-in model, building it first if needed."""
    from agentrl.tiny_model import build_model

    dest = cache_dir() / "models" / name
    if (dest / "config.json").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=dest.parent))
    try:
        build_model(tmp)
        try:
            os.rename(tmp, dest)
        except OSError:  # another process won the race; its copy is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def resolve_model_path(path: str | None) -> Path:
    if path is None:
        return default_model_path()
    p = Path(path).expanduser()
    if not (p / "config.json").exists():
        raise ConfigError(f"model.path: {path!r} is not a local HF model directory (no config.json); "
                          "models cannot be downloaded here, pass a local directory or leave it null")
    return p
