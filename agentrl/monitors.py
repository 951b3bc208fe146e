"""Reward-hacking monitors: pure checks over a run's metric history that warn when training looks
like it is gaming the reward rather than learning the task.

Owns three checks, each ``check(history, cfg) -> list[Alert]`` over the per-step metric rows the run
loop writes to ``metrics.jsonl`` (oldest first; missing keys are skipped, never guessed):

- ``kl_spike``: the KL (to the reference when the run has one, ``train/kl``; else policy vs
  behaviour, ``train/ppo_kl``) jumps above ``kl_spike_factor`` x its moving average while the reward
  rises over the same window: the policy moved far, fast, and the reward liked it.
- ``diversity_collapse``: the share of distinct completions within groups
  (``rollout/distinct_frac``) or the trained tokens' entropy (``train/entropy``) falls below
  ``collapse_ratio`` x its early level (median of the first ``window`` steps).
- ``length_anomaly``: sampled tokens per episode (``rollout/tokens_per_episode``) leave their moving
  band by more than ``length_z`` standard deviations (and by more than 20%: tiny noise is ignored).

Does not stop anything itself: the run loop logs the alerts and pauses when ``monitor.pause_on``
names the alert's kind; ``agentrl report`` lists them. Thresholds live in :class:`MonitorConfig`.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

from agentrl.fields import doc

MONITORS = ("kl_spike", "diversity_collapse", "length_anomaly")


@dataclass
class MonitorConfig:
    enabled: bool = doc(True, "Run the reward-hacking monitors every step (alerts go to the log and metrics).")
    window: int = doc(10, "Steps in the moving window the checks compare against.", min=2)
    kl_spike_factor: float = doc(4.0, "kl_spike: KL above this many times its moving average ...", min=1.0)
    kl_min: float = doc(1e-3, "... and above this absolute value (ignores spikes of a tiny KL).", min=0.0)
    collapse_ratio: float = doc(0.25, "diversity_collapse: diversity below this fraction of its early level.", min=0.0, max=1.0)
    length_z: float = doc(4.0, "length_anomaly: tokens per episode this many std devs from the moving mean.", min=0.0)
    pause_on: list = doc([], "Alert kinds that pause the run (checkpoint, then stop): any of kl_spike, "
                             "diversity_collapse, length_anomaly.")


@dataclass(frozen=True)
class Alert:
    step: int
    kind: str  # one of MONITORS
    message: str


Row = dict  # one metrics.jsonl row: {"step": int, "a/b": float, ...}


def _series(history: Sequence[Row], key: str) -> list[tuple[int, float]]:
    return [(int(r.get("step", i)), float(r[key])) for i, r in enumerate(history)
            if isinstance(r.get(key), (int, float)) and math.isfinite(float(r[key]))]


def kl_spike(history: Sequence[Row], cfg: MonitorConfig) -> list[Alert]:
    key = "train/kl" if _series(history, "train/kl") else "train/ppo_kl"
    kl = _series(history, key)
    reward = dict(_series(history, "rollout/reward_mean"))
    alerts = []
    for i in range(cfg.window, len(kl)):
        step, value = kl[i]
        past = [v for _, v in kl[i - cfg.window:i]]
        avg = statistics.fmean(past)
        if value <= cfg.kl_min or value <= cfg.kl_spike_factor * max(avg, 1e-12):
            continue
        past_r = [reward[s] for s, _ in kl[i - cfg.window:i] if s in reward]
        if step in reward and past_r and reward[step] > statistics.fmean(past_r):
            alerts.append(Alert(step, "kl_spike", f"{key}={value:.4g} is {value / max(avg, 1e-12):.1f}x its "
                                                  f"{cfg.window}-step average ({avg:.3g}) while reward rose to "
                                                  f"{reward[step]:.3f} (was {statistics.fmean(past_r):.3f})"))
    return alerts


def diversity_collapse(history: Sequence[Row], cfg: MonitorConfig) -> list[Alert]:
    alerts = []
    for key in ("rollout/distinct_frac", "train/entropy"):
        series = _series(history, key)
        if len(series) <= cfg.window:
            continue
        early = statistics.median(v for _, v in series[: cfg.window])
        if early <= 0:
            continue
        for step, value in series[cfg.window:]:
            if value < cfg.collapse_ratio * early:
                alerts.append(Alert(step, "diversity_collapse", f"{key}={value:.4g} fell below {cfg.collapse_ratio} "
                                                                f"x its early level {early:.4g}"))
    return alerts


def length_anomaly(history: Sequence[Row], cfg: MonitorConfig) -> list[Alert]:
    series = _series(history, "rollout/tokens_per_episode")
    alerts = []
    for i in range(cfg.window, len(series)):
        step, value = series[i]
        past = [v for _, v in series[i - cfg.window:i]]
        mean, sd = statistics.fmean(past), statistics.pstdev(past)
        if abs(value - mean) > cfg.length_z * max(sd, 1e-9) and abs(value - mean) > 0.2 * mean:
            alerts.append(Alert(step, "length_anomaly", f"rollout/tokens_per_episode={value:.1f} vs moving mean "
                                                        f"{mean:.1f} +- {sd:.1f} ({(value - mean) / max(sd, 1e-9):+.1f} sd)"))
    return alerts


CHECKS: dict[str, Callable[[Sequence[Row], MonitorConfig], list[Alert]]] = {
    "kl_spike": kl_spike, "diversity_collapse": diversity_collapse, "length_anomaly": length_anomaly,
}


def check_all(history: Sequence[Row], cfg: MonitorConfig) -> list[Alert]:
    """Every alert over the whole history, ordered by step."""
    alerts = [a for check in CHECKS.values() for a in check(history, cfg)]
    return sorted(alerts, key=lambda a: (a.step, a.kind))


def new_alerts(history: Sequence[Row], cfg: MonitorConfig) -> list[Alert]:
    """Alerts raised by the newest row only (what the run loop checks after each step)."""
    if not history or not cfg.enabled:
        return []
    last = int(history[-1].get("step", len(history) - 1))
    return [a for a in check_all(history, cfg) if a.step == last]
