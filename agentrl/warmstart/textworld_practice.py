"""A TextWorld start that practised a few fixed worlds: TextWorld's base (``TEXTWORLD_BASE``) SFT-trained
in a few minutes on varied explorer games of the first ``worlds`` train worlds, the worlds a run with
``env.kwargs.worlds`` set to the same number then practises.

What it is for: a start that solves a part of those worlds' episodes and fails the rest (by wandering
or by writing a broken call), built in 4-9 minutes on 2 CPU cores (by machine), where the built-in warm start
(``agentrl.warmstart.textworld_model``) takes ~50. The measurement that GiGPO learns on practised worlds
and the credit comparison there (``bench/bench_credit.py --env textworld --model practice``) start
from it. It memorized its games:
on its 4 worlds it solves 26 of 64 episodes at temperature 0.5 and 6 of 64 at 1 (BENCHMARKS.md,
issue 15), and nothing of worlds it has not seen.

Recipe (``PRACTICE``): up to ``variants`` games per world, one per distinct randomized explorer plan
(``textworld_demonstrations(..., variants=N)``; 174 games for 4 worlds at 50), the loss on every token after the first
(as the built-in warm start), the built-in warm start's shared SFT settings at ``steps`` steps and ``lr``, on torch's
threads (every core; on 2 cores 1.65x faster than the 1 thread the starts of BENCHMARKS.md issue 15 were built on), in
micro-batches of 2,048 tokens (one game each: a game is 1,300-2,100 tokens; packs of 8,192 made every step ~35 %
slower on 2 cores). The thread count, the micro-batches and the CPU change float sums, so starts built differently
differ (34 vs 35 of 64 solved on two machines; 34 with packs of 8,192 vs 42 with one game, on one machine). Does not:
train (``agentrl.warmstart.sft``) or make demonstrations (``agentrl.warmstart.textworld_demos``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from agentrl.common.paths import cache_dir
from agentrl.warmstart.model_cache import cached, say, sft_progress
from agentrl.warmstart.sft import SFTConfig, run_sft
from agentrl.warmstart.textworld_demos import textworld_demonstrations
from agentrl.warmstart.textworld_model import SHARED_SFT, TEXTWORLD_BASE, loss_on_every_token, textworld_base_path
from agentrl.warmstart.tiny_model import build_model

#: up to ``variants`` explorer games per world; SFT fields (``agentrl.warmstart.sft.SFTConfig``)
PRACTICE = dict(
    variants=50, difficulty=1, sft=dict(SHARED_SFT, steps=200, lr=3e-3, warmup_steps=10, micro_batch_tokens=2048)
)


def build_practice_start(dest: Path, worlds: int, log: Callable[[int, dict], None] | None = None) -> Path:
    """Build the start of ``worlds`` practised worlds into ``dest`` (from a fresh base, in a temp dir); ``dest``.
    ``log(step, metrics)``: called after every SFT step."""
    import tempfile

    from transformers import AutoTokenizer

    if worlds < 1:
        raise ValueError(f"worlds must be >= 1 (the fixed train worlds to practise), got {worlds}")
    cfg = SFTConfig(**PRACTICE["sft"], num_demos=0)
    with tempfile.TemporaryDirectory(prefix="textworld-base-") as tmp:
        base = build_model(Path(tmp) / "base", **TEXTWORLD_BASE)
        tok = AutoTokenizer.from_pretrained(str(base))
        demos = textworld_demonstrations(
            tok, worlds, difficulty=[PRACTICE["difficulty"]], variants=PRACTICE["variants"]
        )
        run_sft(base, dest, cfg, examples=loss_on_every_token(demos), log=log)
    return Path(dest)


def practice_model_path(worlds: int) -> Path:
    """The cached practice start of ``worlds`` worlds (``cache_dir()/models``), built first if needed. Keyed
    by the base, the recipe, the world count and one demonstration's token ids (so editing the env's
    prompt or tools builds a fresh start, as for the built-in warm start)."""
    from transformers import AutoTokenizer

    base = textworld_base_path()
    demo = textworld_demonstrations(AutoTokenizer.from_pretrained(str(base)), 1, difficulty=[PRACTICE["difficulty"]])
    parts = {"base": base.name, "recipe": PRACTICE, "worlds": worlds, "demo": demo[0].token_ids}
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]
    dest = cache_dir() / "models" / f"tiny-qwen3-textworld-practice-{worlds}w-{key}"
    if (dest / "config.json").exists():
        return dest

    def build(tmp: Path) -> None:
        say(f"building the TextWorld practice start of {worlds} worlds in {dest} (first use only; 4-9 min on 2 cores)")
        progress = sft_progress("TextWorld practice start", int(PRACTICE["sft"]["steps"]), every=50)
        build_practice_start(tmp, worlds, log=progress)

    return cached(dest, build)
