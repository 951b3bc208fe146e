"""The main job: ``agentrl run`` — rollout -> reward -> credit -> update -> weight sync -> next.

Owns the training loop: asking for the pieces (model, backend with engine, trainer and episode
manager, weight sync, env factories, StalenessQueue, sinks), the producer that admits and runs
groups of episodes, the trainer loop (batch -> samples -> train_step -> weight sync -> version),
held-out evaluation, checkpoints for an exactly-once ``--resume`` (the prompt stream's position,
the prompts in flight, which run again, and the finished-but-untrained groups, which are kept:
``rollouts.jsonl`` in the checkpoint; the ledger and logs are rewound to the checkpoint's step),
replaying another run's recorded batches (``train.replay``), the live progress
display, the final summary table and the curve PNG. The config is the run's plan
(``agentrl.config.plan``: every check and auto field resolved there, written as config.yaml) and
every piece comes from ``agentrl.jobs.build``; the loop talks to one backend object, a
``LocalBackend`` (``distributed: local``) or a ``RayBackend`` (``ray``), the same way. Does not
implement any of those pieces.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from agentrl.batches.ledger import Ledger, rewind
from agentrl.batches.prompt_stream import PromptStream
from agentrl.batches.rewards import KLController
from agentrl.batches.samples import build_samples, has_signal, trainable
from agentrl.batches.staleness import StalenessQueue, dump_ready, dynamic_sampling_metrics, load_ready
from agentrl.common.faults import fault_point
from agentrl.config.plan import Plan, resolve
from agentrl.config.schema import RunConfig, save_config, to_dict
from agentrl.episodes.manager import EpisodeManager, EpisodeSpec, make_specs
from agentrl.episodes.summary import RolloutMetrics, eval_stats, rollout_stats
from agentrl.jobs.build import env_factory, eval_env_factory, make_sync, model_dir, start_backend
from agentrl.jobs.infra_stop import stop_if_all_failed
from agentrl.observe.monitors import Alert, new_alerts
from agentrl.observe.progress import RunDisplay
from agentrl.observe.run_log import TrajectoryLog, rollout_extra
from agentrl.sandbox.slots import queue_summary, take_queue_waits
from agentrl.trainer.integrity import pick_resume
from agentrl.trajectory import Trajectory
from agentrl.weights.drain import weight_update_gate


class Runner:
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

    # -- setup ---------------------------------------------------------------------------------
    def _setup(self) -> None:
        from transformers import AutoTokenizer

        from agentrl.jobs.rollout import tune_gc
        from agentrl.observe.sinks import make_sinks

        cfg = self.cfg
        tune_gc()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir / "config.yaml")
        self.model_path = model_dir(cfg)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
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

    # -- loop ----------------------------------------------------------------------------------
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
        import dataclasses

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

    async def evaluate(self, first: bool = False) -> dict[str, float]:
        ev = self.cfg.eval
        if ev.num_tasks <= 0:
            return {}
        rcfg = _replace(self.cfg.rollout, temperature=ev.temperature, group_size=1)
        mgr = EpisodeManager(self.engine, self.make_eval_env, self.tokenizer, rcfg, env_id=self.cfg.env.id)
        specs = [EpisodeSpec(f"eval-{i}", 0, 10_000_019 + i, sampling_seed=i) for i in range(ev.num_tasks)]
        trajs = await mgr.collect(specs)
        if first:  # an eval where everything failed alike means nothing here can work: stop now
            stop_if_all_failed(trajs, "the first evaluation")
        return eval_stats(trajs)

    async def _producer(self, queue: StalenessQueue, manager: EpisodeManager) -> None:
        G = self.cfg.rollout.group_size
        running: set[asyncio.Task] = set()

        async def run_group(index: int, position: int) -> None:
            specs = make_specs(
                1, G, seed=self.cfg.rollout.seed, start=position, attempt=self.stream.drops.get(position, 0)
            )
            # run_segments: a proxy-mode episode whose agent rewrote its history yields several trajectories
            run = getattr(manager, "run_segments", None)
            done = await asyncio.gather(*(run(s) if run else manager.run_episode(s) for s in specs))
            group = [t for ts in done for t in (ts if isinstance(ts, list) else [ts])]
            await queue.put(index, group, position)
            self.in_flight.pop(index, None)

        try:
            while True:
                index = await queue.admit()
                position = self.stream.take()
                self.in_flight[index] = position
                task = asyncio.create_task(run_group(index, position))
                running.add(task)
                task.add_done_callback(running.discard)
        finally:
            for t in running:
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    def request_stop(self, reason: str = "stop requested") -> None:
        """Stop gracefully (``agentrl run`` calls this on SIGTERM): at the end of the current step, or
        at once while waiting for rollouts, checkpoint (in-flight prompts requeued) and return with
        ``summary["stopped"]``; ``--resume`` continues exactly once. A second request cancels the run
        at once (cleanup still runs). Call from the run's event loop."""
        if self.stop_reason is not None and self._main is not None:
            self._main.cancel()
            return
        self.stop_reason = reason
        if self._stop is not None:
            self._stop.set()

    async def _next_batch(self, queue: StalenessQueue):
        """The next batch and its positions, or None if a stop was requested first."""
        if self.replay is not None:
            return self.replay.batch(self.step + 1)
        get = asyncio.ensure_future(queue.get_batch_with_positions())
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({get, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not get.done():
                get.cancel()  # get_batch removes groups only when it returns: nothing is lost
            await asyncio.gather(get, stop, return_exceptions=True)
        return get.result() if not get.cancelled() else None

    async def run(self) -> dict[str, Any]:
        import torch

        from agentrl.distributed.recovery import Supervisor

        before = torch.get_num_threads()
        restarts = self.cfg.ray.restart_on_node_loss if self.cfg.distributed == "ray" else 0
        self.supervisor = Supervisor(restarts, note=print)
        try:
            return await self.supervisor.run(self._attempt)
        finally:
            if torch.get_num_threads() != before:  # engine.cpu_threads held for this run only
                torch.set_num_threads(before)

    async def _attempt(self, n: int) -> dict[str, Any]:
        """Attempt ``n`` of the run; after a lost Ray node (n > 0) it resumes from the newest
        checkpoint, exactly once, on the actors placed again (``ray.restart_on_node_loss``)."""
        if n:
            self._restart_state()
        try:
            return await self._run()
        except asyncio.CancelledError:
            if self.lost is None:
                raise
            asyncio.current_task().uncancel()  # cancelled by the heartbeat, not by the caller
            raise self.lost from None

    def _restart_state(self) -> None:
        ckpt = self._latest_checkpoint()
        if ckpt is None:
            rewind(self.run_dir, 0)  # nothing to resume from: the attempt starts over, its logs too
        keep = int(ckpt.name.rsplit("_", 1)[-1]) if ckpt is not None else 0
        self.cfg.train.resume = True
        self.step, self.stream, self.in_flight, self.restored, self.restored_counts = 0, PromptStream(), {}, [], {}
        self.replay, self.paused, self.lost = None, None, None
        self.history = [r for r in self.history if r["step"] <= keep]

    def _watch(self) -> asyncio.Task:
        """The backend's heartbeat: a lost node or actor cancels this attempt, which ends as that error."""
        main = asyncio.current_task()

        async def beat() -> None:
            try:
                await self.backend.watch()
            except Exception as e:
                self.lost = e
                main.cancel()

        return asyncio.create_task(beat())

    async def _run(self) -> dict[str, Any]:
        self._main = asyncio.current_task()
        self._stop = asyncio.Event()
        if self.stop_reason is not None:
            self._stop.set()
        self._setup()  # closes what it started if it fails
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
        queue = StalenessQueue(
            cfg.train.max_staleness,
            cfg.train.groups_per_step,
            on_drop=self.stream.drop,
            keep=has_signal if cfg.algo.dynamic_sampling else None,
            max_draws=cfg.algo.max_draw_batches,
        )
        queue.version = self.trainer.version
        queue.restore(self.restored, **self.restored_counts)
        self.queue = queue
        manager = self.backend.episodes
        display = RunDisplay(self.progress, cfg.train.steps, start=self.step)
        display.note(self.device_line)
        if self.isolation:
            display.note(self.isolation)
        take_queue_waits()  # the first step's queue times are its own
        t_start, first_step = time.perf_counter(), self.step
        producer = None
        watch = self._watch()
        try:
            self.first_eval = await self.evaluate(first=True)
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
                t_wait = time.perf_counter() - t0
                filtered = [p for p in queue.handed_filtered if p is not None] if self.replay is None else []
                samples, sstats = self._samples(groups)
                tm = await asyncio.to_thread(self.trainer.train_step, samples) if samples else {}
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
                row: dict[str, Any] = {
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
                    "sandbox": queue_summary(take_queue_waits()),
                    "time": {
                        "wait_rollout_s": t_wait,
                        "step_s": time.perf_counter() - t0,
                        "weight_sync_s": sync_s,
                        "weight_push_s": self.last_sync.seconds,
                        "drain_wait_s": self.drain_s,
                        "elapsed_s": time.perf_counter() - t_start,
                    },
                }
                if cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.train.steps:
                    row["eval"] = await self.evaluate()
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
            watch.cancel()
            if producer is not None and not producer.done():
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)
            await queue.close()
            display.close()
            self.sinks.close()
            await self.weight_sync.close()
            await self.engine.close()
            self.backend.close()  # the trainer's process group; Ray: the actors, placement groups, Ray itself
        return self._finish(final, time.perf_counter() - t_start, manager.metrics)

    # -- outputs -------------------------------------------------------------------------------
    def _log(self, row: dict[str, Any], display: RunDisplay) -> None:
        from agentrl.observe.sinks import flatten

        flat = flatten(row)
        self.history.append({"step": self.step, **flat})
        self.sinks.write(self.step, flat)
        display.update(self.step, flat)

    def _monitor(self, display: RunDisplay, *, can_pause: bool = True) -> bool:
        """Run the monitors on the newest row; True when an alert pauses the run. The final eval's row
        has the last step's number: alerts already written for that step are not written again."""
        current = new_alerts(self.history, self.cfg.monitor)
        alerts = [a for a in current if a not in self.reported]
        self.reported = set(current)
        if alerts:
            with open(self.run_dir / "alerts.jsonl", "a") as f:
                for a in alerts:
                    f.write(json.dumps({"step": a.step, "kind": a.kind, "message": a.message}) + "\n")
                    if (a.kind, a.about) not in self.alerting:  # shown when it starts; every one is in the file
                        tag = "[red]infra[/]" if a.kind == "infra_failures" else "[yellow]monitor[/]"
                        display.note(f"{tag} step {a.step} {a.kind}: {a.message} (while it lasts: alerts.jsonl only)")
        self.alerting = {(a.kind, a.about) for a in alerts}
        pausing: list[Alert] = [a for a in alerts if a.kind in self.cfg.monitor.pause_on and can_pause]
        if pausing:
            self.paused = pausing[0]
            display.note(f"[red]paused[/] by monitor.pause_on ({pausing[0].kind}); continue with --resume")
        return bool(pausing)

    def _checkpoint(self, final: bool = False) -> Path:
        """Save the trainer with the run's exactly-once state: the stream (groups in flight are
        requeued: they run again after a resume) and the finished-but-untrained groups (kept).
        Synchronous from snapshot to save, so producer and queue cannot move in between."""
        path = self.run_dir / "checkpoints" / (f"step_{self.step:06d}")
        snap = self.queue.snapshot()
        kept = {p for p, _ in snap["ready"]}
        # filtered groups not yet recorded with a step run again after a resume (recorded nowhere)
        outstanding = [p for p in self.in_flight.values() if p not in kept] + snap["filtered"]
        extra = {
            "step": self.step,
            "data_position": self.stream.next,
            "stream": self.stream.state(outstanding),
            "queue": {k: v for k, v in snap.items() if k not in ("ready", "filtered")},
            "policy_version": self.trainer.version,
            "final": final,
            "kl_in_reward": self.kl.value,
        }
        self.trainer.save(path, extra=extra, files={"rollouts.jsonl": dump_ready(snap["ready"])})
        return path

    def _finish(self, final: dict, wall_s: float, rollout_metrics: RolloutMetrics) -> dict[str, Any]:
        from agentrl.observe.plots import plot_curves

        first = getattr(self, "first_eval", {}) or {}
        summary = {
            "algo": self.cfg.algo.name,
            "steps": self.step,
            "wall_s": wall_s,
            **{
                f"eval_{k}_{when}": ev.get(k)
                for when, ev in (("start", first), ("end", final))
                for k in ("solve_rate", "infra_failure_rate")
            },
            "eval_tool_use_rate_end": final.get("tool_use_rate"),
            "rollout": rollout_metrics.summary(),
            "model": str(self.model_path),
        }
        if self.paused is not None:
            summary["paused"] = {"step": self.paused.step, "kind": self.paused.kind, "message": self.paused.message}
        if self.stop_reason is not None:
            summary["stopped"] = {"step": self.step, "reason": self.stop_reason}
        if self.supervisor.recoveries:
            summary["recoveries"] = [r.as_dict() for r in self.supervisor.recoveries]
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        plot_curves(self.history, self.run_dir / "curves.png", title=f"{self.cfg.env.id} / {self.cfg.algo.name}")
        return summary


def _replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


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
