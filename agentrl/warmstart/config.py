"""The ``sft`` section of the one config tree: the knobs of the supervised warm start.

Owns :class:`SFTConfig` (every field documented, with its range), re-exported by
``agentrl.config.schema`` as ``RunConfig.sft`` and by ``agentrl.warmstart.sft``, and the recipe for a
pretrained model (``PRETRAINED``, laid by :func:`resolve` over the fields left null). ``agentrl sft``
reads it (``--set sft.lr=1e-3``); ``agentrl run`` does not (the built-in model's warm start is
``agentrl.warmstart.default_model.WARM_START`` and ``WARM_START_BATCHING``, which set every field
``PRETRAINED`` would).
Does not train (``agentrl.warmstart.sft``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from agentrl.common.fields import doc

#: What a null field becomes: the recipe for a pretrained model (``--model``), where the built-in
#: tiny model's 3e-3 (it starts from random weights) would wreck what the model knows. 5e-5 is the
#: Hugging Face Trainer's default (TRL's SFT uses 2e-5 for 0.5-7B models); a small instruct model
#: learns the demonstrations' two-turn tool format within a few dozen steps at it. Micro-batches of
#: 1024 tokens halve a 135M model's peak memory on CPU (activations of 30 layers) at no cost in speed.
#: ``num_demos``: each demonstration is seen once; ``warmup_steps``: a tenth of the steps.
PRETRAINED = dict(lr=5e-5, steps=60, batch_size=16, micro_batch_tokens=1024)


@dataclass
class SFTConfig:
    """The SFT stage's knobs (``agentrl sft --set sft.name=value``)."""

    steps: int | None = doc(
        None,
        "Optimizer steps. null: 60 for a --model (a pretrained model; ~40 min for a 135M model on 2 CPU cores); "
        "without --model, the built-in model's warm start sets 400.",
        min=1,
    )
    batch_size: int | None = doc(
        None, "Sequences per optimizer step. null: 16 for a --model; the built-in model's warm start sets 32.", min=1
    )
    lr: float | None = doc(
        None,
        "AdamW peak learning rate (cosine decay to min_lr_ratio * lr). null: 5e-5 for a --model (a pretrained "
        "model; HF Trainer's default, TRL's SFT uses 2e-5); the built-in model's warm start sets 3e-3 (it starts "
        "from random weights: such a rate wrecks a pretrained model).",
        min=0.0,
    )
    warmup_steps: int | None = doc(
        None, "Linear warmup steps. null: a tenth of the steps; the built-in model's warm start sets 20.", min=0
    )
    min_lr_ratio: float = doc(0.1, "Cosine floor as a fraction of lr.", min=0.0, max=1.0)
    num_demos: int | None = doc(
        None,
        "Oracle demonstrations on code_exec train tasks (0 = only --data). null: steps * batch_size (each "
        "seen once); the built-in model's warm start sets 4000.",
        min=0,
    )
    difficulty: list = doc([1, 2, 3, 4], "Procedural difficulties the demonstrations cycle through.")
    direct_frac: float = doc(
        0.0,
        "Fraction of demonstrations that answer at once without the tool (a mixed-habit corpus, like chat data).",
        min=0.0,
        max=1.0,
    )
    env_kwargs: dict = doc({}, "Extra code_exec kwargs for the demonstrations (parser, tools, ...).")
    demo_sandbox: Literal["oracle", "env"] = doc(
        "oracle",
        "'oracle': run the reference programs in-process (trusted code, ~15x faster; difficulties 1-4 "
        "only); 'env': in the env's own sandbox, as RL does.",
    )
    micro_batch_tokens: int | None = doc(
        None,
        "Tokens per trainer micro-batch (gradients accumulate over a step's micro-batches: only the float rounding "
        "changes). null: 1024 for a --model (SmolLM2-135M on 2 CPU cores: 4.8 GB peak instead of 9.9 GB at 4096, "
        "and no slower); the built-in model's warm start sets 4096.",
        min=1,
    )
    batching: Literal["pad", "pack"] = doc(
        "pad", "Trainer layout: 'pad' (fastest for short uniform demos on CPU) or 'pack'."
    )
    device: str = doc("auto", "Trainer device ('auto', 'cpu', 'cuda').")
    param_dtype: Literal["auto", "float32", "bfloat16", "float16"] = doc(
        "auto",
        "Compute dtype of the trainer's forward/backward (master weights and the saved model stay float32): as "
        "trainer.param_dtype. auto: bfloat16 on CUDA, float32 on CPU. bfloat16 on a CPU with AVX512-BF16 or AMX "
        "(`lscpu | grep bf16`) trains SmolLM2-135M 1.6x faster in 0.8x the memory.",
    )
    seed: int = doc(0, "Seeds the demonstration tasks, the data order and the trainer.")
    log_every: int | None = doc(
        None,
        "When stderr is not a terminal, a progress line (loss, trained tokens/s, elapsed) every N steps and at "
        "least once a minute. null: steps // 20 (about 20 lines a run).",
        min=1,
    )


def resolve(cfg: SFTConfig) -> tuple[SFTConfig, str]:
    """``cfg`` with its null fields filled from ``PRETRAINED`` (``num_demos``: steps * batch_size,
    ``warmup_steps``: steps // 10, ``log_every``: steps // 20); and the choices made, as one sentence
    ("" when every field was set)."""
    out = replace(cfg, **{k: v for k, v in PRETRAINED.items() if getattr(cfg, k) is None})
    if out.num_demos is None:
        out.num_demos = out.steps * out.batch_size
    if out.warmup_steps is None:
        out.warmup_steps = out.steps // 10
    if out.log_every is None:
        out.log_every = max(1, out.steps // 20)
    names = ("lr", "steps", "batch_size", "warmup_steps", "num_demos", "micro_batch_tokens")
    chosen = [k for k in names if getattr(cfg, k) is None]
    if not chosen:
        return out, ""
    text = ", ".join(f"sft.{k}={getattr(out, k):g}" for k in chosen)
    return out, f"{text} (the recipe for a pretrained model; --set sft.NAME=VALUE to change)"
