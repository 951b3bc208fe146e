"""What one ``agentrl run`` writes: :class:`Outputs`.

Owns, for the whole run (all its attempts): the metrics history and sinks (``log``: a row flattened
into the history, the sinks — ``metrics.jsonl``, TensorBoard, W&B — and the live display; the sinks
are opened per attempt, ``open``/``close``), the monitors (``monitor``: new alerts to
``alerts.jsonl``, shown once while they last; an alert in ``monitor.pause_on`` pauses the run:
``paused``), the ledger and the trajectory log a step appends to, checkpoints (``checkpoint``: the
trainer with the run's exactly-once state, which the feed snapshots, and the KL controller's value)
and ``finish`` (``summary.json``: eval at start and end, rollout totals, the agent proxy's totals in
proxy mode, pause/stop/recovery notes; and ``curves.png``). Does not decide when any of these runs
(``agentrl.jobs.run.loop``) or what the exactly-once state holds (``agentrl.jobs.run.feed``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.batches.ledger import Ledger
from agentrl.batches.staleness import dump_ready
from agentrl.episodes.summary import RolloutMetrics
from agentrl.observe.monitors import Alert, new_alerts
from agentrl.observe.plots import plot_curves
from agentrl.observe.progress import RunDisplay
from agentrl.observe.run_log import TrajectoryLog
from agentrl.observe.sinks import flatten, make_sinks

if TYPE_CHECKING:
    from agentrl.agents.strategy import ProxyStrategy
    from agentrl.config.schema import RunConfig
    from agentrl.observe.sinks import MultiSink
    from agentrl.trainer.protocol import TrainerProtocol


class Outputs:
    """Logs, alerts, checkpoints and the summary of a run writing into ``run_dir``."""

    def __init__(self, cfg: RunConfig, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.history: list[dict[str, Any]] = []
        self.sinks: MultiSink | None = None  # open() .. close(), per attempt
        self.ledger = Ledger(run_dir)
        self.trajectory_log = TrajectoryLog(run_dir, cfg.logging.trajectories_per_step)
        self.paused: Alert | None = None  # the monitor alert that paused the run
        self.alerting: set[tuple[str, str]] = set()  # (kind, about) of the last step's alerts
        self.reported: set[Alert] = set()  # the alerts of the last monitored row

    def open(self, *, config: dict, resume_step: int | None) -> list[str]:
        """Open the metric sinks (``resume_step``: the checkpoint's step when resuming); warnings."""
        self.sinks, warnings = make_sinks(
            self.run_dir,
            tensorboard=self.cfg.logging.tensorboard,
            wandb_project=self.cfg.logging.wandb_project,
            config=config,
            resume_step=resume_step,
        )
        return warnings

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.close()

    def rewind(self, step: int) -> None:
        """A restarted attempt resumes at ``step``: the rows after it are redone, the pause forgotten."""
        self.history = [r for r in self.history if r["step"] <= step]
        self.paused = None

    def log(self, step: int, row: dict[str, Any], display: RunDisplay) -> None:
        assert self.sinks is not None, "log() before open()"
        flat = flatten(row)
        self.history.append({"step": step, **flat})
        self.sinks.write(step, flat)
        display.update(step, flat)

    def monitor(self, display: RunDisplay, *, can_pause: bool = True) -> bool:
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

    def checkpoint(
        self,
        step: int,
        trainer: TrainerProtocol,
        exactly_once: tuple[dict[str, Any], list],
        *,
        kl: float,
        final: bool = False,
    ) -> Path:
        """Save ``trainer`` with the run's exactly-once state (``Feed.exactly_once()``: the stream with
        the groups in flight requeued, the finished-but-untrained groups kept) and the KL controller's
        ``kl``. Call it synchronously right after the snapshot, so producer and queue cannot move."""
        path = self.run_dir / "checkpoints" / (f"step_{step:06d}")
        feed_state, ready = exactly_once
        extra = {
            "step": step,
            **feed_state,
            "policy_version": trainer.version,
            "final": final,
            "kl_in_reward": kl,
        }
        trainer.save(path, extra=extra, files={"rollouts.jsonl": dump_ready(ready)})
        return path

    def finish(
        self,
        *,
        step: int,
        evals: tuple[dict[str, float], dict[str, float]],
        wall_s: float,
        rollout_metrics: RolloutMetrics,
        unbatched: dict[str, Any],
        model_path: Path,
        proxy: ProxyStrategy | None,
        stop_reason: str | None,
        recoveries: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """Write ``summary.json`` and ``curves.png``; the summary. ``evals``: the first and the final
        eval's rows; ``unbatched``: :func:`unbatched`."""
        first, final = evals
        summary = {
            "algo": self.cfg.algo.name,
            "steps": step,
            "wall_s": wall_s,
            **{
                f"eval_{k}_{when}": ev.get(k)
                for when, ev in (("start", first), ("end", final))
                for k in ("solve_rate", "episodes", "infra_failures", "infra_failure_rate")
            },
            "eval_tool_use_rate_end": final.get("tool_use_rate"),
            "rollout": {**rollout_metrics.summary(), **unbatched},
            "model": str(model_path),
        }
        if proxy is not None:  # the training episodes' agent programs, run totals
            summary["agent"] = proxy.totals()
        if self.paused is not None:
            summary["paused"] = {"step": self.paused.step, "kind": self.paused.kind, "message": self.paused.message}
        if stop_reason is not None:
            summary["stopped"] = {"step": step, "reason": stop_reason}
        if recoveries:
            summary["recoveries"] = recoveries
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        plot_curves(self.history, self.run_dir / "curves.png", title=f"{self.cfg.env.id} / {self.cfg.algo.name}")
        return summary


def unbatched(batched_episodes: int, queue_metrics: dict[str, Any]) -> dict[str, Any]:
    """Why the finished episodes (``rollout.episodes``) outnumber those in the steps' batches
    (``batched_episodes``; both count this process's run): the rest were in groups dropped for
    staleness, filtered by dynamic sampling or still queued at the end, or were in flight when
    it ended. The group counts are the queue's (``queue_metrics``; a resumed run's earlier
    processes included)."""
    return {
        "batched_episodes": batched_episodes,
        "groups_not_batched": {
            "stale_dropped": queue_metrics.get("dropped_groups", 0),
            "filtered": queue_metrics.get("filtered_groups", 0),
            "queued_at_end": queue_metrics.get("buffered_groups", 0),
        },
    }
