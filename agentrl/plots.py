"""Curve pictures of a run: reward and held-out solve rate against training steps.

Owns turning ``metrics.jsonl`` rows into a PNG with matplotlib (Agg backend, headless). Does not
compute any metric.
"""
from __future__ import annotations

import json
from pathlib import Path


def read_rows(path: str | Path) -> list[dict]:
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def plot_curves(rows: list[dict], out_png: str | Path, title: str = "agentrl run") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    train = [(r["step"], r["rollout/reward_mean"]) for r in rows if "rollout/reward_mean" in r]
    evals = [(r["step"], r["eval/solve_rate"]) for r in rows if "eval/solve_rate" in r]
    tool = [(r["step"], r["rollout/tool_use_rate"]) for r in rows if "rollout/tool_use_rate" in r]
    if train:
        ax.plot(*zip(*train), label="train reward (mean)", color="tab:blue", alpha=0.8)
    if tool:
        ax.plot(*zip(*tool), label="train tool-use rate", color="tab:green", alpha=0.5, linestyle=":")
    if evals:
        ax.plot(*zip(*evals), label="held-out solve rate", color="tab:red", marker="o")
    ax.set_xlabel("train step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    out = Path(out_png)
    fig.savefig(out)
    plt.close(fig)
    return out
