"""Curves of a run: metric series against training steps, and the ``curves.png`` picture of them.

Owns turning ``metrics.jsonl`` rows into series with gaps (:func:`curve`: a training step that did
not log a metric, e.g. no trainable episode to take a reward mean of, is a gap, not a 0; the report
draws the same series) and the PNG made with matplotlib (Agg backend, headless): train reward, solve
rates counting every task, infrastructure-failure rate and tool use, all on a 0-1 axis. Does not
compute any metric.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def read_rows(path: str | Path) -> list[dict]:
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def _is_step_row(row: dict) -> bool:
    """A training step's row (the run writes eval-only rows at step 0 and after the last step)."""
    return any(k.startswith("rollout/") for k in row)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def curve(rows: list[dict], key: str) -> list[tuple[float, float]]:
    """``[(step, value)]`` of ``key``; NaN (a gap) at training steps that did not log it. ``eval/``
    keys are logged only on eval rows, so they have no gaps; a key never logged gives ``[]``."""
    if not any(_number(r.get(key)) for r in rows):
        return []
    gaps = not key.startswith("eval/")
    return [
        (r.get("step", i), float(r[key]) if _number(r.get(key)) else math.nan)
        for i, r in enumerate(rows)
        if _number(r.get(key)) or (gaps and _is_step_row(r))
    ]


PNG_CURVES = (  # key, label, matplotlib style
    ("rollout/reward_mean", "train reward (mean over trainable episodes)", {"color": "tab:blue", "alpha": 0.8}),
    ("rollout/solve_rate", "train solve rate (every episode)", {"color": "tab:purple", "alpha": 0.5}),
    ("rollout/tool_use_rate", "train tool-use rate", {"color": "tab:green", "alpha": 0.5, "linestyle": ":"}),
    (
        "rollout/infra_failure_rate",
        "train infra-failure rate",
        {"color": "tab:orange", "alpha": 0.8, "linestyle": "--"},
    ),
    ("eval/solve_rate", "held-out solve rate (every task)", {"color": "tab:red", "marker": "o"}),
    (
        "eval/infra_failure_rate",
        "held-out infra-failure rate",
        {"color": "tab:brown", "marker": "x", "linestyle": "--"},
    ),
)


def plot_curves(rows: list[dict], out_png: str | Path, title: str = "agentrl run") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5), dpi=110)
    for key, label, style in PNG_CURVES:
        pts = curve(rows, key)
        if pts:
            ax.plot(*zip(*pts), label=label, **style)  # NaN: matplotlib leaves a gap
    ax.set_xlabel("train step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=7)  # below: six curves hide data
    ax.set_title(title)
    fig.tight_layout()
    out = Path(out_png)
    fig.savefig(out)
    plt.close(fig)
    return out
