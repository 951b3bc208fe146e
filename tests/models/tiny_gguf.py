"""A tiny llama-shaped GGUF file written with the gguf package's writer, for conversion tests.

SmolLM2's layout in miniature: byte-level BPE vocabulary (the 256 byte symbols, a few merges) with
``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` as control tokens at ids 0-2, 2 layers, hidden 64,
heads 2 (kv 1, head_dim 32), tied embeddings, float32 tensors and one Q8_0 tensor (so the loader's
dequantization runs). Converting it takes seconds, not the 98 MB file's half minute.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: SmolLM2-135M-Instruct's chat template (ChatML, no tool support), as its GGUF carries it (public data)
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("o", "r"), ("Ġ", "a")]


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def write_tiny_gguf(
    path: Path,
    *,
    arch: str = "llama",
    chat_template: str | None = SMOLLM2_TEMPLATE,
    seed: int = 0,
    layers: int = 2,
) -> Path:
    """Write the tiny model to ``path`` (a ``.gguf`` file) and return it."""
    import gguf

    tokens = SPECIALS + _byte_symbols() + ["".join(m) for m in MERGES]
    types = [gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS))
    vocab, hidden, ffn, heads, kv_heads, head_dim = len(tokens), 64, 128, 2, 1, 32
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("agentrl tiny gguf")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([" ".join(m) for m in MERGES])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    writer.add_tensor("token_embd.weight", w(vocab, hidden))
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", w(heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_k.weight", w(kv_heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_v.weight", w(kv_heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_output.weight", w(hidden, heads * head_dim))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", w(ffn, hidden))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", w(ffn, hidden))
        down = w(hidden, ffn)
        if i == 0:  # one quantized tensor: conversion must dequantize it
            q = gguf.quants.quantize(down, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(f"blk.{i}.ffn_down.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(f"blk.{i}.ffn_down.weight", down)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
