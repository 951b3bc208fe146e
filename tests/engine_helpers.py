"""Shared pieces of the local engine's tests: a tiny model whose output depends on its whole context."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from agentrl.warmstart.tiny_model import build_model


def build_tiny(tmp_dir, seed: int = 0):
    """A random tiny Qwen3 (hidden 64, 2 layers, 2 heads; init ``seed``) saved under ``tmp_dir / "m"``."""
    return build_model(tmp_dir / "m", hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, seed=seed)


def load_sharp(path):
    """The model at ``path`` with louder layers. A random init with tied embeddings just repeats the
    last prompt token; louder layers make the output depend on the whole context, so a corrupted
    K/V cache changes the tokens."""
    m = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        m.model.embed_tokens.weight.mul_(2.0)
        for name, p in m.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "up_proj.weight", "v_proj.weight")):
                p.mul_(8.0)
    return m
