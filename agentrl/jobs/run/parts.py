"""Building, starting and releasing the pieces of one ``agentrl run`` (a mixin of ``Runner``).

Owns: ``_setup`` (the run directory and its ``config.yaml``, model directory, tokenizer, training and
eval env factories, the backend with its trainer loaded from the newest verified checkpoint on
``--resume``, the replay source, the weight sync, the metric sinks), ``_start`` (the engine started
and, after a resume, given the checkpoint's weights), ``_teardown`` (everything the run started,
released in reverse order, on success and on failure alike: the producer, the staleness queue, the
display, the sinks, the weight sync, the agent proxy's endpoint, the engine, the backend) and
``_latest_checkpoint``. Each step that fails closes what the steps before it started. Does not
build the pieces (``agentrl.jobs.build``) or run the loop (``agentrl.jobs.run``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agentrl.agents.runner import proxy_runner_of
from agentrl.batches.ledger import rewind
from agentrl.batches.prompt_stream import PromptStream
from agentrl.batches.staleness import load_ready
from agentrl.config.schema import save_config, to_dict
from agentrl.jobs.build import chat_tokenizer, env_factory, eval_env_factory, make_sync, model_dir, start_backend
from agentrl.trainer.integrity import pick_resume


class RunSetup:
    """Setup and teardown of ``Runner`` (reads ``cfg``, ``plan``, ``run_dir``; sets the pieces:
    ``model_path``, ``tokenizer`` (with ``chat_line``, the template and tool prompt it renders with),
    ``make_env``, ``make_eval_env``, ``backend``, ``trainer``, ``engine``, ``weight_sync``, ``sinks``, and
    the resumed state)."""

    def _setup(self) -> None:
        from agentrl.jobs.rollout import tune_gc
        from agentrl.observe.sinks import make_sinks

        cfg = self.cfg
        tune_gc()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir / "config.yaml")
        self.model_path = model_dir(cfg)
        self.tokenizer, chat = chat_tokenizer(cfg, self.model_path)
        self.chat_line = chat.line()
        self.make_env = env_factory(cfg)
        self.isolation = self.make_env.isolation
        self.make_eval_env = eval_env_factory(self.plan)
        resume = self._latest_checkpoint() if cfg.train.resume else None
        self.backend, extra = start_backend(self.plan, self.model_path, self.make_env, self.tokenizer, resume)
        try:
            self.trainer, self.engine = self.backend.trainer, self.backend.engine
            self.step = int(extra.get("step", 0))
            self.kl.value = float(extra.get("kl_in_reward", self.cfg.algo.kl_in_reward or 0.0))  # adapted: checkpointed
            self.stream = PromptStream.from_state(
                extra.get("stream") or {"next": int(extra.get("data_position", 0))},
                max_drops=cfg.train.max_prompt_drops,
            )
            if resume:
                rewind(self.run_dir, self.step)  # what happened after the checkpoint is redone
                self.restored = load_ready(resume / "rollouts.jsonl")
                self.restored_counts = extra.get("queue", {})
            if cfg.train.replay:
                from agentrl.batches.replay import ReplaySource

                self.replay = ReplaySource(cfg.train.replay, cfg.train.steps)
            self.weight_sync = make_sync(self.plan, self.engine, self.model_path)
            self.sinks, warnings = make_sinks(
                self.run_dir,
                tensorboard=cfg.logging.tensorboard,
                wandb_project=cfg.logging.wandb_project,
                config=to_dict(cfg),
                resume_step=self.step if resume is not None else None,
            )
        except BaseException:  # actors and process groups must not outlive a failed setup
            self.backend.close()
            raise
        self.warnings = warnings + ([f"resumed from {resume} at step {self.step}"] if resume else [])

    def _latest_checkpoint(self) -> Path | None:
        # the newest that verifies (marker, sizes, checksums); newer broken ones are skipped with a note
        return pick_resume(self.run_dir / "checkpoints")

    async def _start(self) -> None:
        """Start the engine (after a resume, serving the checkpoint's weights and version); on
        failure release the weight sync, engine and backend ``_setup`` left."""
        cfg = self.cfg
        if cfg.engine.cpu_threads:  # after setup: an SFT warm start built there had every core
            import torch

            torch.set_num_threads(cfg.engine.cpu_threads)
        try:
            await self.engine.start()
            if self.trainer.version:  # resumed: the engine must serve the checkpoint's weights and version
                await self._sync_weights()
        except BaseException:  # launched servers, actors and process groups must not outlive a failed start
            await self.weight_sync.close()
            await self.engine.close()
            self.backend.close()
            raise

    async def _teardown(self, watch: asyncio.Task, producer: asyncio.Task | None, queue: Any, display: Any) -> None:
        """Release what the run started, the last started first (the run's ``finally``)."""
        watch.cancel()
        if producer is not None and not producer.done():
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
        await queue.close()
        display.close()
        self.sinks.close()
        await self.weight_sync.close()
        proxy = proxy_runner_of(self.backend.episodes)
        if proxy is not None:  # its endpoint serves the engine: closed before it
            await proxy.close()
        await self.engine.close()
        self.backend.close()  # the trainer's process group; Ray: the actors, placement groups, Ray itself
