"""The built-in TextWorld model: the built-in tiny base, SFT-warm-started on oracle TextWorld play, cached.

Owns the recipe of the ``TextWorld-v0`` warm start (``TEXTWORLD_WARM_START``: demonstrations, their
difficulty, the SFT budget) and its cache entry beside the default model's
(``tiny-qwen3-textworld-sft-<version>-<fingerprint>`` under ``cache_dir()/models``), built once
under the same lock-and-rename as the default model (``agentrl.warmstart.model_cache``).
``model.path: builtin:textworld`` selects it (``agentrl.warmstart.default_model.resolve_model_path``;
``configs/textworld.yaml`` sets it).

The base is the default model's own randomly initialised tiny Qwen3 (``base_model_path``, same
tokenizer), so the code_exec warm start and its cache key are untouched by this recipe.

Why this recipe (BENCHMARKS.md, issue 15): the oracle plans with full knowledge of where the goal
object hides, which a policy reading the transcript does not have, so v1 imitated it and learnt the
plan's shape, not where its actions come from (0 of 32 held-out worlds). v2 imitates the explorer
(``agentrl.envs.textworld.explorer``), whose every action follows from what the transcript shows.
Measured: 400 demonstrations x 60 steps of 8 (148 s here) still writes broken calls at T = 1; 2,000 x
300 steps (809 s) writes valid calls in the explorer's order but makes up the names it should copy
from the observation; both solve 0 held-out worlds (difficulty 1, 30 turns). This tiny base does not
copy names out of a long context at these budgets, so the cheap recipe is the one shipped. The
explorer's demonstrations are about twice as long as the oracle's (17 actions median against 8).

Fingerprint: the recipe plus a sample of the demonstrations' token ids (prompt, tool schemas, the
oracle's turns), so editing the env's prompt or tools builds a fresh model. Does not: train
(``agentrl.warmstart.sft.run_sft``) or make demonstrations (``agentrl.warmstart.textworld_demos``).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from agentrl.common.paths import cache_dir
from agentrl.warmstart.model_cache import cached, say

VERSION = "v2"

#: The TextWorld warm start: ``num_demos`` oracle demonstrations on train worlds of ``difficulty``
#: (``agentrl.warmstart.textworld_demos``), then ``agentrl.warmstart.sft.SFTConfig`` fields.
TEXTWORLD_WARM_START = dict(
    num_demos=400,
    difficulty=[1],
    demo_seed=0,
    planner="explorer",
    sft=dict(steps=60, batch_size=8, lr=3e-3, warmup_steps=6, min_lr_ratio=0.1, seed=0, micro_batch_tokens=8192),
)
#: The name ``model.path`` gives it.
BUILTIN_NAME = "builtin:textworld"


def _demos(tokenizer, n: int) -> list:
    from agentrl.warmstart.textworld_demos import textworld_demonstrations

    r = TEXTWORLD_WARM_START
    return textworld_demonstrations(
        tokenizer, n, difficulty=list(r["difficulty"]), seed=int(r["demo_seed"]), planner=str(r["planner"])
    )


def fingerprint(base: Path) -> str:
    """Hash of the recipe and of two demonstrations' tokens (see the module docstring)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base))
    sample = [d.token_ids for d in _demos(tok, 2)]
    parts = {"version": VERSION, "base": base.name, "recipe": TEXTWORLD_WARM_START, "demos": sample}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]


def textworld_model_path(base: Path) -> Path:
    """Path of the cached TextWorld warm start of ``base`` (the default model's base:
    ``agentrl.warmstart.default_model.base_model_path``), building it first if needed (a few
    minutes on 2 CPU cores, once)."""
    dest = cache_dir() / "models" / f"tiny-qwen3-textworld-sft-{VERSION}-{fingerprint(base)}"
    if (dest / "config.json").exists():
        return dest

    def build(tmp: Path) -> None:
        from transformers import AutoTokenizer

        from agentrl.warmstart.sft import SFTConfig, run_sft

        say(f"building the TextWorld warm start in {dest} (first use only; a few minutes on CPU)")
        t0 = time.perf_counter()
        r = TEXTWORLD_WARM_START
        examples = _demos(AutoTokenizer.from_pretrained(str(base)), int(r["num_demos"]))
        if len(examples) < int(r["num_demos"]):
            raise RuntimeError(f"only {len(examples)} of {r['num_demos']} TextWorld oracle demonstrations succeeded")
        summary = run_sft(base, tmp, SFTConfig(**r["sft"], num_demos=0), examples=examples)
        summary["model"] = str(dest)
        summary["recipe"] = r
        (tmp / "sft_summary.json").write_text(json.dumps(summary, indent=2))
        say(
            f"TextWorld warm start done in {time.perf_counter() - t0:.0f} s (loss {summary['loss_first']:.2f} -> "
            f"{summary['loss_last']:.3f})"
        )

    return cached(dest, build)
