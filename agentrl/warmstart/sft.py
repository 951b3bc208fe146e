"""The SFT warm start: the supervised stage, on oracle demonstrations and/or chat data.

Owns:

* ``run_sft``: the stage itself, driven through the shared ``agentrl.trainer.Trainer`` with
  ``policy_loss="sft"`` (masked NLL); it has no training loop of its own. Its data: oracle tool-use
  demonstrations of ``code_exec`` (``agentrl.warmstart.demos``: token-exact with the model's own chat
  template and ``model.tool_prompt``, each checked; a failed check stops the stage with a
  ``DemonstrationError``) and user chat data (``agentrl.warmstart.chat_data.load_chat_jsonl``).
  A fraction ``direct_frac`` of the demonstrations answer at once, without the tool, as a chat model
  often does with arithmetic: the corpus then mixes both habits, like real chat data, and the SFT
  model inherits the mix. Which habit pays is left to RL to find (a tiny model's mental arithmetic is
  mostly wrong).
* ``build_sft_config``: the ``sft`` section from overrides, with the checks across its fields.

Fields left null take the recipe for a pretrained model (``agentrl.warmstart.config.resolve``).
Does not: decide the default model's size or budget (``agentrl.warmstart.default_model``) or evaluate.
The demonstration names (``make_demonstrations``, ``OracleSandbox``, ``oracle_turn``, ...) are
re-exported from ``agentrl.warmstart.demos``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from agentrl.common.memory import release, tune_allocator
from agentrl.common.typed_tree import build, deep_merge, parse_override
from agentrl.episodes.tokenizer import load_chat_tokenizer
from agentrl.episodes.tool_prompt import strip
from agentrl.errors import ConfigError
from agentrl.warmstart.chat_data import SFTExample, load_chat_jsonl
from agentrl.warmstart.config import SFTConfig, resolve  # the tree's sft section, re-exported
from agentrl.warmstart.demos import (  # noqa: F401 - re-exported: their home until 0.3
    OracleSandbox,
    demo_tasks,
    demonstration_examples,
    make_demonstrations,
    oracle_turn,
)
from agentrl.warmstart.demos import run_sync as _run_sync  # noqa: F401 - textworld_demos imports it here


# ------------------------------------------------------------------------------ the SFT stage
def build_sft_config(overrides: list[str] = (), base: dict | None = None) -> SFTConfig:
    """``SFTConfig`` from ``base`` and ``--set name=value`` overrides, validated like the run config."""
    data: dict = dict(base or {})
    for o in overrides:
        data = deep_merge(data, parse_override(o))
    for name in (
        "lr",
        "min_lr_ratio",
        "direct_frac",
    ):  # YAML 1.1 reads "1e-3" as a string; accept it as the number it is
        if isinstance(data.get(name), str):
            try:
                data[name] = float(data[name])
            except ValueError:
                pass
    cfg = build(SFTConfig, data, "sft")
    if cfg.batching not in ("pad", "pack"):
        raise ConfigError(f"sft.batching: {cfg.batching!r} is not one of ['pad', 'pack']")
    if cfg.demo_sandbox not in ("oracle", "env"):
        raise ConfigError(f"sft.demo_sandbox: {cfg.demo_sandbox!r} is not one of ['oracle', 'env']")
    from agentrl.envs.tasks import DIFFICULTIES  # lazy: pulls in gymnasium

    if not cfg.difficulty or any(d not in DIFFICULTIES for d in cfg.difficulty):
        raise ConfigError(f"sft.difficulty: {cfg.difficulty!r} must be a non-empty list of {list(DIFFICULTIES)}")
    if 5 in cfg.difficulty and cfg.demo_sandbox == "oracle" and cfg.num_demos != 0:
        raise ConfigError(
            f"sft.difficulty: {cfg.difficulty!r} holds 5 (function tasks graded by unit tests run as a file), which "
            "sft.demo_sandbox='oracle' cannot grade; set sft.demo_sandbox=env or leave 5 out"
        )
    return cfg


def run_sft(
    model_path: str | Path,
    out_dir: str | Path,
    cfg: SFTConfig | None = None,
    *,
    data: Iterable[str | Path] = (),
    examples: list[SFTExample] | None = None,
    log: Callable[[int, dict], None] | None = None,
    chat_template: str | None = None,
    tool_prompt: str | None = None,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Fine-tune ``model_path`` on demonstrations (``cfg.num_demos``) plus chat JSONL ``data`` (and
    any ready ``examples``) with the shared Trainer (``policy_loss="sft"``); write an HF model
    directory (weights + tokenizer) to ``out_dir``. Returns a summary (losses, timings, counts).
    ``cfg``'s null fields take the pretrained recipe (``resolve``). ``log(step, metrics)`` is called
    after every step (metrics: the trainer's, ``tokens``, ``tokens_per_s``, ``step_time_s``...);
    ``say(line)`` gets what the stage chose and made (the recipe, the chat setup, the data).
    ``chat_template`` / ``tool_prompt`` (the ``model.*`` fields; both None: the tokenizer as it is) set
    up the tokenizer chats are rendered with, as a run does (``agentrl.episodes.tokenizer``); a
    ``chat_template`` is written into the output's tokenizer, so the model renders as it was trained."""
    import random
    import time

    from transformers import AutoTokenizer

    from agentrl.trainer import Trainer, TrainerConfig, TrainSample  # lazy: pulls in torch
    from agentrl.trainer.checkpoint import write_hf  # lazy: pulls in torch

    say = say or (lambda line: None)
    cfg, chosen = resolve(cfg or SFTConfig())
    if chosen:
        say(f"sft: {chosen}")
    t0 = time.perf_counter()
    if chat_template is None and tool_prompt is None:
        tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    else:
        tokenizer, setup = load_chat_tokenizer(model_path, chat_template, tool_prompt or "auto")
        say(setup.line())
    pool: list[SFTExample] = list(examples or [])
    for path in data:
        pool += load_chat_jsonl(path, tokenizer)
    n_demos = 0
    if cfg.num_demos:
        env_kwargs = dict(cfg.env_kwargs)
        if cfg.demo_sandbox == "oracle":
            env_kwargs.setdefault("sandbox", OracleSandbox())
        demos = demonstration_examples(
            tokenizer,
            cfg.num_demos,
            difficulty=cfg.difficulty,
            seed=cfg.seed,
            direct_frac=cfg.direct_frac,
            env_kwargs=env_kwargs,
            sandbox=cfg.demo_sandbox,
        )
        pool += demos
        n_demos = len(demos)
        say(
            f"sft: {n_demos} oracle demonstrations made and checked in {time.perf_counter() - t0:.0f} s "
            f"({sum(len(e.token_ids) for e in demos) / n_demos:.0f} tokens each, "
            f"{sum(e.num_target for e in demos) / n_demos:.0f} of them trained)"
        )
    if not pool:
        raise ConfigError("nothing to train on: sft.num_demos is 0 and no --data was given")
    t_data = time.perf_counter() - t0
    longest = max(len(e.token_ids) for e in pool)
    tcfg = TrainerConfig(
        policy_loss="sft",
        lr=cfg.lr,
        lr_schedule="cosine",
        warmup_steps=min(cfg.warmup_steps, cfg.steps - 1),
        total_steps=cfg.steps,
        min_lr_ratio=cfg.min_lr_ratio,
        adam_betas=[0.9, 0.95],
        micro_batch_tokens=max(cfg.micro_batch_tokens, longest),
        batching=cfg.batching,
        device=cfg.device,
        param_dtype=cfg.param_dtype,
        seed=cfg.seed,
    )
    rng = random.Random(cfg.seed)
    order: list[int] = []
    losses: list[float] = []
    tokens = 0
    tune_allocator()  # before the trainer's threads start (agentrl.common.memory says why)
    with Trainer(str(model_path), tcfg) as trainer:
        t_train = time.perf_counter()
        for step in range(1, cfg.steps + 1):
            if len(order) < cfg.batch_size:  # epochs of shuffled examples, batches never straddle a reshuffle gap
                idx = list(range(len(pool)))
                rng.shuffle(idx)
                order += idx
            batch = [pool[i] for i in order[: cfg.batch_size]]
            del order[: cfg.batch_size]
            metrics = trainer.train_step(
                [
                    TrainSample(e.token_ids, e.loss_mask, [0.0] * len(e.token_ids), [0.0] * len(e.token_ids))
                    for e in batch
                ]
            )
            release()
            losses.append(metrics["loss"])
            tokens += int(metrics.get("tokens", sum(len(e.token_ids) for e in batch)))
            if log is not None:
                log(step, metrics)
        train_s = time.perf_counter() - t_train
        out = Path(out_dir)
        write_hf(out, trainer.full_state_dict(), trainer.model, str(model_path))
    if chat_template is not None:
        _keep_template(tokenizer, out)
    return {
        "model": str(out),
        "base_model": str(model_path),
        "steps": cfg.steps,
        "batch_size": cfg.batch_size,
        "lr": cfg.lr,
        "examples": len(pool),
        "demonstrations": n_demos,
        "target_tokens": sum(e.num_target for e in pool),
        "loss_first": losses[0],
        "loss_last": sum(losses[-10:]) / len(losses[-10:]),
        "trained_tokens": tokens,
        "tokens_per_s": round(tokens / max(train_s, 1e-9), 1),
        "data_s": round(t_data, 2),
        "train_s": round(time.perf_counter() - t0 - t_data, 2),
    }


def _keep_template(tokenizer, out: Path) -> None:
    """Save ``model.chat_template`` (without agentrl's tool prompt, which every job applies itself from
    ``model.tool_prompt``) with the output's tokenizer: the model was trained on that template."""
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(str(out))
    saved.chat_template = strip(tokenizer.chat_template)
    saved.save_pretrained(str(out))
