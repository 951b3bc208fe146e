"""The main job: ``agentrl run`` — rollout -> reward -> credit -> update -> weight sync -> next.

Owns :class:`Runner`: the loop and the few fields it declares (the plan, ``step``, the episodes
trained on, the KL controller, the first eval's row, the warnings) and the parts it builds from the
plan and drives. Setup builds the attempt's :class:`~agentrl.jobs.run.parts.Parts` (engine, trainer,
compute, weight sync, agent proxy), opens the sinks of its
:class:`~agentrl.jobs.run.outputs.Outputs` and builds the :class:`~agentrl.jobs.run.feed.Feed` and
the :class:`~agentrl.jobs.run.held_out.HeldOutEval` on them; then the first held-out eval, the
producer started, and per step the next batch -> shaped samples and credit -> ``train_step`` ->
weight sync -> the new policy version to the feed -> ledger, prompt stream, trajectory log -> the
step's metrics row (rollout, train, credit, staleness, dynamic sampling, on-policy distillation,
sandbox, agent proxy, memory, times) -> eval, checkpoint and monitors when due; then the final eval,
the last checkpoint and teardown (everything released, the last started first). Attempts, the
heartbeat and graceful stop are the :class:`~agentrl.jobs.run.control.Control`'s; a restarted
attempt (a lost Ray node) builds every per-attempt part again and resumes from the newest checkpoint
(``_restart_state``). No part refers back to the Runner: each gets what it needs as arguments. The
config is the run's plan (``agentrl.config.plan``) and every piece comes from
``agentrl.jobs.build``; the loop talks to one compute object, a ``LocalCompute`` (``distributed:
local``) or a ``RayCompute`` (``ray``), the same way.

Read-only properties forwarding to the owning part, for callers and tests: ``trainer``, ``engine``,
``compute`` (the Parts', None before setup), ``queue`` (the Feed's, None before it is built),
``history`` (the Outputs'), ``paused`` (the Outputs'), ``stop_reason`` (the Control's); and
``request_stop`` (the Control's). Subclasses may override ``_setup`` (after ``super()._setup()``
the parts may be replaced, e.g. ``self.parts.engine``), ``evaluate`` and ``_sync_weights``.
Does not implement any of the pieces.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.batches.ledger import rewind
from agentrl.batches.rewards import KLController
from agentrl.batches.samples import build_samples, trainable
from agentrl.batches.staleness import dynamic_sampling_metrics
from agentrl.common.cores import CoreShare
from agentrl.common.faults import fault_point
from agentrl.common.memory import peak_rss_gb, release, rss_gb, tune_allocator
from agentrl.common.stoppable import unless_stopped
from agentrl.config.plan import Plan, resolve
from agentrl.config.schema import RunConfig, to_dict
from agentrl.episodes.summary import rollout_stats
from agentrl.jobs.infra_stop import stop_if_all_failed
from agentrl.jobs.run.control import Control
from agentrl.jobs.run.feed import Feed
from agentrl.jobs.run.held_out import HeldOutEval
from agentrl.jobs.run.outputs import Outputs, unbatched
from agentrl.jobs.run.parts import Parts, latest_checkpoint
from agentrl.models.device import device_line
from agentrl.observe.monitors import Alert
from agentrl.observe.progress import RunDisplay
from agentrl.observe.run_log import rollout_extra
from agentrl.sandbox.slots import queue_summary, take_queue_waits
from agentrl.trainer import TrainSample
from agentrl.trainer.dist import refuse_launcher
from agentrl.trainer.trainer import StepInterrupted
from agentrl.trajectory import Trajectory

if TYPE_CHECKING:
    from agentrl.batches.staleness import StalenessQueue
    from agentrl.distributed.protocol import Compute
    from agentrl.engine.base import Engine
    from agentrl.trainer.protocol import TrainerProtocol


class Runner:
    """One training run. ``await Runner(cfg).run()``; see the module docstring."""

    def __init__(self, cfg: RunConfig | Plan, *, progress: bool = True) -> None:
        refuse_launcher("agentrl run")  # one process drives rollouts and training (Ray for more ranks)
        self.plan = resolve(cfg, "run")  # every cross-field check and auto field, once
        self.preset, self.progress = self.plan.preset, progress
        self.cfg = cfg = self.plan.cfg
        self.device_line = device_line(cfg)
        self.run_dir = Path(cfg.output_dir)
        self.step = 0
        self.batched_episodes = 0  # episodes in the batches this process's steps trained on
        self.kl = KLController(cfg.algo.kl_in_reward or 0.0, cfg.algo.kl_target, cfg.algo.kl_horizon)
        self.first_eval: dict[str, float] = {}  # the first eval's row ({} when a stop skipped it)
        self.warnings: list[str] = []  # the sinks' and the resume's, set by _setup
        self.control = Control(cfg.ray.restart_on_node_loss if cfg.distributed == "ray" else 0)
        self.outputs = Outputs(cfg, self.run_dir)  # the whole run's: its history spans attempts
        # per attempt, built in _run
        self.parts: Parts | None = None
        self.feed: Feed | None = None
        self.held_out: HeldOutEval | None = None

    # -- forwarded to the owning part -------------------------------------------------------------
    @property
    def trainer(self) -> TrainerProtocol | None:
        return self.parts.trainer if self.parts is not None else None

    @property
    def engine(self) -> Engine | None:
        return self.parts.engine if self.parts is not None else None

    @property
    def compute(self) -> Compute | None:
        return self.parts.compute if self.parts is not None else None

    @property
    def queue(self) -> StalenessQueue | None:
        return self.feed.queue if self.feed is not None else None

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.outputs.history

    @property
    def paused(self) -> Alert | None:
        return self.outputs.paused

    @property
    def stop_reason(self) -> str | None:
        return self.control.stop_reason

    def request_stop(self, reason: str = "stop requested") -> None:
        """Stop gracefully (``Control.request_stop``): checkpoint at the end of the current step and
        return; a second request cancels at once. Call from the run's event loop."""
        self.control.request_stop(reason)

    # -- attempts ---------------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        return await self.control.run(self._attempt)

    async def _attempt(self, n: int) -> dict[str, Any]:
        """Attempt ``n`` of the run; after a lost Ray node (n > 0) it resumes from the newest
        checkpoint, exactly once, on the actors placed again (``ray.restart_on_node_loss``)."""
        if n:
            self._restart_state()
        return await self._run()

    def _restart_state(self) -> None:
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            rewind(self.run_dir, 0)  # nothing to resume from: the attempt starts over, its logs too
        keep = int(ckpt.name.rsplit("_", 1)[-1]) if ckpt is not None else 0
        self.cfg.train.resume = True
        self.step = 0
        self.outputs.rewind(keep)
        self.control.restarted()

    # -- setup ------------------------------------------------------------------------------------
    def _setup(self) -> None:
        """Build the attempt's parts and open the sinks; the step and KL coefficient resumed."""
        tune_allocator()  # before the engine's and trainer's threads start
        self.parts = parts = Parts.build(self.plan, self.run_dir)  # closes what it started if it fails
        resumed = parts.resumed
        self.step = resumed.step
        self.kl.value = resumed.kl_in_reward
        try:
            warnings = self.outputs.open(
                config=to_dict(self.cfg), resume_step=self.step if resumed.checkpoint is not None else None
            )
        except BaseException:  # actors and process groups must not outlive a failed setup
            parts.compute.close()
            raise
        ckpt = resumed.checkpoint
        self.warnings = warnings + ([f"resumed from {ckpt} at step {self.step}"] if ckpt else [])

    async def _sync_weights(self) -> float:
        """The trainer's weights pushed to the engine (``Parts.sync_weights``); seconds."""
        assert self.parts is not None
        return await self.parts.sync_weights()

    async def evaluate(self, first: bool = False) -> dict[str, float]:
        """The held-out eval (``HeldOutEval.evaluate``)."""
        assert self.held_out is not None, "evaluate() before setup"
        return await self.held_out.evaluate(first)

    # -- a step's pieces ----------------------------------------------------------------------
    def _samples(self, groups: list[list[Trajectory]]):
        """The step's TrainSamples and credit stats: shaped rewards (overlong, KL in the reward with
        the controller's current coefficient) -> the preset's credit (``agentrl.batches.samples``)."""
        assert self.parts is not None
        cfg, tr = self.cfg, self.parts.trainer
        shaping = dataclasses.replace(self.plan.shaping, kl_coef=self.kl.value)
        values_fn = (lambda trajs: tr.values(_as_samples(trajs))) if self.preset.critic else None
        ref_fn = (lambda trajs: tr.ref_logprobs(_as_samples(trajs))) if shaping.needs_reference else None
        return build_samples(
            groups,
            self.preset,
            credit=cfg.algo.credit,
            gamma=cfg.algo.gamma,
            lam=cfg.algo.lam,
            values_fn=values_fn,
            omega=cfg.algo.gigpo_omega,
            shaping=shaping,
            ref_fn=ref_fn,
            whiten=bool(cfg.algo.whiten_advantages),
            turn_return_std=cfg.algo.turn_return_std,
        )

    def _checkpoint(self, feed: Feed, final: bool = False) -> Path:
        """The exactly-once checkpoint: the feed's snapshot and the save, with no await between."""
        assert self.parts is not None
        trainer, state = self.parts.trainer, feed.exactly_once()
        return self.outputs.checkpoint(self.step, trainer, state, kl=self.kl.value, final=final)

    # -- the loop --------------------------------------------------------------------------------
    async def _run(self) -> dict[str, Any]:
        stop = self.control.begin()
        self._setup()  # closes what it started if it fails
        parts = self.parts
        assert parts is not None
        await parts.start()  # so does this
        cfg, outputs, resumed = self.cfg, self.outputs, parts.resumed
        manager = parts.compute.episodes
        self.feed = feed = Feed(
            cfg,
            stream=resumed.stream,
            restored=resumed.restored,
            restored_counts=resumed.restored_counts,
            version=parts.trainer.version,
            manager=manager,
            stop=stop,
            replay=parts.replay,
        )
        display = RunDisplay(self.progress, cfg.train.steps, start=self.step)
        self.held_out = HeldOutEval(
            cfg,
            engine=parts.engine,
            make_env=parts.make_eval_env,
            tokenizer=parts.tokenizer,
            proxy=parts.proxy,
            progress=display.note if display.lines else None,  # a terminal has the bar
        )
        display.note(self.device_line)
        display.note(parts.chat_line)
        if parts.isolation:
            display.note(parts.isolation)
        if parts.proxy is not None and (line := parts.proxy.isolation_line()):
            display.note(line)  # where agent.command runs
        take_queue_waits()  # the first step's queue times are its own
        t_start, first_step = time.perf_counter(), self.step
        watch = self.control.watch(parts.compute)
        try:
            done, first_eval = await unless_stopped(self.evaluate(first=True), stop)
            self.first_eval = first_eval if done and first_eval is not None else {}
            if done:
                outputs.log(self.step, {"eval": self.first_eval}, display)
                outputs.monitor(display)  # an eval's infrastructure failures, before any training
            feed.start()
            while self.step < cfg.train.steps and self.stop_reason is None and outputs.paused is None:
                t0 = time.perf_counter()
                got = await feed.next_batch(self.step)
                if got is None:
                    break
                groups, positions = got
                if self.step == first_step:
                    stop_if_all_failed((t for g in groups for t in g), "the first training step")
                row = await self._train_step(feed, groups, positions, (t_start, t0, time.perf_counter()))
                if row is None:  # a stop interrupted the step: its batch is back in the queue
                    display.note(f"step {self.step + 1} not trained: stopped mid-step; its batch is kept for --resume")
                    break
                if self.held_out.due(self.step):
                    done, ev = await unless_stopped(self.evaluate(), stop)  # a stop skips it
                    if done:
                        row["eval"] = ev
                outputs.log(self.step, row, display)
                if cfg.train.checkpoint_every and self.step % cfg.train.checkpoint_every == 0:
                    self._checkpoint(feed)
                if outputs.monitor(display):
                    break
            await feed.stop_producing()
            early = outputs.paused is not None or self.stop_reason is not None
            if self.stop_reason is not None:
                display.note(f"[red]stopped[/] ({self.stop_reason}) at step {self.step}; continue with --resume")
            final = await self.evaluate() if not early else {}
            outputs.log(self.step, {"eval": final, "time": {"elapsed_s": time.perf_counter() - t_start}}, display)
            outputs.monitor(display, can_pause=False)  # the run is over: alerts are shown, nothing pauses
            self._checkpoint(feed, final=not early)
        finally:  # released the last started first, on success and on failure alike
            watch.cancel()
            await feed.close()
            display.close()
            outputs.close()
            await parts.release()
        return outputs.finish(
            step=self.step,
            evals=(self.first_eval, final),
            wall_s=time.perf_counter() - t_start,
            rollout_metrics=manager.metrics,
            unbatched=unbatched(self.batched_episodes, feed.queue.metrics()),
            model_path=parts.model_path,
            proxy=parts.proxy,
            stop_reason=self.stop_reason,
            recoveries=self.control.recoveries(),
        )

    async def _train_step(
        self, feed: Feed, groups: list[list[Trajectory]], positions: list, times: tuple[float, ...]
    ) -> dict[str, Any] | None:
        """Train on one batch: samples -> train_step -> weight sync -> the new version to the feed ->
        ledger, stream, trajectory log; the step's row. ``times``: when the run started, when the step
        started waiting for the batch, when it got it (``time.perf_counter``). None if a stop
        interrupted the train step: nothing was trained and the batch is back in the queue, so the
        checkpoint that follows keeps its episodes (exactly once)."""
        parts, stop = self.parts, self.control.stop
        assert parts is not None and stop is not None
        cfg, trainer, (t_start, t0, t_got) = self.cfg, parts.trainer, times
        filtered = feed.filtered()
        samples, sstats = self._samples(groups)
        try:
            tm = await _train_interruptibly(trainer, samples, stop, parts.cores) if samples else {}
        except StepInterrupted:
            feed.return_batch()
            return None
        self.batched_episodes += sum(len(g) for g in groups)
        if samples:
            self.kl.update(sstats.get("kl_in_reward/kl_mean"), len(samples))
        fault_point("after_train_step")
        sync_s = await self._sync_weights()
        await feed.set_version(trainer.version)
        self.step += 1
        self.outputs.ledger.append(
            self.step, trainer.version, positions, [g[0].group_id for g in groups], filtered=filtered
        )
        feed.trained([*positions, *filtered])
        self.control.stepped(self.step)
        self.outputs.trajectory_log.write(self.step, groups, trainable(groups)[0], [x.advantages for x in samples])
        proxy = parts.proxy
        last_sync = parts.last_sync
        assert last_sync is not None
        opd, teacher_time = _distillation_metrics(tm)
        release()  # the step's freed tensors back to the system, so the resident set tracks what is used
        return {
            "rollout": {**rollout_stats(groups), **rollout_extra(groups)},
            "train": tm,
            **({"opd": opd} if opd else {}),
            "credit": sstats,
            "staleness": feed.staleness(),
            **(
                {"dapo": dynamic_sampling_metrics(len(groups), len(filtered), cfg.train.groups_per_step)}
                if cfg.algo.dynamic_sampling and feed.replay is None
                else {}
            ),
            **({"agent": proxy.take_step()} if proxy is not None else {}),
            "sandbox": queue_summary(take_queue_waits()),
            **({"engine": counts} if (counts := parts.engine_counters.take()) else {}),
            "memory": {"rss_gb": rss_gb(), "peak_rss_gb": peak_rss_gb()},
            "time": {
                "wait_rollout_s": t_got - t0,
                "step_s": time.perf_counter() - t0,
                "weight_sync_s": sync_s,
                "weight_push_s": last_sync.seconds,
                "drain_wait_s": parts.drain_s,
                "elapsed_s": time.perf_counter() - t_start,
                **teacher_time,
            },
        }


def _distillation_metrics(tm: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """The trainer's on-policy distillation metrics taken out of ``tm`` into their own sections:
    ``opd/reverse_kl`` (the mean over the step's action tokens) and ``time/teacher_s`` (the
    teacher's forwards). Both empty without a teacher."""
    opd = {"reverse_kl": tm.pop("opd_reverse_kl")} if "opd_reverse_kl" in tm else {}
    return opd, ({"teacher_s": tm.pop("teacher_s")} if "teacher_s" in tm else {})


async def _train_interruptibly(
    trainer: TrainerProtocol, samples: list[TrainSample], stop: asyncio.Event, cores: CoreShare | None = None
) -> dict[str, float]:
    """``trainer.train_step`` in a thread; a stop requested meanwhile interrupts it at its next
    micro-batch (StepInterrupted: nothing trained), so a stop never waits for a whole step. With
    ``cores``, the trainer counts as computing meanwhile (an in-process engine then shares the cores)."""
    interrupt = threading.Event()

    def step() -> dict[str, float]:
        if cores is None:
            return trainer.train_step(samples, interrupt)
        with cores.computing("trainer"):
            return trainer.train_step(samples, interrupt)

    work = asyncio.ensure_future(asyncio.to_thread(step))
    done, _ = await unless_stopped(asyncio.shield(work), stop)
    if not done:
        interrupt.set()
    return await work


def _as_samples(trajs: list[Trajectory]) -> list[TrainSample]:
    return [
        TrainSample(
            token_ids=t.token_ids,
            loss_mask=t.loss_mask,
            behaviour_logprobs=t.logprobs,
            advantages=[0.0] * len(t.token_ids),
        )
        for t in trajs
    ]
