"""Engines and weight syncs from a run's config: what ``agentrl run`` (and ``agentrl rollout``) serve
rollouts with.

Owns the cross-field checks of ``cfg.engine`` (``check_engine_config``: the resolved weight-sync kind,
ConfigError naming the bad value), building the engine (``make_engine``: the in-process LocalEngine,
or SGLangEngine attached to ``engine.urls`` / launching ``engine.num_servers``) and its WeightSync
(``make_sync``). Does not implement engines or syncs, and not the Ray mode's engines
(``agentrl.distributed`` builds those).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.config.schema import RunConfig


def make_engine(cfg: RunConfig, model_path: Path):
    """The rollout engine ``cfg.engine.kind`` names, not started yet."""
    if cfg.engine.kind == "sglang":
        return _sglang_engine(cfg, model_path)
    import torch

    from agentrl.engine.local import LocalEngine

    return LocalEngine.from_pretrained(str(model_path), device=cfg.model.device, dtype=getattr(torch, cfg.model.dtype),
                                       max_batch_size=cfg.engine.max_batch_size, max_context=cfg.rollout.max_context)


def cpu_threads(cfg: RunConfig, cores: int | None = None) -> int | None:
    """Torch intra-op threads for ``agentrl run`` (None: leave torch's default). Only the in-process
    engine on CPU shares the process with the trainer; both compute at once in their own threads, and
    every thread that enters a parallel region gets its own OpenMP team, so auto splits the cores."""
    n = cfg.engine.cpu_threads
    if n == 0 or cfg.engine.kind != "local" or cfg.model.device != "cpu" or cfg.distributed == "ray":
        return None
    if n is not None:
        return n
    import os

    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    return max(1, cores // 2)


def check_engine_config(cfg: RunConfig) -> str:
    """Cross-field checks of ``cfg.engine``; returns the resolved weight-sync kind. ConfigError names
    the bad value."""
    from agentrl.weights.sync import resolve_sync_kind
    from agentrl.errors import ConfigError

    e = cfg.engine
    if e.kind != "sglang" and e.urls:
        raise ConfigError(f"engine.urls: {e.urls!r} needs engine.kind=sglang (got {e.kind!r})")
    for u in e.urls:
        if not isinstance(u, str) or not u.startswith(("http://", "https://")):
            raise ConfigError(f"engine.urls: {u!r} is not an http(s)://host:port URL")
    device = "cpu" if cfg.model.device == "cpu" else "gpu"
    kind = resolve_sync_kind(e.weight_sync, e.kind, device)
    if kind == "distributed" and e.sync_backend == "nccl" and device == "cpu":
        raise ConfigError("engine.sync_backend: 'nccl' needs GPUs (model.device='cpu'); use gloo or weight_sync=disk")
    return kind


def _sglang_engine(cfg: RunConfig, model_path: Path):
    from agentrl.engine.sglang import SGLangEngine

    if cfg.engine.urls:
        return SGLangEngine(urls=cfg.engine.urls, max_context=cfg.rollout.max_context)
    device = "cpu" if cfg.model.device == "cpu" else "cuda"
    return SGLangEngine.launch(str(model_path), num_servers=cfg.engine.num_servers, device=device,
                               max_total_tokens=cfg.engine.max_total_tokens, max_context=cfg.rollout.max_context)


def make_sync(cfg: RunConfig, kind: str, engine, model_path: Path, run_dir: Path):
    from agentrl.weights.sync import make_weight_sync

    kwargs: dict[str, Any] = {}
    if kind == "disk":
        kwargs = {"dir": cfg.engine.weights_dir or run_dir / "weights", "model_path": model_path}
    elif kind == "distributed":
        kwargs = {"backend": cfg.engine.sync_backend}
    return make_weight_sync(kind, engine, **kwargs)


