"""The SFT warm start: token-exact oracle demonstrations and the supervised stage.

Owns:

* ``make_demonstrations``: oracle trajectories on an agent env, produced by the *real*
  ``EpisodeManager`` and env (the real python tool runs every program) with a scripted
  ``FakeEngine`` whose "policy" writes the reference turns as token ids. A demonstration therefore
  has exactly the token layout RL sees: prompt ids, sampled-turn ids (mask 1), observation deltas
  (mask 0). Turn 1 calls the tool with the task's reference ``solution``; turn 2 gives the
  answer it printed as ``\\boxed{..}`` (or, for function tasks, the function in a code block).
  A fraction ``direct_frac`` of the demonstrations instead answer at once, without the tool, as a
  chat model often does with arithmetic: the corpus then mixes both habits, like real chat data,
  and the SFT model inherits the mix. Which habit pays is left to RL to find (a tiny model's mental
  arithmetic is mostly wrong).
* user chat data: read by ``agentrl.warmstart.chat_data`` (``load_chat_jsonl``) and mixed in by ``run_sft``.
* ``run_sft``: the stage itself, driven through the shared ``agentrl.trainer.Trainer`` with
  ``policy_loss="sft"`` (masked NLL); it has no training loop of its own.

Does not: decide the default model's size or budget (``agentrl.warmstart.default_model``) or evaluate.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.sandbox.base import Sandbox
from agentrl.warmstart.chat_data import SFTExample, load_chat_jsonl
from agentrl.warmstart.config import SFTConfig  # the tree's sft section, re-exported

_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.DOTALL)
_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


# ------------------------------------------------------------------------------ demonstrations
class OracleSandbox(Sandbox):
    """Runs the oracle's own reference programs (``python3 -`` with the code on stdin) *in this
    process* with ``exec`` and returns what a sandbox would: their real stdout/stderr and exit code,
    as an ``ExecResult``. Spawning a process per demonstration would make data generation, not
    training, the cost of the warm start. Only for trusted code we generated: it isolates nothing,
    has no deadline and no output cap. ``tests/warmstart/test_sft.py`` checks that demonstrations made with it
    are token-identical to ones made with a real sandbox. It cannot grade difficulty-5 tasks (their
    unit tests run as a file): such episodes end ``sandbox_error`` and are dropped, so use
    ``demo_sandbox='env'`` for them."""

    name = "oracle"

    async def run(self, argv, *, stdin: bytes | None = None, timeout_s: float, files=None, **_: Any):
        import contextlib
        import io
        import time
        import traceback

        from agentrl.errors import SandboxError
        from agentrl.sandbox.base import ExecResult

        if list(argv)[-1:] != ["-"] or files:
            raise SandboxError(f"OracleSandbox only runs python programs given on stdin, not {list(argv)!r}")
        out, err, code = io.StringIO(), io.StringIO(), 0
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                exec(
                    compile((stdin or b"").decode("utf-8", "surrogatepass"), "<stdin>", "exec"),
                    {"__name__": "__main__"},
                )
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
                code = 1
        return ExecResult(
            stdout=out.getvalue(), stderr=err.getvalue(), exit_code=code, status="ok", wall_s=time.perf_counter() - t0
        )


def oracle_turn(task: dict, turn: int, observation: str | None, parser: str = "hermes", direct: bool = False) -> str:
    """The reference assistant turn ``turn`` (0 = the tool call, 1 = the final answer) for ``task``;
    ``direct=True``: turn 0 is the final answer itself (the task's known answer, no tool call)."""
    code = task["solution"]
    if direct and turn == 0:
        if task.get("tests"):
            return f"```python\n{task['solution']}\n```"
        return f"The answer is \\boxed{{{task['answer']}}}."
    if turn == 0:
        if task.get("tests"):  # a function task: define it and try it on the first test's call
            call = task["tests"][0].removeprefix("assert ").rsplit(" == ", 1)[0]
            code = f"{code}\n\nprint({call})"
        if parser == "python_block":
            return f"```python\n{code}\n```"
        return "<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"
    if task.get("tests"):
        if parser == "python_block":  # a block would be run, not read: the last code run is the answer
            return f"The function `{task['entry_point']}` I ran above is my solution."
        return f"```python\n{task['solution']}\n```"
    return f"The answer is \\boxed{{{(observation or '').strip()}}}."


def _oracle_policy(tokenizer, tasks_by_prompt: dict[str, dict], parser: str):
    """A FakeEngine policy writing ``oracle_turn``s; a task with ``"direct": True`` is answered at once."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def policy(prompt_ids, params, ctx):
        text = tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        task = tasks_by_prompt[_USER.search(text).group(1)]
        turn = text.count("<|im_start|>assistant") - 1
        responses = _RESPONSE.findall(text)
        reply = oracle_turn(task, turn, responses[-1] if responses else None, parser, bool(task.get("direct")))
        return list(tokenizer.encode(reply, add_special_tokens=False)) + [end]

    return policy


def demo_tasks(
    n: int, difficulty: int | list[int] = (1, 2, 3, 4), seed: int = 0, direct_frac: float = 0.0
) -> list[dict]:
    """``n`` train-split procedural tasks, difficulties cycled (never a held-out prompt); a seeded
    ``direct_frac`` of them marked ``"direct": True`` (demonstrated without the tool)."""
    import random

    from agentrl.envs import tasks

    levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
    rng = random.Random(seed)
    out = [tasks.generate_task(seed * 1_000_003 + i, levels[i % len(levels)], "train") for i in range(n)]
    return [{**t, "direct": True} if rng.random() < direct_frac else t for t in out]


async def make_demonstrations(
    tokenizer, tasks: list[dict], *, env_kwargs: dict | None = None, max_concurrency: int = 16
) -> list[Any]:
    """Oracle ``Trajectory``s for ``tasks`` on ``code_exec`` (see the module docstring). Only
    episodes that ended ``ok`` with reward 1 are returned: a demonstration is always a success."""
    from agentrl.engine.fake import FakeEngine
    from agentrl.envs.registry import make
    from agentrl.episodes.config import RolloutConfig
    from agentrl.episodes.manager import EpisodeManager, EpisodeSpec

    kwargs = dict(env_kwargs or {})
    parser = kwargs.get("parser") or "hermes"
    engine = FakeEngine(_oracle_policy(tokenizer, {t["prompt"]: t for t in tasks}, parser), logprob=0.0)
    cfg = RolloutConfig(max_turns=3, max_concurrency=max_concurrency, max_new_tokens=4096, max_context=1 << 20)
    manager = EpisodeManager(engine, lambda: make("code_exec", **kwargs), tokenizer, cfg, env_id="code_exec")
    specs = [EpisodeSpec(f"demo-{i}", 0, i, options={"task": t}) for i, t in enumerate(tasks)]
    trajs = await manager.collect(specs)
    return [t for t in trajs if t.outcome.value == "ok" and t.reward == 1.0]


def _run_sync(coro):
    """``asyncio.run`` that also works when called from inside a running loop (e.g. a run's setup)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def demonstration_examples(
    tokenizer,
    n: int,
    *,
    difficulty: int | list[int] = (1, 2, 3, 4),
    seed: int = 0,
    direct_frac: float = 0.0,
    env_kwargs: dict | None = None,
) -> list[SFTExample]:
    """``n`` demonstrations as ``SFTExample``s (token ids and loss mask straight from the trajectories)."""
    trajs = _run_sync(
        make_demonstrations(
            tokenizer, demo_tasks(n, difficulty, seed, direct_frac), env_kwargs=env_kwargs, max_concurrency=64
        )
    )
    return [SFTExample(list(t.token_ids), list(t.loss_mask), f"demo:{t.task.get('id', '')}") for t in trajs]


# ------------------------------------------------------------------------------ the SFT stage
def build_sft_config(overrides: list[str] = (), base: dict | None = None) -> SFTConfig:
    """``SFTConfig`` from ``base`` and ``--set name=value`` overrides, validated like the run config."""
    from agentrl.common.typed_tree import build, deep_merge, parse_override

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
    from agentrl.envs.tasks import DIFFICULTIES

    if not cfg.difficulty or any(d not in DIFFICULTIES for d in cfg.difficulty):
        raise ConfigError(f"sft.difficulty: {cfg.difficulty!r} must be a non-empty list of {list(DIFFICULTIES)}")
    return cfg


def run_sft(
    model_path: str | Path,
    out_dir: str | Path,
    cfg: SFTConfig | None = None,
    *,
    data: Iterable[str | Path] = (),
    examples: list[SFTExample] | None = None,
    log=None,
    chat_template: str | None = None,
    tool_prompt: str | None = None,
) -> dict[str, Any]:
    """Fine-tune ``model_path`` on demonstrations (``cfg.num_demos``) plus chat JSONL ``data`` (and
    any ready ``examples``) with the shared Trainer (``policy_loss="sft"``); write an HF model
    directory (weights + tokenizer) to ``out_dir``. Returns a summary (losses, timings, counts).
    ``log(step, metrics)`` is called after every step. ``chat_template`` / ``tool_prompt`` (the
    ``model.*`` fields; both None: the tokenizer as it is) set up the tokenizer chats are rendered
    with, as a run does (``agentrl.episodes.tokenizer``)."""
    import random
    import time

    from transformers import AutoTokenizer

    from agentrl.trainer import Trainer, TrainerConfig, TrainSample
    from agentrl.trainer.checkpoint import write_hf

    cfg = cfg or SFTConfig()
    t0 = time.perf_counter()
    if chat_template is None and tool_prompt is None:
        tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    else:
        from agentrl.episodes.tokenizer import load_chat_tokenizer

        tokenizer, _ = load_chat_tokenizer(model_path, chat_template, tool_prompt or "auto")
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
        )
        if len(demos) < cfg.num_demos:
            raise RuntimeError(
                f"only {len(demos)} of {cfg.num_demos} oracle demonstrations succeeded; "
                "the sandbox or the tasks' reference solutions are broken"
            )
        pool += demos
        n_demos = len(demos)
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
        seed=cfg.seed,
    )
    rng = random.Random(cfg.seed)
    order: list[int] = []
    losses: list[float] = []
    with Trainer(str(model_path), tcfg) as trainer:
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
            losses.append(metrics["loss"])
            if log is not None:
                log(step, metrics)
        out = Path(out_dir)
        write_hf(out, trainer.full_state_dict(), trainer.model, str(model_path))
    return {
        "model": str(out),
        "base_model": str(model_path),
        "steps": cfg.steps,
        "batch_size": cfg.batch_size,
        "examples": len(pool),
        "demonstrations": n_demos,
        "target_tokens": sum(e.num_target for e in pool),
        "loss_first": losses[0],
        "loss_last": sum(losses[-10:]) / len(losses[-10:]),
        "data_s": round(t_data, 2),
        "train_s": round(time.perf_counter() - t0 - t_data, 2),
    }
