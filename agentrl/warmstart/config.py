"""The ``sft`` section of the one config tree: the knobs of the supervised warm start.

Owns :class:`SFTConfig` (every field documented, with its range), re-exported by
``agentrl.config.schema`` as ``RunConfig.sft`` and by ``agentrl.warmstart.sft``. ``agentrl sft``
reads it (``--set sft.lr=1e-3``); ``agentrl run`` does not (the built-in model's warm start is
``agentrl.warmstart.default_model.WARM_START``). Does not train (``agentrl.warmstart.sft``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentrl.common.fields import doc


@dataclass
class SFTConfig:
    """The SFT stage's knobs (``agentrl sft --set sft.name=value``)."""

    steps: int = doc(400, "Optimizer steps.", min=1)
    batch_size: int = doc(32, "Sequences per optimizer step.", min=1)
    lr: float = doc(3e-3, "AdamW peak learning rate (cosine decay to min_lr_ratio * lr).", min=0.0)
    warmup_steps: int = doc(20, "Linear warmup steps.", min=0)
    min_lr_ratio: float = doc(0.1, "Cosine floor as a fraction of lr.", min=0.0, max=1.0)
    num_demos: int = doc(4000, "Oracle demonstrations on code_exec train tasks (0 = only --data).", min=0)
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
    micro_batch_tokens: int = doc(4096, "Tokens per trainer micro-batch.", min=1)
    batching: Literal["pad", "pack"] = doc(
        "pad", "Trainer layout: 'pad' (fastest for short uniform demos on CPU) or 'pack'."
    )
    device: str = doc("auto", "Trainer device ('auto', 'cpu', 'cuda').")
    seed: int = doc(0, "Seeds the demonstration tasks, the data order and the trainer.")
