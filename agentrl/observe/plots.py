"""Curves of a run: metric series against training steps, drawn with matplotlib.

Owns turning ``metrics.jsonl`` rows into series with gaps (:func:`curve`: a training step that did
not log a metric, e.g. no trainable episode to take a reward mean of, is a gap, not a 0) and the one
chart drawing both pictures of them use (:func:`chart`, a headless matplotlib figure): ``curves.png``
(:func:`plot_curves`: train reward, solve rates counting every task, infrastructure-failure rate and
tool use, all on a 0-1 axis) and the report's inline SVG charts (:func:`svg_chart`, with a tooltip
per point). Does not compute any metric, or decide which charts the report shows
(``agentrl.observe.report``).
"""

from __future__ import annotations

import html
import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Series = Sequence[tuple[float, float]]


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


def chart(
    series: Mapping[str, Series],
    title: str,
    *,
    styles: Mapping[str, dict] | None = None,
    y_range: tuple[float, float] | None = None,
    size: tuple[float, float] = (4.6, 3.0),
    dpi: int = 100,
) -> Figure:
    """One chart: a line per series (a NaN value is a gap: the line stops and starts again), series
    without a finite point left out ("no data" when none has one), the legend below the axes.
    ``styles``: matplotlib keyword arguments per series name; ``y_range``: a fixed y axis (rates:
    (0, 1)), else the data's range."""
    from matplotlib.figure import Figure  # matplotlib loads only when a chart is drawn
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=size, dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=9)
    shown = {name: pts for name, pts in series.items() if any(math.isfinite(y) for _, y in pts)}
    if not shown:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", color="#999", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return fig
    for name, pts in shown.items():
        xs, ys = zip(*pts)
        ax.plot(xs, ys, label=name, linewidth=1.4, **(styles or {}).get(name, {}))
    if y_range is not None:
        pad = 0.02 * (y_range[1] - y_range[0])
        ax.set_ylim(y_range[0] - pad, y_range[1] + pad)
    ax.set_xlabel("train step", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=7, frameon=False)
    return fig


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
    """``curves.png``: the ``PNG_CURVES`` of ``rows`` on one 0-1 axis."""
    series = {label: curve(rows, key) for key, label, _ in PNG_CURVES}
    fig = chart(series, title, styles={label: s for _, label, s in PNG_CURVES}, y_range=(0, 1), size=(7, 5), dpi=110)
    out = Path(out_png)
    fig.savefig(out)
    return out


#: the report's line colours, in series order
PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")
MAX_TOOLTIPS = 200  # per series; a longer one is drawn as a line only


def svg_chart(series: Mapping[str, Series], title: str, *, y_range: tuple[float, float] | None = None) -> str:
    """:func:`chart` as an ``<svg>`` element to put in a page: text kept as text, ``aria-label`` its
    title, and a dot per point (up to ``MAX_TOOLTIPS`` a series) whose ``<title>`` the browser shows
    on hover."""
    import matplotlib  # see chart

    styles: dict[str, dict[str, Any]] = {name: {"color": PALETTE[i % len(PALETTE)]} for i, name in enumerate(series)}
    fig = chart(series, title, styles=styles, y_range=y_range)
    tips: list[str] = []
    ax = fig.axes[0]
    for name, pts in series.items():
        finite = [(x, y) for x, y in pts if math.isfinite(y)]
        for x, y in finite if len(finite) <= MAX_TOOLTIPS else []:
            ax.plot([x], [y], "o", markersize=2.5, gid=f"tip{len(tips)}", **styles[name])
            tips.append(f"{name} @ step {x:g}: {y:.4g}")
    buf = io.StringIO()
    # a salt of its own per chart: ids (clip paths, markers) do not repeat across the charts of one page
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": title}):
        fig.savefig(buf, format="svg", metadata=dict.fromkeys(("Creator", "Date", "Format", "Type")))
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]  # no XML declaration or doctype inside HTML
    svg = svg.replace("<svg ", f'<svg class="chart" role="img" aria-label="{html.escape(title)}" ', 1)
    return re.sub(
        r'<g id="tip(\d+)">', lambda m: f"{m.group(0)}<title>{html.escape(tips[int(m.group(1))])}</title>", svg
    )
