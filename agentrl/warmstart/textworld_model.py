"""The built-in TextWorld model: a tiny base with a TextWorld-aware tokenizer, SFT-warm-started on the
explorer's TextWorld play, cached.

Owns the recipe of the ``TextWorld-v0`` warm start (``TEXTWORLD_BASE``: the base's shape and
tokenizer; ``TEXTWORLD_WARM_START``: demonstrations, their difficulty, the SFT budget) and their
cache entries beside the default model's (``tiny-qwen3-textworld-base-<version>-<fingerprint>``,
``tiny-qwen3-textworld-sft-<version>-<fingerprint>`` under ``cache_dir()/models``), built once
under the same lock-and-rename as the default model (``agentrl.warmstart.model_cache``).
``model.path: builtin:textworld`` selects it (``agentrl.warmstart.default_model.resolve_model_path``;
TextWorld's run recipe, ``agentrl.envs.recipes``, sets it).

The base has the default model's shape but its own tokenizer (``style="words"``, trained on rendered
TextWorld play as well as the code_exec text): the default tokenizer, trained on code_exec text only,
spelt TextWorld's names nearly letter by letter ("laundry room" was 9 ids) and differently in an
observation and in the call that copies it; with whole-word pieces a name is the same 1-2 ids in
both, as with a real LLM's vocabulary, and a game is ~30 % fewer ids (1,608 against 2,270 on
average at difficulty 1). The code_exec warm start and its cache key are untouched by this recipe.

Why this recipe (BENCHMARKS.md, issue 15): the oracle plans with full knowledge of where the goal
object hides, which a policy reading the transcript does not have, so v1 imitated it and learnt the
plan's shape, not where its actions come from (0 of 32 held-out worlds). v2 and v3 imitate the explorer
(``agentrl.envs.textworld.explorer``), whose every action follows from what the transcript shows.
Short budgets (300 steps, any width or depth tried) stall at ~25 % of turns right under teacher
forcing; v3 (4,000 games, the loss on every token, 1,500 steps: ~45 minutes here) gets 89 % and solves 4
of 64 held-out worlds, the first that solves any (BENCHMARKS.md has each budget's figures). The
explorer's demonstrations are about twice as long as the oracle's (17 actions median against 8).

Fingerprint: the recipe plus a sample of the demonstrations' token ids (prompt, tool schemas, the
explorer's turns), so editing the env's prompt or tools builds a fresh model. Does not: train
(``agentrl.warmstart.sft.run_sft``) or make demonstrations (``agentrl.warmstart.textworld_demos``).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from agentrl.common.paths import cache_dir
from agentrl.warmstart.model_cache import cached, say

VERSION = "v3"

#: The TextWorld warm start: ``num_demos`` demonstrations of ``planner`` on train worlds of
#: ``difficulty`` (``agentrl.warmstart.textworld_demos``), the loss on the model's turns only
#: (``loss_on="turns"``) or on every token of the game after the first (``"all"``: the observations
#: too, so the model also learns the world's text, where names are copied all the time: "You open
#: drawer 2: drawer 2 (empty)."), then ``agentrl.warmstart.sft.SFTConfig`` fields.
TEXTWORLD_WARM_START = dict(
    num_demos=4000,
    difficulty=[1],
    demo_seed=0,
    planner="explorer",
    loss_on="all",
    sft=dict(
        steps=1500,
        batch_size=8,
        lr=3e-3,
        warmup_steps=75,
        min_lr_ratio=0.1,
        seed=0,
        micro_batch_tokens=8192,
        batching="pack",
    ),
)
#: The base: the default model's shape (``agentrl.warmstart.default_model.BASE``) with its own
#: tokenizer, word-level and trained on TextWorld play too (``agentrl.warmstart.tiny_model``).
TEXTWORLD_BASE = dict(
    hidden_size=128,
    num_layers=2,
    num_heads=4,
    intermediate_size=512,
    vocab_size=2048,
    arch="qwen3",
    seed=0,
    tokenizer_style="words",
    corpus="textworld",
)
#: The name ``model.path`` gives it.
BUILTIN_NAME = "builtin:textworld"


def _demos(tokenizer, n: int) -> list:
    from agentrl.warmstart.textworld_demos import textworld_demonstrations

    r = TEXTWORLD_WARM_START
    return textworld_demonstrations(
        tokenizer, n, difficulty=list(r["difficulty"]), seed=int(r["demo_seed"]), planner=str(r["planner"])
    )


def base_fingerprint() -> str:
    """Hash of the base's recipe and of the text its tokenizer is trained on."""
    from agentrl.warmstart.textworld_demos import textworld_corpus
    from agentrl.warmstart.tiny_model import _byte_tokenizer, qwen25_chat_template

    corpus = textworld_corpus(_byte_tokenizer(qwen25_chat_template()), n=3)
    parts = {"version": VERSION, "base": TEXTWORLD_BASE, "corpus": corpus}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]


def textworld_base_path() -> Path:
    """The cached randomly initialised TextWorld base (``TEXTWORLD_BASE``), built first if needed (seconds)."""
    from agentrl.warmstart.tiny_model import build_model

    dest = cache_dir() / "models" / f"tiny-qwen3-textworld-base-{VERSION}-{base_fingerprint()}"
    return cached(dest, lambda tmp: build_model(tmp, **TEXTWORLD_BASE))


def fingerprint(base: Path) -> str:
    """Hash of the recipe and of two demonstrations' tokens (see the module docstring)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base))
    sample = [d.token_ids for d in _demos(tok, 2)]
    parts = {"version": VERSION, "base": base.name, "recipe": TEXTWORLD_WARM_START, "demos": sample}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]


def textworld_model_path(base: Path | None = None) -> Path:
    """Path of the cached TextWorld warm start of ``base`` (default: ``textworld_base_path()``),
    building it first if needed (once; ~45 minutes on 2 CPU cores, saying its progress)."""
    base = base or textworld_base_path()
    dest = cache_dir() / "models" / f"tiny-qwen3-textworld-sft-{VERSION}-{fingerprint(base)}"
    if (dest / "config.json").exists():
        return dest

    def build(tmp: Path) -> None:
        from transformers import AutoTokenizer

        from agentrl.warmstart.chat_data import SFTExample
        from agentrl.warmstart.sft import SFTConfig, run_sft

        say(f"building the TextWorld warm start in {dest} (first use only; ~45 minutes on 2 CPU cores)")
        t0 = time.perf_counter()
        r = TEXTWORLD_WARM_START
        examples = _demos(AutoTokenizer.from_pretrained(str(base)), int(r["num_demos"]))
        if len(examples) < int(r["num_demos"]):
            raise RuntimeError(f"only {len(examples)} of {r['num_demos']} TextWorld demonstrations succeeded")
        if r["loss_on"] not in ("turns", "all"):
            raise ValueError(f"TEXTWORLD_WARM_START loss_on must be 'turns' or 'all', got {r['loss_on']!r}")
        if r["loss_on"] == "all":
            examples = [SFTExample(e.token_ids, [0] + [1] * (len(e.token_ids) - 1), e.source) for e in examples]
        steps = int(r["sft"]["steps"])

        def progress(step: int, metrics: dict) -> None:  # a long build: say where it is
            if step % 100 == 0 or step == steps:
                say(
                    f"TextWorld warm start: step {step}/{steps}, loss {metrics['loss']:.3f}, "
                    f"{time.perf_counter() - t0:.0f} s"
                )

        summary = run_sft(base, tmp, SFTConfig(**r["sft"], num_demos=0), examples=examples, log=progress)
        summary["model"] = str(dest)
        summary["recipe"] = r
        (tmp / "sft_summary.json").write_text(json.dumps(summary, indent=2))
        say(
            f"TextWorld warm start done in {time.perf_counter() - t0:.0f} s (loss {summary['loss_first']:.2f} -> "
            f"{summary['loss_last']:.3f})"
        )

    return cached(dest, build)
