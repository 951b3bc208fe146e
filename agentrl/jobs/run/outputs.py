"""What one ``agentrl run`` writes (a mixin of ``Runner``).

Owns: ``_log`` (a metrics row: flattened into the history, the sinks — ``metrics.jsonl``,
TensorBoard, W&B — and the live display), ``_monitor`` (the monitors on the newest row: new alerts
to ``alerts.jsonl``, shown once while they last; an alert in ``monitor.pause_on`` pauses the run),
``_checkpoint`` (the trainer with the run's exactly-once state: the prompt stream with the groups in
flight requeued, the finished-but-untrained groups kept in ``rollouts.jsonl``, the KL controller)
and ``_finish`` (``summary.json``: eval at start and end, rollout totals, the agent proxy's totals
in proxy mode, pause/stop/recovery notes; and ``curves.png``). Does not decide when any of these
runs (``agentrl.jobs.run``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.agents.runner import proxy_runner_of
from agentrl.batches.staleness import dump_ready
from agentrl.episodes.summary import RolloutMetrics
from agentrl.observe.monitors import Alert, new_alerts
from agentrl.observe.progress import RunDisplay


class RunOutputs:
    """Logs, alerts, checkpoints and the summary of ``Runner`` (uses ``cfg``, ``run_dir``, ``step``,
    ``history``, ``sinks``, ``queue``, ``stream``, ``in_flight``, ``trainer``, ``kl``)."""

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

    def _unbatched(self) -> dict[str, Any]:
        """Why the finished episodes (``rollout.episodes``) outnumber those in the steps' batches
        (``batched_episodes``; both count this process's run): the rest were in groups dropped for
        staleness, filtered by dynamic sampling or still queued at the end, or were in flight when
        it ended. The group counts are the queue's (a resumed run's earlier processes included)."""
        q = self.queue.metrics() if getattr(self, "queue", None) is not None else {}
        return {
            "batched_episodes": self.batched_episodes,
            "groups_not_batched": {
                "stale_dropped": q.get("dropped_groups", 0),
                "filtered": q.get("filtered_groups", 0),
                "queued_at_end": q.get("buffered_groups", 0),
            },
        }

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
                for k in ("solve_rate", "episodes", "infra_failures", "infra_failure_rate")
            },
            "eval_tool_use_rate_end": final.get("tool_use_rate"),
            "rollout": {**rollout_metrics.summary(), **self._unbatched()},
            "model": str(self.model_path),
        }
        proxy = proxy_runner_of(self.backend.episodes)
        if proxy is not None:  # the training episodes' agent programs, run totals
            summary["agent"] = proxy.totals()
        if self.paused is not None:
            summary["paused"] = {"step": self.paused.step, "kind": self.paused.kind, "message": self.paused.message}
        if self.stop_reason is not None:
            summary["stopped"] = {"step": self.step, "reason": self.stop_reason}
        if self.supervisor.recoveries:
            summary["recoveries"] = [r.as_dict() for r in self.supervisor.recoveries]
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        plot_curves(self.history, self.run_dir / "curves.png", title=f"{self.cfg.env.id} / {self.cfg.algo.name}")
        return summary
