"""The networks the trainer runs: loading, FSDP2 sharding, and per-token forward passes.

Owns: loading the policy / frozen reference (HF causal LMs) and the critic (``ValueModel``: an HF
base model with a scalar head), sharding each with ``fully_shard`` (every decoder layer, then the
root), activation checkpointing, and the forward helpers that turn a ``MicroBatch`` into flat
per-token tensors over selected positions: logprobs (+ the logits, for entropy) and values.

Critic choice: a *separate* network initialised from the policy checkpoint (or
``critic_model_path``), with its own optimizer - the usual PPO-for-LLMs choice (verl, OpenRLHF). A
shared trunk would let value-loss gradients move the policy; a separate one costs a second model.
Its value for token t is read from the hidden state at t-1, i.e. V(state in which token t is
sampled), matching the logprob alignment in ``packing``.

Does not: compute losses (``agentrl.algos``), decide batching, or checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from agentrl.models.device import compute_dtype
from agentrl.trainer import attention as _attention  # noqa: F401  (registers varlen_sdpa)
from agentrl.trainer.packing import MicroBatch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ValueModel(nn.Module):
    """An HF base model (no LM head) plus a linear value head; forward returns ``[R, K]`` values."""

    def __init__(self, backbone: PreTrainedModel) -> None:
        super().__init__()
        self.backbone = backbone
        hidden = backbone.config.get_text_config().hidden_size
        self.value_head = nn.Linear(hidden, 1)
        # Zero init: values start at 0 and the trunk's first updates come from a sane head.
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @property
    def config(self):
        return self.backbone.config

    def forward(self, keep: torch.Tensor, **kw) -> torch.Tensor:
        hidden = self.backbone(**kw).last_hidden_state  # [R, T, H]
        # clone(): FSDP2 hooks the root's output for backward; a view output could lose that hook.
        return self.value_head(hidden[:, keep]).squeeze(-1).float().clone()


def load_causal_lm(path: str, attn_implementation: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    # fp32 master weights whatever the checkpoint's dtype; param_dtype sets the compute dtype.
    # (Every forward passes use_cache=False: with a cache, HF stops detecting packed rows.)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn_implementation)


def load_value_model(path: str, attn_implementation: str) -> ValueModel:
    from transformers import AutoModel

    return ValueModel(AutoModel.from_pretrained(path, dtype=torch.float32, attn_implementation=attn_implementation))


def mixed_precision(param_dtype: str, device_type: str) -> MixedPrecisionPolicy:
    """FSDP2's policy: compute in ``param_dtype`` (``auto``: bfloat16 on CUDA, float32 elsewhere, by
    ``agentrl.models.device.compute_dtype``); gradients reduced in float32; master weights stay float32
    (the loaders above)."""
    return MixedPrecisionPolicy(
        param_dtype=_DTYPES[compute_dtype(param_dtype, device_type)], reduce_dtype=torch.float32
    )


def shard(model: nn.Module, mesh, *, param_dtype: str, checkpointing: bool, trainable: bool) -> nn.Module:
    """fully_shard every decoder layer (HF ``_no_split_modules``), then the root. In place."""
    # the HF model: its checkpointing methods and _no_split_modules are not nn.Module's
    inner: Any = model.backbone if isinstance(model, ValueModel) else model
    if checkpointing and trainable:
        # Non-reentrant: recomputation re-enters FSDP's pre-forward hooks (re-all-gathers the layer).
        kw = {"use_reentrant": False}
        if hasattr(inner, "activation_checkpointing_enable"):  # transformers >= 5.x name
            inner.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
        else:
            inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    if not trainable:
        model.eval()
        model.requires_grad_(False)
    layer_names = set(getattr(inner, "_no_split_modules", None) or [])
    if not layer_names:
        raise ValueError(f"{type(inner).__name__} declares no _no_split_modules; cannot find its decoder layers")
    mp = mixed_precision(param_dtype, mesh.device_type if mesh is not None else "cpu")
    layers = [m for m in model.modules() if type(m).__name__ in layer_names]
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


# -- forward helpers ---------------------------------------------------------------------------
def select(sel: torch.Tensor, prev: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """For target positions ``sel`` [R, T] (bool, never column 0): (keep, sub).

    ``keep`` [K] = positions whose outputs predict some selected target (target column - 1, the
    union over rows, so padded rows share one index; with ``prev`` [1, T], a packed row's
    ``MicroBatch.prev_index``, the position it names); ``sub`` [R, K] picks the real (row, target)
    pairs, so ``out[:, keep][sub]`` lines up with ``x[sel]`` for any per-token ``x``. With nothing
    selected, keep = [0] and sub is all-False (so every rank still runs the same forward).
    """
    cols = sel.any(0).nonzero().flatten()
    if cols.numel() == 0:
        keep = torch.zeros(1, dtype=torch.long, device=sel.device)
        return keep, torch.zeros(sel.shape[0], 1, dtype=torch.bool, device=sel.device)
    if prev is not None:
        return prev[0, cols], sel[:, cols]
    return cols - 1, sel[:, cols]


def model_inputs(mb: MicroBatch, *, packed_mask: bool, attn_implementation: str) -> dict:
    attention_mask = mb.attention_mask
    if mb.packed and packed_mask:
        dtype = torch.float32 if attn_implementation == "eager" else None
        attention_mask = mb.block_causal_mask(dtype)
    return {
        "input_ids": mb.input_ids,
        "position_ids": mb.position_ids,
        "attention_mask": attention_mask,
        "use_cache": False,
    }


def token_logprobs(model, inputs: dict, mb: MicroBatch, sel: torch.Tensor, temperature: float):
    """Flat (logp [N], scaled logits [N, V]) for the targets ``sel``, in ``x[sel]`` order."""
    keep, sub = select(sel, mb.prev_index)
    logits = model(**inputs, logits_to_keep=keep).logits  # [R, K, V]
    logits = logits.float()
    if temperature not in (0.0, 1.0):  # the engine scales by T (greedy: unscaled)
        logits = logits / temperature
    flat = logits[sub]  # [N, V]
    targets = mb.input_ids[sel]
    logp = flat.gather(-1, targets[:, None]).squeeze(-1) - flat.logsumexp(-1)
    if flat.numel() == 0:
        logp = logp + 0.0 * logits.sum()  # keep the graph connected for FSDP's backward hooks
    return logp, flat


def token_values(critic: ValueModel, inputs: dict, sel: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
    """Flat values [N] for the targets ``sel`` (V of the state each token is sampled in); ``prev``:
    ``MicroBatch.prev_index``."""
    keep, sub = select(sel, prev)
    values = critic(keep, **inputs)  # [R, K]
    flat = values[sub]
    if flat.numel() == 0:
        flat = flat + 0.0 * values.sum()
    return flat


def all_targets(mb: MicroBatch) -> torch.Tensor:
    """Every real token that has context (position > 0): what logprobs()/values() report."""
    return (mb.position_ids > 0) & (mb.seq_index >= 0)


def scatter_per_sample(mb: MicroBatch, sel: torch.Tensor, flat: torch.Tensor) -> dict[int, list[float]]:
    """Flat values over ``sel`` -> {sample index: full-length list, 0.0 where not selected}."""
    full = torch.zeros(sel.shape, dtype=torch.float64)
    full[sel.cpu()] = flat.detach().double().cpu()
    seq = mb.seq_index.cpu()
    return {i: full[seq == i].tolist() for i in mb.samples}
