"""Static SVG line charts for the run report (no JavaScript, no network, no plotting library).

Owns turning a few named ``[(x, y), ...]`` series into one self-contained ``<svg>`` string with axes,
tick labels, a legend and a ``<title>`` per point (the browser shows it on hover). A point whose y is
not finite (NaN) is a gap: the line stops there and starts again after it. Does not read runs or
decide what to plot (``agentrl.observe.report``).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.01:
        return f"{v:.2g}"
    return f"{v:.3g}"


def _segments(pts: list[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """The runs of finite points between gaps (non-finite y)."""
    out: list[list[tuple[float, float]]] = [[]]
    for x, y in pts:
        if math.isfinite(y):
            out[-1].append((x, y))
        elif out[-1]:
            out.append([])
    return [seg for seg in out if seg]


def line_chart(
    series: dict[str, Sequence[tuple[float, float]]],
    title: str,
    *,
    width: int = 460,
    height: int = 240,
    y_label: str = "",
    y_range: tuple[float, float] | None = None,
) -> str:
    """One chart; series with no finite points are left out (an empty chart says "no data").
    ``y_range``: a fixed y axis (rates: (0, 1)), else the data's range."""
    pts_all = {k: [(float(x), float(y)) for x, y in pts] for k, pts in series.items()}
    segments = {k: _segments(v) for k, v in pts_all.items()}
    clean = {k: [p for seg in segs for p in seg] for k, segs in segments.items()}
    clean = {k: v for k, v in clean.items() if v}
    left, right, top, bottom = 52, 12, 28, 40
    pw, ph = width - left - right, height - top - bottom
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
        f'<text x="{left}" y="16" class="ct">{html.escape(title)}</text>',
    ]
    if not clean:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="nd">no data</text></svg>')
        return "".join(out)
    xs = [x for pts in clean.values() for x, _ in pts]
    ys = [y for pts in clean.values() for _, y in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = y_range if y_range is not None else (min(ys), max(ys))
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 0.5 * (abs(y0) or 1), y1 + 0.5 * (abs(y1) or 1)
    if x1 - x0 < 1e-12:
        x0, x1 = x0 - 1, x1 + 1

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="pa"/>')
    for t in _ticks(y0, y1):
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" class="gr"/>'
            f'<text x="{left - 4}" y="{sy(t) + 4:.1f}" text-anchor="end" class="tk">{_fmt(t)}</text>'
        )
    for t in _ticks(x0, x1):
        out.append(f'<text x="{sx(t):.1f}" y="{top + ph + 14}" text-anchor="middle" class="tk">{_fmt(t)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle" class="tk">step</text>')
    if y_label:
        out.append(
            f'<text x="12" y="{top + ph / 2}" transform="rotate(-90 12 {top + ph / 2})" '
            f'text-anchor="middle" class="tk">{html.escape(y_label)}</text>'
        )
    for i, (name, pts) in enumerate(clean.items()):
        color = PALETTE[i % len(PALETTE)]
        path = " ".join(
            f"{'M' if j == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for seg in segments[name] for j, (x, y) in enumerate(seg)
        )
        out.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="1.6"/>')
        if len(pts) <= 200:
            for x, y in pts:
                out.append(
                    f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2" fill="{color}">'
                    f"<title>{html.escape(name)} @ step {_fmt(x)}: {y:.4g}</title></circle>"
                )
        lx = left + 6 + i * (pw / max(len(clean), 1))
        out.append(
            f'<rect x="{lx:.1f}" y="{top + 4}" width="10" height="3" fill="{color}"/>'
            f'<text x="{lx + 13:.1f}" y="{top + 9}" class="lg">{html.escape(name)}</text>'
        )
    out.append("</svg>")
    return "".join(out)
