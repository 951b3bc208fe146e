"""Building, starting and releasing the pieces of one attempt of ``agentrl run``: :class:`Parts`.

Owns: ``Parts.build`` (the run directory and its ``config.yaml``, model directory, tokenizer, training
and eval env factories, the compute with its trainer loaded from the newest verified checkpoint on
``--resume``, what that checkpoint resumes (:class:`Resumed`: step, KL coefficient, prompt stream,
finished groups; the logs after it rewound), the replay source, the weight sync), ``start`` (the
engine started and, after a resume, given the checkpoint's weights), ``sync_weights`` (the trainer's
weights pushed to the engine; the last push's stats), ``release`` (the weight sync, the agent proxy's
endpoint, the engine, the compute: the last started first) and :func:`latest_checkpoint`. Each step
that fails closes what the steps before it started. Does not build the pieces themselves
(``agentrl.jobs.build``), open the metric sinks (``agentrl.jobs.run.outputs``) or run the loop
(``agentrl.jobs.run.loop``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.agents.strategy import ProxyStrategy, proxy_strategy_of
from agentrl.batches.ledger import rewind
from agentrl.batches.prompt_stream import PromptStream
from agentrl.batches.replay import ReplaySource
from agentrl.batches.staleness import load_ready
from agentrl.common.cores import CoreShare
from agentrl.config.schema import RunConfig, save_config
from agentrl.engine.counters import EngineCounters
from agentrl.jobs.build import chat_tokenizer, env_factory, eval_env_factory, make_sync, model_dir, start_compute
from agentrl.jobs.rollout import tune_gc
from agentrl.trainer.integrity import pick_resume
from agentrl.weights.drain import weight_update_gate

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from agentrl.config.plan import Plan
    from agentrl.distributed.protocol import Compute
    from agentrl.jobs.build import EnvFactory
    from agentrl.trajectory import Trajectory
    from agentrl.weights.base import SyncStats, WeightSync


def lend_cores(cfg: RunConfig, shared: int, engine: Any, trainer: Any) -> CoreShare | None:
    """With ``engine.lend_idle_cores`` and an in-process engine that takes a share (``LocalEngine.cores``):
    each of the engine and the trainer gets ``shared`` threads (engine.cpu_threads) while both compute and every core of
    this process while it computes alone (the trainer resizes before each micro-batch, the engine before
    each step). None otherwise."""
    if not cfg.engine.lend_idle_cores or not hasattr(engine, "cores"):
        return None
    alone = len(os.sched_getaffinity(0))
    if alone <= shared:
        return None
    share = CoreShare(shared=shared, alone=alone)
    engine.cores = share
    if hasattr(trainer, "before_micro_batch"):  # the in-process Trainer (not a Ray or launched one)
        trainer.before_micro_batch = lambda: share.apply("trainer")
    return share


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint of ``run_dir`` that verifies (marker, sizes, checksums); newer broken
    ones are skipped with a note."""
    return pick_resume(run_dir / "checkpoints")


@dataclass
class Resumed:
    """Where an attempt starts: the checkpoint's state (``checkpoint``), or a fresh run's."""

    checkpoint: Path | None = None
    step: int = 0
    kl_in_reward: float = 0.0
    stream: PromptStream = field(default_factory=PromptStream)
    restored: list[tuple[int | None, list[Trajectory]]] = field(default_factory=list)  # finished groups
    restored_counts: dict[str, int] = field(default_factory=dict)  # the queue's counters


class Parts:
    """The pieces of one attempt, built by :meth:`build`; ``resumed``: what its checkpoint gave (the
    run's loop hands it to the feed)."""

    def __init__(
        self,
        plan: Plan,
        *,
        model_path: Path,
        tokenizer: PreTrainedTokenizerBase,
        chat_line: str,
        make_env: EnvFactory,
        make_eval_env: Callable[[], Any],
        compute: Compute,
        weight_sync: WeightSync,
        replay: ReplaySource | None,
        resumed: Resumed,
    ) -> None:
        self.cfg = plan.cfg
        self.model_path, self.tokenizer, self.chat_line = model_path, tokenizer, chat_line
        self.make_env, self.make_eval_env = make_env, make_eval_env
        self.isolation: str | None = make_env.isolation
        self.compute = compute
        self.trainer, self.engine = compute.trainer, compute.engine
        self.weight_sync, self.replay, self.resumed = weight_sync, replay, resumed
        self.last_sync: SyncStats | None = None  # the last weight push's stats
        self.drain_s = 0.0  # seconds the last push waited for generations in flight (partial_rollouts=false)
        self.engine_counters = EngineCounters(self.engine)  # the local engine's counters, per step
        #: the cores the in-process engine and the trainer lend each other (engine.lend_idle_cores), or None
        self.cores: CoreShare | None = None

    @classmethod
    def build(cls, plan: Plan, run_dir: Path) -> Parts:
        cfg = plan.cfg
        tune_gc()
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.yaml")
        model_path = model_dir(cfg)
        tokenizer, chat = chat_tokenizer(cfg, model_path)
        chat_line = chat.line()
        make_env = env_factory(cfg)
        make_eval_env = eval_env_factory(plan)
        resume = latest_checkpoint(run_dir) if cfg.train.resume else None
        compute, extra = start_compute(plan, model_path, make_env, tokenizer, resume)
        try:
            resumed = Resumed(
                checkpoint=resume,
                step=int(extra.get("step", 0)),
                kl_in_reward=float(extra.get("kl_in_reward", cfg.algo.kl_in_reward or 0.0)),  # adapted: checkpointed
                stream=PromptStream.from_state(
                    extra.get("stream") or {"next": int(extra.get("data_position", 0))},
                    max_drops=cfg.train.max_prompt_drops,
                ),
            )
            if resume:
                rewind(run_dir, resumed.step)  # what happened after the checkpoint is redone
                resumed.restored = load_ready(resume / "rollouts.jsonl")
                resumed.restored_counts = extra.get("queue", {})
            replay = None
            if cfg.train.replay:
                replay = ReplaySource(cfg.train.replay, cfg.train.steps)
            weight_sync = make_sync(plan, compute.engine, model_path)
        except BaseException:  # actors and process groups must not outlive a failed setup
            compute.close()
            raise
        return cls(
            plan,
            model_path=model_path,
            tokenizer=tokenizer,
            chat_line=chat_line,
            make_env=make_env,
            make_eval_env=make_eval_env,
            compute=compute,
            weight_sync=weight_sync,
            replay=replay,
            resumed=resumed,
        )

    @property
    def proxy(self) -> ProxyStrategy | None:
        """The training episodes' agent runner in proxy mode (``agent.kind: proxy``), or None."""
        return proxy_strategy_of(self.compute.episodes)

    async def start(self) -> None:
        """Start the engine (after a resume, serving the checkpoint's weights and version); on
        failure release the weight sync, engine and compute ``build`` left."""
        cfg = self.cfg
        if cfg.engine.cpu_threads:  # after setup: an SFT warm start built there had every core
            import torch

            torch.set_num_threads(cfg.engine.cpu_threads)
            self.cores = lend_cores(cfg, cfg.engine.cpu_threads, self.engine, self.trainer)
        try:
            await self.engine.start()
            if self.trainer.version:  # resumed: the engine must serve the checkpoint's weights and version
                await self.sync_weights()
        except BaseException:  # launched servers, actors and process groups must not outlive a failed start
            await self.weight_sync.close()
            await self.engine.close()
            self.compute.close()
            raise

    async def sync_weights(self) -> float:
        """Gather the trainer's weights and push them through the configured WeightSync; seconds."""
        t0 = time.perf_counter()
        state = await asyncio.to_thread(self.trainer.full_state_dict)
        async with weight_update_gate(
            self.engine, self.compute.remote_gates()
        ) as self.drain_s:  # 0.0 with partial rollouts
            self.last_sync = await self.weight_sync.push(state, self.trainer.version)
        return time.perf_counter() - t0

    async def release(self) -> None:
        """Release what ``build`` and ``start`` made, the last started first."""
        await self.weight_sync.close()
        proxy = self.proxy
        if proxy is not None:  # its endpoint serves the engine: closed before it
            await proxy.close()
        await self.engine.close()
        self.compute.close()  # the trainer's process group; Ray: the actors, placement groups, Ray itself
