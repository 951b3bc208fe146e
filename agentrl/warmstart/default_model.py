"""The built-in default model: a tiny Qwen3 built locally (no network), SFT-warm-started, cached.

Owns the default model's place in the cache (``agentrl.common.paths.cache_dir``), its recipe
(size, tokenizer, SFT budget: ``BASE`` and ``WARM_START``), building each stage once with an
atomic rename under a lock (concurrent runs never see half a model and never build it twice), and
resolving ``model.path`` (the built-in model, a local directory, or a Hub id: ``agentrl.models.hub``).

Cache entries are named by recipe version plus a fingerprint of everything the model was fit to
(the recipe, the chat template, the default ``code_exec`` prompt and tool schema, the task
generator's reference solutions), so editing a prompt or a tool description builds a fresh model
instead of silently reusing one trained on other text. Does not train anything itself
(``agentrl.warmstart.sft``) nor decide what a run does with the model.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from agentrl.common.paths import cache_dir  # lives in agentrl.common.paths; still importable from here
from agentrl.errors import ConfigError
from agentrl.models.hub import resolve_model
from agentrl.warmstart.model_cache import cached, say, sft_progress
from agentrl.warmstart.sft import oracle_turn
from agentrl.warmstart.textworld_model import textworld_model_path
from agentrl.warmstart.tiny_model import _agent_corpus, build_model, qwen25_chat_template

VERSION = "v2"
#: The randomly initialised model (``agentrl.warmstart.tiny_model.build_model`` arguments).
BASE = dict(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=512, vocab_size=2048, arch="qwen3", seed=0)
#: The SFT warm start (``agentrl.warmstart.sft.SFTConfig`` fields).
WARM_START = dict(
    steps=400,
    batch_size=32,
    lr=3e-3,
    warmup_steps=20,
    min_lr_ratio=0.1,
    num_demos=4000,
    difficulty=[1, 2, 3, 4],
    seed=0,
)

#: How the warm start's steps are cut into micro-batches: left out of ``WARM_START`` (and so of the
#: fingerprint), as the trainer's loss denominators are per step and only the float rounding depends on it.
WARM_START_BATCHING = dict(micro_batch_tokens=4096)

#: The null ("auto") trainer fields `agentrl run` fills for the built-in model (BENCHMARKS.md P7):
#: lr 2e-4 (1e-3 collapses); the normalization gains learn at 300 x lr, as RL sharpens through
#: them; a cosine decay to 0.1 x over the run's steps keeps the late, sharp policy stable (at a
#: constant rate the per-step KL grew ~10x after step 100 and the held-out rate fell back).
BUILTIN_RL = dict(lr=2e-4, norm_lr_scale=300.0, lr_schedule="cosine", min_lr_ratio=0.1)


def fingerprint() -> str:
    """Hash of the recipe and of the text the model is fit to (see the module docstring)."""
    from agentrl.envs import tasks  # lazy: pulls in gymnasium

    sample = [tasks.generate_task(i, d, "train") for d in tasks.DIFFICULTIES for i in range(2)]
    parts = {
        "version": VERSION,
        "base": BASE,
        "warm_start": WARM_START,
        "template": qwen25_chat_template(),
        "corpus": _agent_corpus(qwen25_chat_template(), n=8),  # rendered system prompt + tool schemas + tasks
        "demos": [oracle_turn(t, k, t["answer"]) for t in sample for k in (0, 1)],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]


def base_model_path() -> Path:
    """The cached randomly initialised tiny model (no warm start)."""
    dest = cache_dir() / "models" / f"tiny-qwen3-base-{VERSION}-{fingerprint()}"
    return cached(dest, lambda tmp: build_model(tmp, **BASE))


def default_model_path(warm_start: bool = True) -> Path:
    """Path of the cached built-in model, building it first if needed.

    ``warm_start=True`` (default): the base model after the SFT warm start on oracle tool-use
    demonstrations (``WARM_START``; about 2-3 minutes on 2 CPU cores, once). ``False``: the base."""
    base = base_model_path()
    if not warm_start:
        return base
    dest = cache_dir() / "models" / f"tiny-qwen3-sft-{VERSION}-{fingerprint()}"
    if (dest / "config.json").exists():
        return dest

    def build(tmp: Path) -> None:
        from agentrl.warmstart.sft import SFTConfig, run_sft  # late-bound: tests replace sft.run_sft

        say(f"building the built-in model's SFT warm start in {dest} (first use only; a few minutes on CPU)")
        t0 = time.perf_counter()
        log = sft_progress("built-in model warm start", WARM_START["steps"], every=100, min_interval_s=60)
        summary = run_sft(base, tmp, SFTConfig(**WARM_START, **WARM_START_BATCHING), log=log)
        summary["model"] = str(dest)  # where it lives once renamed into place
        (tmp / "sft_summary.json").write_text(json.dumps(summary, indent=2))
        say(
            f"warm start done in {time.perf_counter() - t0:.0f} s (loss {summary['loss_first']:.2f} -> "
            f"{summary['loss_last']:.3f})"
        )

    return cached(dest, build)


def resolve_model_path(path: str | None, revision: str | None = None) -> Path:
    """The one entry point from ``model.path`` (and ``model.revision``) to a local model directory:
    the built-in model for None; its TextWorld warm start for ``builtin:textworld``
    (``agentrl.warmstart.textworld_model``); else a local HF directory, or a Hub id ('org/name[@revision]')
    fetched into the HF cache, by ``agentrl.models.hub.resolve_model`` (ConfigError if unusable)."""
    if path == "builtin:textworld":  # the TextWorld warm start (agentrl.warmstart.textworld_model)
        return textworld_model_path()
    if path is None:
        if revision is not None:
            raise ConfigError(
                f"model.revision: {revision!r} needs a Hub id in model.path (it is null: the built-in model)"
            )
        return default_model_path()

    return resolve_model(path, revision)
