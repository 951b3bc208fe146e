"""Build tiny HF models and tokenizers locally, with no download.

Owns: a byte-level BPE tokenizer trained on built-in text (rendered agent conversations + generic text),
wrapped as a PreTrainedTokenizerFast carrying a real chat template (Qwen2.5's by default), and a
randomly initialised Qwen3 (or Qwen2) causal LM of a chosen size, saved as a normal HF directory. Used for the
embedded default model, tests and benchmarks. Does not train the model (see the SFT stage).
"""

from __future__ import annotations

import functools
import json
import random
from importlib import resources
from pathlib import Path

from agentrl.warmstart.textworld_demos import textworld_corpus

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added (non-special) tokens: single ids, kept by decode(skip_special_tokens=True) like Qwen's.
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def qwen25_chat_template() -> str:
    """Qwen2.5's public chat template (tools supported), shipped as package data."""
    return resources.files("agentrl").joinpath("templates/qwen2_5.jinja").read_text(encoding="utf-8")


def _generic_corpus(seed: int = 0, n: int = 3000) -> list[str]:
    """Plain English-ish words, arithmetic, JSON and Python snippets: broad coverage for any text."""
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


def _byte_tokenizer(chat_template: str):
    """An untrained byte-level tokenizer, only to render chat-template text for the corpus."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}, merges=[]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    fast.chat_template = chat_template
    return fast


def _agent_corpus(chat_template: str, n: int = 400, seed: int = 0) -> list[str]:
    """Rendered conversations of the built-in ``code_exec`` env (system prompt, tool schemas, task
    prompts, tool calls with reference solutions, tool results, final answers), as the chat template
    writes them, so the tokenizer learns the text an agent really sees. Train-split tasks only."""
    from agentrl.envs import tasks  # lazy: pulls in gymnasium
    from agentrl.envs.code_exec import SYSTEM_PROMPTS  # lazy: pulls in gymnasium
    from agentrl.tools.bash import make_bash_tool  # lazy: pulls in pydantic
    from agentrl.tools.python import make_python_tool  # lazy: pulls in pydantic

    no_sandbox = object()  # the schema needs no sandbox; the tools are never called here
    py = make_python_tool(no_sandbox).schema()  # type: ignore[arg-type]
    bash = make_bash_tool(no_sandbox).schema()  # type: ignore[arg-type]
    tok = _byte_tokenizer(chat_template)
    rng = random.Random(seed)
    out = []
    for i in range(n):
        task = tasks.generate_task(seed * 1_000_003 + i, 1 + i % len(tasks.DIFFICULTIES), "train")
        block = i % 4 == 3
        code = task["solution"]
        result = task["answer"] if task["answer"] is not None else "(no output)"
        if block:
            call = f"```python\n{code}\n```"
            tools, system = [py, bash], SYSTEM_PROMPTS["python_block"]
        else:
            call = "<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"
            tools, system = [py], SYSTEM_PROMPTS["hermes"]
        final = f"```python\n{code}\n```" if task["answer"] is None else f"The answer is \\boxed{{{result}}}."
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": task["prompt"]},
            {"role": "assistant", "content": call},
            {"role": "tool", "content": result},
            {"role": "assistant", "content": final},
        ]
        if rng.random() < 0.5:
            messages = messages[1:]
        out.append(tok.apply_chat_template(messages, tools=tools, tokenize=False))
    return out


def _split_added(texts: list[str]) -> list[str]:
    """Cut the training text at special/added tokens: those are single ids, never merged with text."""
    import re

    pat = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + ADDED_TOKENS))
    return [piece for t in texts for piece in pat.split(t) if piece]


#: transformers' Qwen2Tokenizer pre-tokenization (it replaces whatever tokenizer.json says when
#: AutoTokenizer loads a ``qwen2`` model dir, so a qwen2 tokenizer must be trained with it).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)
#: a word (letters, then at most one space) or a digit run is its own piece (``style="words"``)
WORDS_REGEX = r"\p{L}+ ?|\p{N}+"
STYLES = ("agent", "qwen2", "words")
#: the text a tokenizer is trained on: ``code_exec`` (rendered code_exec conversations + generic text)
#: or ``textworld`` (that plus rendered TextWorld play, ``agentrl.warmstart.textworld_demos.textworld_corpus``)
CORPORA = ("code_exec", "textworld")


def _corpus(name: str) -> list[str]:
    if name not in CORPORA:
        raise ValueError(f"corpus must be one of {CORPORA}, got {name!r}")
    texts = _split_added(_agent_corpus(qwen25_chat_template())) + _generic_corpus(n=1000)
    if name == "textworld":
        texts += _split_added(textworld_corpus(_byte_tokenizer(qwen25_chat_template())))
    return texts


@functools.lru_cache(maxsize=8)
def _trained(vocab_size: int, style: str, corpus: str = "code_exec") -> str:
    """The trained tokenizer as JSON (cached: tests build many tokenizers)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if style == "agent":
        # A run of digits is its own piece (BPE learns 2-3 digit chunks inside it), so a number
        # tokenizes the same wherever it appears and copying it from the prompt into code, or from
        # a tool result into the answer, is copying the same few ids (single digits made that
        # copy twice as long and ambiguous, and the tiny model learned it far more slowly).
        # Everything else may merge across spaces and punctuation, so fixed text (the tool
        # preamble, code idioms) compresses to a few ids. Byte-level: any string is encodable and
        # decodes back exactly.
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif style == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif style == "words":
        # A word is one piece wherever it stands, so a name reads as the same ids in an observation
        # ("Exits: laundry room, pantry.") and in the call that copies it ({"room": "laundry room"}):
        # copying is then matching ids, as with a real LLM's word-level vocabulary. The text between
        # words (punctuation, JSON, spaces) may still merge.
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(WORDS_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(corpus), trainer=trainer)
    return tok.to_str()


def build_tokenizer(
    out_dir: str | Path | None = None,
    vocab_size: int = 2048,
    chat_template: str | None = None,
    style: str = "agent",
    corpus: str = "code_exec",
):
    """Train a byte-level BPE tokenizer on built-in text (``corpus``: ``CORPORA``); any string is encodable.

    ``style="agent"`` (default): digit runs kept apart from text, merges allowed across words,
    so the default tool prompt is ~20-40 ids instead of ~250. ``style="qwen2"``: exactly the pre-tokenization that
    transformers' ``Qwen2Tokenizer`` imposes on a ``qwen2`` model dir (NFC + Qwen's regex). ``style="words"``:
    every word and digit run its own piece, so a name has the same ids wherever it appears."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(_trained(vocab_size, style, corpus))
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


ARCHS = ("qwen3", "qwen2")


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
    arch: str = "qwen3",
    tokenizer_style: str | None = None,
    corpus: str = "code_exec",
) -> Path:
    """Write a randomly initialised tiny Qwen3 (or Qwen2) model and its tokenizer to ``out_dir``.

    Qwen3 is the default because transformers 5 loads a ``qwen2`` dir's tokenizer as
    ``Qwen2Tokenizer``, which discards tokenizer.json's pre-tokenizer (and so the compact "agent"
    tokenizer); a ``qwen3`` dir loads tokenizer.json as written. Either way the saved tokenizer is
    checked: ``AutoTokenizer`` on ``out_dir`` must encode exactly like the tokenizer built here.
    ``tokenizer_style``/``corpus``: ``build_tokenizer``'s (None: ``qwen2`` for a qwen2 dir, else ``agent``)."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of num_heads {num_heads}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    style = tokenizer_style or ("qwen2" if arch == "qwen2" else "agent")
    tok = build_tokenizer(out, vocab_size=vocab_size, chat_template=chat_template, style=style, corpus=corpus)
    common = dict(
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
    if arch == "qwen3":
        from transformers import Qwen3Config as Config
        from transformers import Qwen3ForCausalLM as Model

        common["head_dim"] = hidden_size // num_heads
    else:
        from transformers import Qwen2Config as Config
        from transformers import Qwen2ForCausalLM as Model
    torch.manual_seed(seed)
    model = Model(Config(**common))
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(str(out))
    probe = tok.apply_chat_template(
        [
            {"role": "user", "content": "What is 12 + 345? Ünïcödé\tok"},
            {"role": "assistant", "content": "<tool_call>\n{}\n</tool_call>"},
        ],
        tokenize=False,
    )
    loaded = AutoTokenizer.from_pretrained(str(out))
    if loaded.encode(probe, add_special_tokens=False) != tok.encode(probe, add_special_tokens=False):
        raise RuntimeError(
            f"AutoTokenizer loads {out} as {type(loaded).__name__}, which tokenizes differently from "
            "the tokenizer that was saved; this transformers version needs a different arch/style"
        )
    return out
