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
of 64 held-out worlds, the first that solves any, but too few for RL to learn from: a group of 8
episodes holds no success most of the time. v4 is v3 plus a second phase (1,200 steps at a third of the
lr over 8,000 games, v3's 4,000 and 4,000 more): on 256 held-out worlds it solves 35 at temperature 1
and 49 at 0.4, where its first phase (the v3 recipe) solves 26 and 27 (BENCHMARKS.md, issue 15, has
each budget's figures). The explorer's demonstrations are about twice as long as the oracle's (17
actions median against 8).

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
from agentrl.warmstart.chat_data import SFTExample
from agentrl.warmstart.model_cache import cached, say, sft_progress
from agentrl.warmstart.textworld_demos import textworld_corpus, textworld_demonstrations
from agentrl.warmstart.tiny_model import _byte_tokenizer, build_model, qwen25_chat_template

VERSION = "v4"

#: The TextWorld warm start: demonstrations of ``planner`` on train worlds of ``difficulty``
#: (``agentrl.warmstart.textworld_demos``), the loss on the model's turns only (``loss_on="turns"``)
#: or on every token of the game after the first (``"all"``: the observations too, so the model also
#: learns the world's text, where names are copied all the time: "You open drawer 2: drawer 2
#: (empty)."), trained in ``phases``, each from the previous one's model: ``num_demos`` (the first
#: ``num_demos`` of the same sequence of worlds) and ``agentrl.warmstart.sft.SFTConfig`` fields.
#: Each phase's model is a cache entry of its own, so an interrupted build resumes at its phase.
#: SFT settings both phases share (``agentrl.warmstart.sft.SFTConfig`` fields).
SHARED_SFT = dict(batch_size=8, min_lr_ratio=0.1, seed=0, micro_batch_tokens=8192, batching="pack")
TEXTWORLD_WARM_START = dict(
    difficulty=[1],
    demo_seed=0,
    planner="explorer",
    loss_on="all",
    phases=[
        dict(num_demos=4000, sft=dict(SHARED_SFT, steps=1500, lr=3e-3, warmup_steps=75)),
        dict(num_demos=8000, sft=dict(SHARED_SFT, steps=1200, lr=1e-3, warmup_steps=60)),
    ],
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
    r = TEXTWORLD_WARM_START
    return textworld_demonstrations(
        tokenizer, n, difficulty=list(r["difficulty"]), seed=int(r["demo_seed"]), planner=str(r["planner"])
    )


def base_fingerprint() -> str:
    """Hash of the base's recipe and of the text its tokenizer is trained on."""
    corpus = textworld_corpus(_byte_tokenizer(qwen25_chat_template()), n=3)
    parts = {"version": VERSION, "base": TEXTWORLD_BASE, "corpus": corpus}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]


def textworld_base_path() -> Path:
    """The cached randomly initialised TextWorld base (``TEXTWORLD_BASE``), built first if needed (seconds)."""
    dest = cache_dir() / "models" / f"tiny-qwen3-textworld-base-{VERSION}-{base_fingerprint()}"
    return cached(dest, lambda tmp: build_model(tmp, **TEXTWORLD_BASE))


def fingerprint(base: Path, phases: int | None = None) -> str:
    """Hash of the recipe (its first ``phases`` phases; default all) and of two demonstrations' tokens
    (see the module docstring)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base))
    sample = [d.token_ids for d in _demos(tok, 2)]
    recipe = dict(TEXTWORLD_WARM_START, phases=list(TEXTWORLD_WARM_START["phases"])[:phases])
    parts = {"version": VERSION, "base": base.name, "recipe": recipe, "demos": sample}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]


def textworld_model_path(base: Path | None = None) -> Path:
    """Path of the cached TextWorld warm start of ``base`` (default: ``textworld_base_path()``),
    building it first if needed (once; ~50 minutes on 2 CPU cores, saying its progress), phase by
    phase: each phase's model is cached, so a build stopped in phase 2 starts again from phase 1's."""
    r = TEXTWORLD_WARM_START
    if r["loss_on"] not in ("turns", "all"):
        raise ValueError(f"TEXTWORLD_WARM_START loss_on must be 'turns' or 'all', got {r['loss_on']!r}")
    phases = list(r["phases"])
    if not phases:
        raise ValueError("TEXTWORLD_WARM_START phases is empty: nothing to train")
    base = base or textworld_base_path()
    model = base
    for k in range(1, len(phases) + 1):
        tag = "" if k == len(phases) else f"-phase{k}of{len(phases)}"
        dest = cache_dir() / "models" / f"tiny-qwen3-textworld-sft-{VERSION}{tag}-{fingerprint(base, k)}"
        model = _phase(model, dest, k)
    return model


def loss_on_every_token(examples: list) -> list:
    """``examples`` with the loss on every token after the first (``loss_on="all"``): the observations too."""
    return [SFTExample(e.token_ids, [0] + [1] * (len(e.token_ids) - 1), e.source) for e in examples]


def _phase(start: Path, dest: Path, k: int) -> Path:
    """``dest``: phase ``k`` of the recipe trained from ``start``, built once (``cached``)."""
    if (dest / "config.json").exists():
        return dest
    r = TEXTWORLD_WARM_START
    phase, n = r["phases"][k - 1], len(r["phases"])

    def build(tmp: Path) -> None:
        from transformers import AutoTokenizer

        from agentrl.warmstart.sft import SFTConfig, run_sft  # late-bound: tests replace sft.run_sft

        say(
            f"building the TextWorld warm start, phase {k} of {n}, in {dest} "
            "(first use only; ~50 minutes in all on 2 CPU cores)"
        )
        t0 = time.perf_counter()
        examples = _demos(AutoTokenizer.from_pretrained(str(start)), int(phase["num_demos"]))
        if len(examples) < int(phase["num_demos"]):
            raise RuntimeError(f"only {len(examples)} of {phase['num_demos']} TextWorld demonstrations succeeded")
        if r["loss_on"] == "all":
            examples = loss_on_every_token(examples)
        progress = sft_progress(f"TextWorld warm start: phase {k}/{n}", int(phase["sft"]["steps"]))
        summary = run_sft(start, tmp, SFTConfig(**phase["sft"], num_demos=0), examples=examples, log=progress)
        summary.update(model=str(dest), phase=k, recipe=r)
        (tmp / "sft_summary.json").write_text(json.dumps(summary, indent=2))
        say(
            f"TextWorld warm start phase {k}/{n} done in {time.perf_counter() - t0:.0f} s "
            f"(loss {summary['loss_first']:.2f} -> {summary['loss_last']:.3f})"
        )

    return cached(dest, build)
