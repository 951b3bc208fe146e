"""The main job: ``agentrl run`` — rollout -> reward -> credit -> update -> weight sync -> next.

Owns :class:`Runner` and its step loop: setup, the first held-out eval, the producer started, then
per step the next batch -> shaped samples and credit -> ``train_step`` -> weight sync -> the new
policy version to the queue -> ledger, prompt stream, trajectory log -> the step's metrics row
(rollout, train, credit, staleness, dynamic sampling, sandbox, agent proxy, times) -> eval,
checkpoint and monitors when due; then the final eval, the last checkpoint and teardown. The
pieces of the run live in mixins, one concept each: building, starting and releasing
(``agentrl.jobs.run.parts``), attempts, heartbeat and graceful stop (``agentrl.jobs.run.control``),
where batches come from (``agentrl.jobs.run.feed``: producer, staleness queue, ``train.replay``),
held-out eval (``agentrl.jobs.run.held_out``) and what the run writes (``agentrl.jobs.run.outputs``:
metrics, alerts, exactly-once checkpoints for ``--resume``, summary, curves). The config is the
run's plan (``agentrl.config.plan``: every check and auto field resolved there, written as
config.yaml) and every piece comes from ``agentrl.jobs.build``; the loop talks to one backend
object, a ``LocalBackend`` (``distributed: local``) or a ``RayBackend`` (``ray``), the same way.
Does not implement any of those pieces.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

from agentrl.agents.runner import proxy_runner_of
from agentrl.batches.ledger import Ledger
from agentrl.batches.prompt_stream import PromptStream
from agentrl.batches.rewards import KLController
from agentrl.batches.samples import build_samples, trainable
from agentrl.batches.staleness import StalenessQueue, dynamic_sampling_metrics
from agentrl.common.faults import fault_point
from agentrl.common.stoppable import unless_stopped
from agentrl.config.plan import Plan, resolve
from agentrl.config.schema import RunConfig
from agentrl.episodes.summary import rollout_stats
from agentrl.jobs.infra_stop import stop_if_all_failed
from agentrl.jobs.run.control import RunControl
from agentrl.jobs.run.feed import RunFeed
from agentrl.jobs.run.held_out import HeldOutEval
from agentrl.jobs.run.outputs import RunOutputs
from agentrl.jobs.run.parts import RunSetup
from agentrl.observe.monitors import Alert
from agentrl.observe.progress import RunDisplay
from agentrl.observe.run_log import TrajectoryLog, rollout_extra
from agentrl.sandbox.slots import queue_summary, take_queue_waits
from agentrl.trainer.trainer import StepInterrupted
from agentrl.trajectory import Trajectory
from agentrl.weights.drain import weight_update_gate


class Runner(RunControl, RunSetup, RunFeed, HeldOutEval, RunOutputs):
    """One training run. ``await Runner(cfg).run()``; see the module docstring."""

    def __init__(self, cfg: RunConfig | Plan, *, progress: bool = True) -> None:
        from agentrl.models.device import device_line
        from agentrl.trainer.dist import refuse_launcher

        refuse_launcher("agentrl run")  # one process drives rollouts and training (Ray for more ranks)
        self.plan = resolve(cfg, "run")  # every cross-field check and auto field, once
        self.preset, self.progress = self.plan.preset, progress
        self.cfg = cfg = self.plan.cfg
        self.device_line = device_line(cfg)
        self.backend = None  # LocalBackend or RayBackend: engine, trainer, episodes (built in _setup)
        self.run_dir = Path(cfg.output_dir)
        self.step = 0
        self.batched_episodes = 0  # episodes in the batches this process's steps trained on
        self.stream = PromptStream()  # prompt positions of the training stream
        self.in_flight: dict[int, int] = {}  # admission index -> position of each group being generated
        self.restored: list[tuple[int | None, list[Trajectory]]] = []  # a checkpoint's finished groups
        self.restored_counts: dict[str, int] = {}
        self.replay = None  # train.replay: the recorded batches of another run
        self.ledger = Ledger(self.run_dir)
        self.history: list[dict[str, Any]] = []
        self.drain_s = 0.0  # seconds the last push waited for generations in flight (partial_rollouts=false)
        self.paused: Alert | None = None  # the monitor alert that paused the run
        self.alerting: set[tuple[str, str]] = set()  # (kind, about) of the last step's alerts
        self.reported: set[Alert] = set()  # the alerts of the last monitored row
        self.stop_reason: str | None = None  # request_stop(): checkpoint and return early
        self._stop: asyncio.Event | None = None
        self._main: asyncio.Task | None = None
        self.lost: BaseException | None = None  # what the heartbeat found lost (Ray node or actor)
        self.supervisor: Any = None  # agentrl.distributed.recovery.Supervisor, set by run()
        self.trajectory_log = TrajectoryLog(self.run_dir, cfg.logging.trajectories_per_step)
        self.kl = KLController(cfg.algo.kl_in_reward or 0.0, cfg.algo.kl_target, cfg.algo.kl_horizon)

    # -- a step's pieces ----------------------------------------------------------------------
    async def _sync_weights(self) -> float:
        """Gather the trainer's weights and push them through the configured WeightSync; seconds."""
        t0 = time.perf_counter()
        state = await asyncio.to_thread(self.trainer.full_state_dict)
        async with weight_update_gate(
            self.engine, self.backend.remote_gates()
        ) as self.drain_s:  # 0.0 with partial rollouts
            self.last_sync = await self.weight_sync.push(state, self.trainer.version)
        return time.perf_counter() - t0

    def _samples(self, groups: list[list[Trajectory]]):
        """The step's TrainSamples and credit stats: shaped rewards (overlong, KL in the reward with
        the controller's current coefficient) -> the preset's credit (``agentrl.batches.samples``)."""
        cfg, tr = self.cfg, self.trainer
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

    # -- the loop --------------------------------------------------------------------------------
    async def _run(self) -> dict[str, Any]:
        self._main = asyncio.current_task()
        self._stop = asyncio.Event()
        if self.stop_reason is not None:
            self._stop.set()
        self._setup()  # closes what it started if it fails
        await self._start()  # so does this
        cfg = self.cfg
        self.queue = queue = self._new_queue()
        manager = self.backend.episodes
        display = RunDisplay(self.progress, cfg.train.steps, start=self.step)
        display.note(self.device_line)
        display.note(self.chat_line)
        if self.isolation:
            display.note(self.isolation)
        take_queue_waits()  # the first step's queue times are its own
        t_start, first_step = time.perf_counter(), self.step
        producer = None
        watch = self._watch()
        try:
            done, first_eval = await unless_stopped(self.evaluate(first=True), self._stop)
            self.first_eval = first_eval if done else {}
            if done:
                self._log({"eval": self.first_eval}, display)
                self._monitor(display)  # an eval's infrastructure failures, before any training
            if self.replay is None:
                producer = asyncio.create_task(self._producer(queue, manager))
            while self.step < cfg.train.steps and self.stop_reason is None and self.paused is None:
                t0 = time.perf_counter()
                got = await self._next_batch(queue)
                if got is None:
                    break
                groups, positions = got
                if self.step == first_step:
                    stop_if_all_failed((t for g in groups for t in g), "the first training step")
                row = await self._train_step(queue, groups, positions, (t_start, t0, time.perf_counter()))
                if row is None:  # a stop interrupted the step: its batch is back in the queue
                    display.note(f"step {self.step + 1} not trained: stopped mid-step; its batch is kept for --resume")
                    break
                if self._eval_due():
                    done, ev = await unless_stopped(self.evaluate(), self._stop)  # a stop skips it
                    if done:
                        row["eval"] = ev
                self._log(row, display)
                if cfg.train.checkpoint_every and self.step % cfg.train.checkpoint_every == 0:
                    self._checkpoint()
                if self._monitor(display):
                    break
            if producer is not None:
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)
            early = self.paused is not None or self.stop_reason is not None
            if self.stop_reason is not None:
                display.note(f"[red]stopped[/] ({self.stop_reason}) at step {self.step}; continue with --resume")
            final = await self.evaluate() if not early else {}
            self._log({"eval": final, "time": {"elapsed_s": time.perf_counter() - t_start}}, display)
            self._monitor(display, can_pause=False)  # the run is over: alerts are shown, nothing pauses
            self._checkpoint(final=not early)
        finally:
            await self._teardown(watch, producer, queue, display)
        return self._finish(final, time.perf_counter() - t_start, manager.metrics)

    async def _train_step(
        self, queue: StalenessQueue, groups: list[list[Trajectory]], positions: list, times: tuple[float, ...]
    ) -> dict[str, Any] | None:
        """Train on one batch: samples -> train_step -> weight sync -> the new version to the queue ->
        ledger, stream, trajectory log; the step's row. ``times``: when the run started, when the step
        started waiting for the batch, when it got it (``time.perf_counter``). None if a stop
        interrupted the train step: nothing was trained and the batch is back in the queue, so the
        checkpoint that follows keeps its episodes (exactly once)."""
        cfg, (t_start, t0, t_got) = self.cfg, times
        filtered = [p for p in queue.handed_filtered if p is not None] if self.replay is None else []
        samples, sstats = self._samples(groups)
        try:
            tm = await _train_interruptibly(self.trainer, samples, self._stop) if samples else {}
        except StepInterrupted:
            if self.replay is None:
                queue.return_batch()
            return None
        self.batched_episodes += sum(len(g) for g in groups)
        if samples:
            self.kl.update(sstats.get("kl_in_reward/kl_mean"), len(samples))
        fault_point("after_train_step")
        sync_s = await self._sync_weights()
        await queue.set_version(self.trainer.version)
        self.step += 1
        self.ledger.append(
            self.step, self.trainer.version, positions, [g[0].group_id for g in groups], filtered=filtered
        )
        self.stream.trained([*positions, *filtered])
        self.supervisor.stepped(self.step)
        self.trajectory_log.write(self.step, groups, trainable(groups)[0], [x.advantages for x in samples])
        proxy = proxy_runner_of(self.backend.episodes)
        return {
            "rollout": {**rollout_stats(groups), **rollout_extra(groups)},
            "train": tm,
            "credit": sstats,
            "staleness": {
                **queue.metrics(),
                "rerun_drops": self.stream.redrops,
                "abandoned_prompts": len(self.stream.abandoned),
            },
            **(
                {"dapo": dynamic_sampling_metrics(len(groups), len(filtered), cfg.train.groups_per_step)}
                if cfg.algo.dynamic_sampling and self.replay is None
                else {}
            ),
            **({"agent": proxy.take_step()} if proxy is not None else {}),
            "sandbox": queue_summary(take_queue_waits()),
            "time": {
                "wait_rollout_s": t_got - t0,
                "step_s": time.perf_counter() - t0,
                "weight_sync_s": sync_s,
                "weight_push_s": self.last_sync.seconds,
                "drain_wait_s": self.drain_s,
                "elapsed_s": time.perf_counter() - t_start,
            },
        }


async def _train_interruptibly(trainer: Any, samples: list, stop: asyncio.Event) -> dict[str, float]:
    """``trainer.train_step`` in a thread; a stop requested meanwhile interrupts it at its next
    micro-batch (StepInterrupted: nothing trained), so a stop never waits for a whole step."""
    interrupt = threading.Event()
    work = asyncio.ensure_future(asyncio.to_thread(trainer.train_step, samples, interrupt))
    done, _ = await unless_stopped(asyncio.shield(work), stop)
    if not done:
        interrupt.set()
    return await work


def _as_samples(trajs: list[Trajectory]):
    from agentrl.trainer import TrainSample

    return [
        TrainSample(
            token_ids=t.token_ids,
            loss_mask=t.loss_mask,
            behaviour_logprobs=t.logprobs,
            advantages=[0.0] * len(t.token_ids),
        )
        for t in trajs
    ]
