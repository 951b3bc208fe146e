"""Build tiny HF models and tokenizers locally, with no download.

Owns: a byte-level BPE tokenizer trained on built-in text (chat + tool-call + Python vocabulary),
wrapped as a PreTrainedTokenizerFast carrying a real chat template (Qwen2.5's by default), and a
randomly initialised Qwen2 causal LM of a chosen size, saved as a normal HF directory. Used for the
embedded default model, tests and benchmarks. Does not train the model (see the SFT stage).
"""
from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added (non-special) tokens: single ids, kept by decode(skip_special_tokens=True) like Qwen's.
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def qwen25_chat_template() -> str:
    """Qwen2.5's public chat template (tools supported), shipped as package data."""
    return resources.files("agentrl").joinpath("templates/qwen2_5.jinja").read_text(encoding="utf-8")


def _corpus(seed: int = 0, n: int = 3000) -> list[str]:
    rng = random.Random(seed)
    words = (
        "the a of to and in is that for it as with was on be by this are or an from at which not "
        "compute calculate what sum product number answer result value python code run tool call "
        "print return def import for while if else elif range len list dict int str float true false "
        "user assistant system you are a helpful function arguments name json solve task final "
        "error timeout output input stdout stderr traceback exception file line"
    ).split()
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 9999), rng.randint(0, 999)
        op = rng.choice(["+", "-", "*", "//", "%", "**"])
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))).capitalize() + ".")
        out.append(f"print({a} {op} {b})")
        out.append(json.dumps({"name": "python", "arguments": {"code": f"x = {a}\nprint(x {op} {b})"}}))
        out.append(f"The answer is {a * b}. #### {a + b}")
    return out


def build_tokenizer(out_dir: str | Path | None = None, vocab_size: int = 2048, chat_template: str | None = None):
    """Train a byte-level BPE tokenizer on built-in text; any string is encodable."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[],
    )
    fast.add_tokens(ADDED_TOKENS)
    fast.chat_template = chat_template or qwen25_chat_template()
    if out_dir is not None:
        fast.save_pretrained(str(out_dir))
    return fast


def build_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 256,
    max_position_embeddings: int = 4096,
    vocab_size: int = 2048,
    seed: int = 0,
    chat_template: str | None = None,
) -> Path:
    """Write a randomly initialised tiny Qwen2 model and its tokenizer to ``out_dir``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out, vocab_size=vocab_size, chat_template=chat_template)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(str(out))
    return out
