"""A model's linear layers in a narrower dtype than the rest of it.

``NarrowLinears(model, torch.bfloat16)`` stores every ``nn.Linear`` weight (and bias) in bfloat16 and runs its
matrix product there, while the activations between layers, the attention (and so the K/V cache), the norms
and the logits stay in the model's own dtype: each linear layer casts its input down and its output back up.
On a CPU with bfloat16 matrix units this is the fast half of bfloat16 without its slow half (CPU attention in
bfloat16 is several times slower than in float32), and the weights take half the memory.

A linear layer whose weight is tied to another module's (an ``lm_head`` sharing the input embedding) gets its
own narrow copy, so the embedding keeps the model's dtype; ``tied_updates`` says which copies a weight update
must refresh when it carries only the shared source.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["NarrowLinears"]


class NarrowLinears:
    """Converts ``model``'s linear layers to ``dtype`` in place (see the module docstring)."""

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        owners: dict[int, list[tuple[str, nn.Module]]] = {}
        for mod_name, mod in model.named_modules(remove_duplicate=False):
            for p_name, p in mod.named_parameters(recurse=False):
                owners.setdefault(id(p), []).append((f"{mod_name}.{p_name}" if mod_name else p_name, mod))
        self.dtype = dtype
        #: the dtype the layers' outputs go back to: the model's own
        self.wide = next((m.weight.dtype for m in model.modules() if isinstance(m, nn.Linear)), dtype)
        #: {a linear layer's parameter name: the name of the wider tensor it was untied from}
        self.tied: dict[str, str] = {}
        self.layers = 0
        for name, mod in model.named_modules():
            if not isinstance(mod, nn.Linear):
                continue
            weight_name = f"{name}.weight" if name else "weight"
            others = [n for n, m in owners.get(id(mod.weight), []) if not isinstance(m, nn.Linear)]
            if others:  # shared with an embedding: a narrow copy of its own, the source left as it is
                mod.weight = nn.Parameter(mod.weight.detach().to(dtype), requires_grad=mod.weight.requires_grad)
                self.tied[weight_name] = others[0]
            else:
                mod.weight.data = mod.weight.data.to(dtype)
            if mod.bias is not None:
                mod.bias.data = mod.bias.data.to(dtype)
            mod.register_forward_pre_hook(self._narrow_input)
            mod.register_forward_hook(self._widen_output)
            self.layers += 1

    def _narrow_input(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (args[0].to(self.dtype), *args[1:])

    def _widen_output(self, module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        return output.to(self.wide)

    def tied_updates(self, state_dict: Mapping[str, Any]) -> dict[str, Any]:
        """The untied copies ``state_dict`` must also write: {copy's name: its source's new tensor} for
        each source the update carries without the copy (a trainer may send a tied weight once)."""
        return {dst: state_dict[src] for dst, src in self.tied.items() if src in state_dict and dst not in state_dict}
