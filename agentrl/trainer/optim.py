"""The trainer's optimizers: AdamW with its parameter groups, the LR schedule, the clipped step.

Owns :func:`build_optimizer` (AdamW over a model's trainable parameters, normalization gains in a
group of their own when ``norm_lr_scale`` is not 1, and its LambdaLR schedule), :func:`lr_lambda`
(warmup, then constant or cosine decay to ``min_lr_ratio``) and :func:`clip_and_step` (clip the
gradient norm, step unless it is not finite, zero the gradients). Does not compute losses or
gradients (``agentrl.trainer.objective``, ``agentrl.trainer.trainer``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from agentrl.trainer.config import TrainerConfig


def lr_lambda(cfg: TrainerConfig) -> Callable[[int], float]:
    """The LR factor of optimizer step ``step`` under ``cfg``'s schedule."""
    cfg = cfg.resolved()  # null schedule fields: the Trainer API's choices
    total_steps, min_lr_ratio = cfg.total_steps, cfg.min_lr_ratio
    assert total_steps is not None and min_lr_ratio is not None  # resolved() fills them

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def is_norm_gain(name: str, p: torch.Tensor) -> bool:
    """A normalization gain: a 1-D weight of a module whose name contains ``norm`` (RMSNorm/LayerNorm,
    e.g. ``model.layers.0.input_layernorm.weight``, ``...self_attn.q_norm.weight``, ``model.norm.weight``)."""
    return p.ndim == 1 and "norm" in name.rsplit(".", 2)[-2]


def build_optimizer(
    model: torch.nn.Module, cfg: TrainerConfig, lr: float, gain_scale: float | None = None
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``model``'s trainable parameters (with LoRA: the adapters, and the gains with
    ``lora.train_norms``) and its schedule.
    With ``gain_scale`` (the policy's ``norm_lr_scale``) not 1 the normalization gains (1-D
    ``*norm*`` weights) are a second group at ``lr * gain_scale`` (the first group's lr is
    reported). The critic's gains keep its lr."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups: list[dict[str, Any]] = [{"params": params}]
    if gain_scale not in (None, 1.0):
        gains = [p for n, p in model.named_parameters() if p.requires_grad and is_norm_gain(n, p)]
        ids = {id(p) for p in gains}
        groups = [{"params": [p for p in params if id(p) not in ids]}]
        if gains:
            groups.append({"params": gains, "lr": lr * gain_scale})
    opt = torch.optim.AdamW(groups, lr=lr, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))


def scalar(x) -> float:
    """``x`` as a float; a DTensor (e.g. the clipped grad norm of sharded params) is gathered first."""
    if hasattr(x, "full_tensor"):
        x = x.full_tensor()
    return float(x)


def clip_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float | None) -> float:
    """Clip, step (skipped on a non-finite norm), zero grads; returns the pre-clip norm."""
    norm = scalar(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm or math.inf))
    if math.isfinite(norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm
