"""LoRA on the trainer's networks: injecting adapters, and the state-dict algebra around them.

Owns: putting peft LoRA layers into a loaded model *in place* (no PeftModel wrapper, so FSDP2 sharding,
the forward helpers and the critic's ``ValueModel`` see the same module tree as without LoRA),
freezing everything but the adapters (and, for the critic, its value head; with ``train_norms`` the
normalization gains), and pure functions over
state dicts: the merged weights under the base model's names (what engines and HF exports get) and
the conversion to and from peft's adapter file format.

Names: an adapted projection ``P`` (e.g. ``model.layers.0.self_attn.q_proj``) holds
``P.base_layer.weight`` (frozen), ``P.lora_A.default.weight`` [r, in] and ``P.lora_B.default.weight``
[out, r]; merged, ``P.weight = W + (B @ A) * alpha / r``. peft's files name the adapters
``base_model.model.P.lora_A.weight`` (no adapter name). Trained gains are peft ``modules_to_save``:
``base_model.model.G`` for a gain ``G`` (e.g. ``model.layers.0.input_layernorm.weight``).

Does not: decide when to save or sync (checkpoint / the run loop), or shard (``models.shard``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from agentrl.errors import ConfigError
from agentrl.trainer.config import LoraConfig
from agentrl.trainer.optim import is_norm_gain

ADAPTER = "default"
_A, _B, _BASE = f".lora_A.{ADAPTER}.weight", f".lora_B.{ADAPTER}.weight", ".base_layer."
_PEFT_PREFIX = "base_model.model."
ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"


def peft_config(
    cfg: LoraConfig,
    *,
    base_path: str | None = None,
    task_type: str | None = "CAUSAL_LM",
    modules_to_save: list[str] | None = None,
):
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,  # pyright: ignore[reportArgumentType]  peft annotates int; it scales by alpha / r
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type=task_type,
        base_model_name_or_path=base_path,
        modules_to_save=modules_to_save or None,
    )


def apply(model: nn.Module, cfg: LoraConfig, *, keep_trainable: tuple[str, ...] = ()) -> nn.Module:
    """Inject LoRA adapters into ``model`` in place (fp32 adapters; B = 0, so the function is
    unchanged) and freeze every other parameter except those whose name starts with one of
    ``keep_trainable`` (the critic's value head) and, with ``cfg.train_norms``, the normalization
    gains (in their own dtype). ConfigError when no module matches the targets."""
    from peft import inject_adapter_in_model

    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    if not leaves & set(cfg.target_modules):
        raise ConfigError(
            f"trainer.lora.target_modules: none of {list(cfg.target_modules)} names a module of "
            f"{type(model).__name__} (its linear layers: {sorted(_linear_names(model))})"
        )
    inject_adapter_in_model(peft_config(cfg, task_type=None), model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        gain = cfg.train_norms and is_norm_gain(name, p)
        p.requires_grad_(is_adapter(name) or gain or name.startswith(keep_trainable))
        if is_adapter(name) and p.dtype != torch.float32:
            p.data = p.data.float()
    return model


def _linear_names(model: nn.Module) -> set[str]:
    return {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def count_trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def base_name(name: str) -> str:
    """The name a (non-adapter) parameter has in the model without LoRA."""
    return name.replace(_BASE, ".")


def merged_state_dict(sd: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """``sd`` of a LoRA model -> the plain model's state dict: every adapted weight becomes
    ``W + (B @ A) * scaling`` (computed in fp32, stored in W's dtype) under its base name; the
    adapters are dropped and every other entry keeps its name. Pure; ValueError on a half adapter."""
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        if not is_adapter(name):
            out[base_name(name)] = t
    for a_name in [n for n in sd if n.endswith(_A)]:
        prefix = a_name[: -len(_A)]
        b_name, w_name = prefix + _B, prefix + _BASE + "weight"
        if b_name not in sd or w_name not in sd:
            raise ValueError(f"adapter {a_name!r} has no {b_name if b_name not in sd else w_name!r} in the state dict")
        w = sd[w_name]
        delta = (sd[b_name].float() @ sd[a_name].float()) * scaling
        out[prefix + ".weight"] = (w.float() + delta).to(w.dtype)
    orphans = [n for n in sd if n.endswith(_B) and n[: -len(_B)] + _A not in sd]
    if orphans:
        raise ValueError(f"adapter {orphans[0]!r} has no lora_A partner in the state dict")
    return out


def trained_gains(model: nn.Module) -> list[str]:
    """Names of the normalization gains that train (``lora.train_norms``); [] otherwise."""
    return [n for n, p in model.named_parameters() if p.requires_grad and is_norm_gain(n, p)]


def to_peft(sd: dict[str, torch.Tensor], gains: tuple[str, ...] | list[str] = ()) -> dict[str, torch.Tensor]:
    """The adapter entries of ``sd`` (and the ``gains`` named, as peft's modules_to_save) under
    peft's file names (what PeftModel.from_pretrained reads)."""
    out = {_PEFT_PREFIX + n.replace(f".{ADAPTER}.weight", ".weight"): t for n, t in sd.items() if is_adapter(n)}
    out.update({_PEFT_PREFIX + n: sd[n] for n in gains})
    return out


def from_peft(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of ``to_peft``: peft file names -> this module's parameter names."""
    out = {}
    for n, t in sd.items():
        if not n.startswith(_PEFT_PREFIX):
            raise ValueError(f"{n!r} is not a peft adapter file's weight name (no {_PEFT_PREFIX!r} prefix)")
        name = n[len(_PEFT_PREFIX) :]
        out[name.removesuffix(".weight") + f".{ADAPTER}.weight" if is_adapter(n) else name] = t
    return out


def save_adapter(
    out: Path, sd: dict[str, torch.Tensor], cfg: LoraConfig, base_path: str, gains: list[str] | None = None
) -> None:
    """Write the adapters of ``sd`` (and the trained ``gains``, as modules_to_save: their modules'
    leaf names) as a peft adapter directory (adapter_config.json + weights)."""
    from safetensors.torch import save_file

    gains = gains or []
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.contiguous() for k, v in to_peft(sd, gains).items()}
    save_file(weights, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    modules = sorted({g.rsplit(".", 2)[-2] for g in gains})
    peft_config(cfg, base_path=base_path, modules_to_save=modules).save_pretrained(str(out))


def load_adapter(path: Path, cfg: LoraConfig) -> dict[str, torch.Tensor]:
    """Adapter weights of a directory written by ``save_adapter``, under this module's names;
    ConfigError when its rank or alpha differ from ``cfg`` (the scaling would silently change) or
    it has trained gains and ``cfg.train_norms`` is off, or the other way round."""
    from safetensors.torch import load_file

    saved = json.loads((path / ADAPTER_CONFIG).read_text())
    if (saved.get("r"), float(saved.get("lora_alpha", 0))) != (cfg.rank, float(cfg.alpha)):
        raise ConfigError(
            f"{path}: adapters of rank {saved.get('r')}, alpha {saved.get('lora_alpha')}; this "
            f"trainer has trainer.lora.rank={cfg.rank}, alpha={cfg.alpha}: resume with the same"
        )
    if bool(saved.get("modules_to_save")) != cfg.train_norms:
        raise ConfigError(
            f"{path}: adapters {'with' if saved.get('modules_to_save') else 'without'} trained normalization "
            f"gains; this trainer has trainer.lora.train_norms={str(cfg.train_norms).lower()}: resume with the same"
        )
    return from_peft(load_file(str(path / ADAPTER_WEIGHTS)))


def trainable_state(model: nn.Module, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries of a gathered state dict whose parameters train (adapters, value head)."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in sd.items() if k in names}
