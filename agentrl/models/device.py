"""Where a model runs and in which dtype: turning ``auto`` into a concrete device and dtype.

Owns the rule (``choose``): device ``auto`` is ``cuda`` when a CUDA GPU is visible, else ``cpu``;
dtype ``auto`` is ``bfloat16`` on CUDA and ``float32`` on CPU. Also the probe of what this machine
has (``probe``), the trainer's compute dtype (``compute_dtype``: its master weights and gradient
reductions stay float32 whatever this says), the one-line account a run prints (``device_line``),
and ``resolve_device(cfg)``: a run config with ``model.device``/``model.dtype`` concrete and the
trainer's ``auto`` fields following them, which the config plan calls once before anything is
built, so the resolved config written to the run directory says what really ran.

With ``distributed: ray`` the driver's own GPUs say nothing about the actors': there ``auto`` means
cuda when the Ray layout asks for GPUs (``ray.engine_gpus`` or ``ray.trainer_gpus`` > 0).

Does not: load models, create process groups (``agentrl.trainer.dist``) or read config files.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from agentrl.errors import ConfigError

AUTO = "auto"
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Accelerators:
    """What torch sees on this machine: whether CUDA is usable, how many GPUs and their names."""

    cuda: bool
    count: int = 0
    names: tuple[str, ...] = ()


def probe() -> Accelerators:
    """This process's view of its GPUs (CUDA_VISIBLE_DEVICES applies)."""
    import torch

    if not torch.cuda.is_available():
        return Accelerators(False)
    n = torch.cuda.device_count()
    names: list[str] = []
    for i in range(n):
        try:
            names.append(torch.cuda.get_device_name(i))
        except Exception:  # noqa: BLE001 - a name is cosmetic; a driver hiccup must not stop a run
            names.append("?")
    return Accelerators(n > 0, n, tuple(names))


def _check_device(device: str, what: str) -> str:
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError, TypeError):
        raise ConfigError(f"{what}: {device!r} is not a torch device (use 'auto', 'cpu', 'cuda' or 'cuda:N')") from None
    if kind not in ("cpu", "cuda"):
        raise ConfigError(f"{what}: {device!r} is not supported (use 'auto', 'cpu', 'cuda' or 'cuda:N')")
    return kind


def choose(device: str, dtype: str, cuda: bool, what: str = "model") -> tuple[str, str]:
    """(device, dtype) with ``auto`` resolved; ``cuda``: whether a CUDA GPU is usable. ConfigError
    names the bad value (an unknown device or dtype, or cuda asked for where there is none)."""
    if dtype != AUTO and dtype not in DTYPES:
        raise ConfigError(f"{what}.dtype: {dtype!r} is not one of {[AUTO, *DTYPES]}")
    if device == AUTO:
        device = "cuda" if cuda else "cpu"
    kind = _check_device(device, f"{what}.device")
    if kind == "cuda" and not cuda:
        raise ConfigError(
            f"{what}.device: {device!r} but no CUDA GPU is visible to torch here "
            "(check `agentrl doctor`); use 'auto' or 'cpu'"
        )
    if dtype == AUTO:
        dtype = "bfloat16" if kind == "cuda" else "float32"
    return device, dtype


def compute_dtype(param_dtype: str, device_type: str) -> str:
    """The trainer's forward/backward dtype: ``auto`` is bfloat16 on CUDA, float32 elsewhere."""
    if param_dtype == AUTO:
        return "bfloat16" if device_type == "cuda" else "float32"
    if param_dtype not in DTYPES:
        raise ConfigError(f"trainer.param_dtype: {param_dtype!r} is not one of {[AUTO, *DTYPES]}")
    return param_dtype


def _wants_cuda(cfg: Any, found: Accelerators | None) -> bool:
    if getattr(cfg, "distributed", None) == "ray":
        ray = cfg.ray
        return ray.engine_gpus > 0 or ray.trainer_gpus > 0
    return (found or probe()).cuda


class RunConfigShape(Protocol):
    """What :func:`resolve_device` reads of a run config: a dataclass with ``model`` and ``trainer``
    sections (``agentrl.config.schema.RunConfig`` is on a higher layer)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    model: Any
    trainer: Any


C = TypeVar("C", bound=RunConfigShape)  # the run config type


def resolve_device(cfg: C, found: Accelerators | None = None) -> C:
    """A copy of run config ``cfg`` with ``model.device``/``model.dtype`` concrete (``choose``), the
    trainer's ``device: auto`` set to the model's device kind and its ``param_dtype: auto`` to the
    model's dtype. ``found``: what this machine has (default: ``probe()``). Idempotent."""
    cuda = _wants_cuda(cfg, found)
    device, dtype = choose(cfg.model.device, cfg.model.dtype, cuda)
    model = dataclasses.replace(cfg.model, device=device, dtype=dtype)
    trainer = cfg.trainer
    changes: dict[str, str] = {}
    if trainer.device == AUTO:
        changes["device"] = "cuda" if device.startswith("cuda") else "cpu"
    if getattr(trainer, "param_dtype", None) == AUTO:
        changes["param_dtype"] = dtype
    if changes:
        trainer = dataclasses.replace(trainer, **changes)
    return dataclasses.replace(cfg, model=model, trainer=trainer)


def device_line(cfg: Any, found: Accelerators | None = None) -> str:
    """What a run prints at start about a resolved ``cfg``, e.g. ``device: cuda (2 x NVIDIA H100),
    dtype bfloat16; trainer cuda / bfloat16 compute, float32 master weights``."""
    m, t = cfg.model, cfg.trainer
    where = m.device
    if getattr(cfg, "distributed", None) == "ray":
        where += " (on the Ray actors)"
    elif m.device.startswith("cuda"):
        found = found or probe()
        if found.names:
            where += f" ({found.count} x {found.names[0]})"
    trainer_dtype = compute_dtype(getattr(t, "param_dtype", m.dtype), "cuda" if t.device != "cpu" else "cpu")
    return f"device: {where}, dtype {m.dtype}; trainer {t.device} / {trainer_dtype} compute, float32 master weights"
