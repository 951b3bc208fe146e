"""Training-health monitors: pure checks over a run's metric history that warn when training looks
like it is gaming the reward rather than learning the task, or when episodes fail for reasons that
are not the policy's.

Owns four checks, each ``check(history, cfg) -> list[Alert]`` over the per-step metric rows the run
loop writes to ``metrics.jsonl`` (oldest first; missing keys are skipped, never guessed):

- ``kl_spike``: the KL (to the reference when the run has one, ``train/kl``; else policy vs
  behaviour, ``train/ppo_kl``) stays above ``kl_spike_factor`` x its moving average (of the window
  before the jump) for ``kl_spike_steps`` steps in a row while the reward rises over its mean of that
  window: the policy moved far, fast, and the reward liked it. One step is not enough: healthy async
  runs have one-step jumps of the policy-vs-behaviour KL (59x its average, to 0.036, in a default
  run), and the reward is above its mean on about half of all steps. One alert per excursion.
- ``diversity_collapse``: the share of distinct completions within groups
  (``rollout/distinct_frac``) or the trained tokens' entropy (``train/entropy``) is below
  ``collapse_ratio`` x its early level (median of the first ``window`` steps) while the reward's
  moving mean has not gained ``collapse_min_gain`` over its early level, or the entropy is below
  ``collapse_entropy_floor``; for ``collapse_steps`` steps in a row. RL on a warm start mostly
  sharpens the policy: diversity falls as the reward climbs, and that is success, not collapse. One
  alert per collapse, at the step it has lasted ``collapse_steps``; it re-arms once the condition
  has been off as long.
- ``length_anomaly``: sampled tokens per episode (``rollout/tokens_per_episode``) leave their moving
  band (more than ``length_z`` standard deviations and more than ``length_rel`` of the moving mean
  of the ``window`` steps before the excursion began) for ``length_steps`` steps in a row. Healthy
  runs leave it for a step or a few when some episodes ramble to the token cap: 6-10 of 256 lift
  the mean 20-45% for up to 3 steps in a row, a few dozen 2-5x for one step; the moving sd of the
  quiet steps before is tiny (0.5 tokens on a mean of 22), so the relative floor and the
  persistence, not the sd, keep such runs quiet. A policy whose length runs away (or collapses)
  stays out. One alert per excursion.
- ``infra_failures``: more than ``infra_failure_max`` of a step's rollout episodes, or of an eval's
  episodes (``rollout/infra_failure_rate``, ``eval/infra_failure_rate``), ended with an
  infrastructure outcome (tool timeout, sandbox/engine/env error...): every step it happens.

Does not stop anything itself: the run loop logs the alerts, shows each kind on the console when it
starts, and pauses when ``monitor.pause_on`` names the alert's kind; ``agentrl report`` lists them.
Thresholds live in :class:`MonitorConfig`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentrl.common.fields import doc
from agentrl.trajectory import Outcome

MONITORS = ("kl_spike", "diversity_collapse", "length_anomaly", "infra_failures")


@dataclass
class MonitorConfig:
    enabled: bool = doc(True, "Run the reward-hacking monitors every step (alerts go to the log and metrics).")
    window: int = doc(10, "Steps in the moving window the checks compare against.", min=2)
    kl_spike_factor: float = doc(4.0, "kl_spike: KL above this many times its moving average ...", min=1.0)
    kl_spike_steps: int = doc(
        2,
        "... for this many steps in a row (a healthy default run has one-step jumps of train/ppo_kl to 59x "
        "its average).",
        min=1,
    )
    kl_min: float = doc(
        0.01,
        "... and above this absolute value: the per-step KL of the healthy default run has a median of "
        "1.5e-4, and many-fold jumps of such a tiny KL are noise.",
        min=0.0,
    )
    collapse_ratio: float = doc(
        0.25, "diversity_collapse: diversity below this fraction of its early level ...", min=0.0, max=1.0
    )
    collapse_min_gain: float = doc(
        0.05,
        "... while the reward's moving mean is not this much above its early "
        "level (a policy that sharpens and earns reward is not collapsing) ...",
    )
    collapse_entropy_floor: float = doc(
        0.01, "... or train/entropy (nats per token) below this, whatever the reward.", min=0.0
    )
    collapse_steps: int = doc(
        5,
        "diversity_collapse: steps the condition must hold before one alert (and must be off before the next).",
        min=1,
    )
    length_z: float = doc(4.0, "length_anomaly: tokens per episode this many std devs from the moving mean.", min=0.0)
    length_rel: float = doc(
        0.5,
        "length_anomaly: ... and more than this fraction of the moving mean away from it (healthy runs "
        "see +20-45% for up to 3 steps when a few episodes ramble to the token cap) ...",
        min=0.0,
    )
    length_steps: int = doc(
        3,
        "length_anomaly: ... for this many steps in a row (a healthy run's one-step blip can reach 5x: "
        "a few dozen episodes cut at the token cap).",
        min=1,
    )
    infra_failure_max: float = doc(
        0.01,
        "infra_failures: alert when more than this fraction of a step's (or an "
        "eval's) episodes end with an infrastructure outcome.",
        min=0.0,
        max=1.0,
    )
    pause_on: list = doc(
        [],
        "Alert kinds that pause the run (checkpoint, then stop): any of kl_spike, "
        "diversity_collapse, length_anomaly, infra_failures.",
    )


@dataclass(frozen=True)
class Alert:
    step: int
    kind: str  # one of MONITORS
    message: str
    about: str = ""  # what in its kind it concerns (infra_failures: "rollout" or "eval"); shown once per (kind, about)


Row = dict  # one metrics.jsonl row: {"step": int, "a/b": float, ...}


def _series(history: Sequence[Row], key: str) -> list[tuple[int, float]]:
    return [
        (int(r.get("step", i)), float(r[key]))
        for i, r in enumerate(history)
        if isinstance(r.get(key), (int, float)) and math.isfinite(float(r[key]))
    ]


def kl_spike(history: Sequence[Row], cfg: MonitorConfig) -> list[Alert]:
    key = "train/kl" if _series(history, "train/kl") else "train/ppo_kl"
    kl = _series(history, key)
    reward = dict(_series(history, "rollout/reward_mean"))
    alerts = []
    run, fired = 0, False  # steps in a row above the bound before this one; alerted in this excursion
    for i in range(cfg.window, len(kl)):
        step, value = kl[i]
        start = i - run  # where the excursion began: compared with the window before it
        before = kl[max(0, start - cfg.window) : start]
        avg = statistics.fmean(v for _, v in before)
        if value <= cfg.kl_min or value <= cfg.kl_spike_factor * max(avg, 1e-12):
            run, fired = 0, False
            continue
        run += 1
        past_r = [reward[s] for s, _ in before if s in reward]
        if fired or run < cfg.kl_spike_steps or step not in reward or not past_r:
            continue
        if reward[step] > statistics.fmean(past_r):
            fired = True
            alerts.append(
                Alert(
                    step,
                    "kl_spike",
                    f"{key}={value:.4g} is {value / max(avg, 1e-12):.1f}x its "
                    f"{cfg.window}-step average ({avg:.3g}) for {run} steps while reward rose to "
                    f"{reward[step]:.3f} (was {statistics.fmean(past_r):.3f})",
                )
            )
    return alerts


DIVERSITY_KEYS = ("rollout/distinct_frac", "train/entropy")


def _collapsed(
    step: int, low: dict[str, tuple[float, float]], reward: list[tuple[int, float]], cfg: MonitorConfig
) -> str | None:
    """Why ``step`` looks collapsed (None if it does not). ``low``: each diversity series' (value,
    early level) at the step; ``reward``: the reward series."""
    ent = low.get("train/entropy")
    if ent is not None and ent[0] < cfg.collapse_entropy_floor:
        return f"train/entropy={ent[0]:.3g} is below collapse_entropy_floor={cfg.collapse_entropy_floor:g}"
    fell = [
        f"{k}={v:.3g} < {cfg.collapse_ratio} x its early {e:.3g}"
        for k, (v, e) in low.items()
        if v < cfg.collapse_ratio * e
    ]
    if not fell:
        return None
    past = [v for s, v in reward if s <= step]
    if len(past) <= cfg.window:  # no reward logged (or too little): diversity alone decides
        return "; ".join(fell)
    early, recent = statistics.median(past[: cfg.window]), statistics.fmean(past[-cfg.window :])
    if recent >= early + cfg.collapse_min_gain:
        return None  # sharpening that pays: the reward rose with the falling diversity
    return (
        f"{'; '.join(fell)}, while the reward's {cfg.window}-step mean {recent:.3f} has not gained "
        f"{cfg.collapse_min_gain:g} over its early {early:.3f}"
    )


def diversity_collapse(history: Sequence[Row], cfg: MonitorConfig) -> list[Alert]:
    series = {k: _series(history, k) for k in DIVERSITY_KEYS}
    early = {k: statistics.median(v for _, v in s[: cfg.window]) for k, s in series.items() if len(s) > cfg.window}
    at = {k: dict(series[k][cfg.window :]) for k in early if early[k] > 0}
    reward = _series(history, "rollout/reward_mean")
    alerts, on, off, active = [], 0, 0, False
    for step in sorted({s for v in at.values() for s in v}):
        why = _collapsed(step, {k: (v[step], early[k]) for k, v in at.items() if step in v}, reward, cfg)
        on, off = (on + 1, 0) if why else (0, off + 1)
        if active and off >= cfg.collapse_steps:
            active = False
        if why and on >= cfg.collapse_steps and not active:
            active = True
            alerts.append(Alert(step, "diversity_collapse", f"{why} (for {on} steps)"))
    return alerts


def _length_out(value: float, past: list[float], cfg: MonitorConfig) -> tuple[bool, str]:
    mean, sd = statistics.fmean(past), statistics.pstdev(past)
    out = abs(value - mean) > cfg.length_z * max(sd, 1e-9) and abs(value - mean) > cfg.length_rel * mean
    return out, f"{mean:.1f} +- {sd:.1f} ({(value - mean) / max(sd, 1e-9):+.1f} sd)"


def length_anomaly(history: Sequence[Row], cfg: MonitorConfig) -> list[Alert]:
    series = _series(history, "rollout/tokens_per_episode")
    alerts, start, fired = [], None, False
    for i in range(cfg.window, len(series)):
        step, value = series[i]
        base = i if start is None else start  # an excursion is judged against the band before it
        past = [v for _, v in series[base - cfg.window : base]]
        out, band = _length_out(value, past, cfg)
        if not out:
            start, fired = None, False
            continue
        start = base
        if not fired and i - start + 1 >= cfg.length_steps:
            fired = True
            steps = i - start + 1
            alerts.append(
                Alert(
                    step,
                    "length_anomaly",
                    f"rollout/tokens_per_episode={value:.1f} vs moving mean {band}"
                    + (f", out of band for {steps} steps" if steps > 1 else ""),
                )
            )
    return alerts


def infra_failures(history: Sequence[Row], cfg: MonitorConfig) -> list[Alert]:
    alerts = []
    for i, r in enumerate(history):
        for part in ("rollout", "eval"):
            rate = r.get(f"{part}/infra_failure_rate")
            if not isinstance(rate, (int, float)) or rate <= cfg.infra_failure_max:
                continue
            n, bad = r.get(f"{part}/episodes"), r.get(f"{part}/infra_failures")
            count = (
                f"{bad:.0f} of {n:.0f} episodes"
                if isinstance(n, (int, float)) and isinstance(bad, (int, float))
                else "episodes"
            )
            outcomes = ", ".join(
                f"{k.rsplit('/', 1)[1]}={v:.0f}"
                for k, v in sorted(r.items())
                if k.startswith(f"{part}/outcome/")
                and isinstance(v, (int, float))
                and v
                and not _trainable(k.rsplit("/", 1)[1])
            )
            alerts.append(
                Alert(
                    int(r.get("step", i)),
                    "infra_failures",
                    f"{part}: {count} ({rate:.1%}) ended with an infrastructure failure, above "
                    f"infra_failure_max={cfg.infra_failure_max:g}" + (f": {outcomes}" if outcomes else ""),
                    about=part,
                )
            )
    return alerts


def _trainable(outcome: str) -> bool:
    try:
        return Outcome(outcome).trainable
    except ValueError:  # an outcome this version does not know: not one of the trainable ones
        return False


CHECKS: dict[str, Callable[[Sequence[Row], MonitorConfig], list[Alert]]] = {
    "kl_spike": kl_spike,
    "diversity_collapse": diversity_collapse,
    "length_anomaly": length_anomaly,
    "infra_failures": infra_failures,
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
