"""Small, dependency-free SVG charts for the self-contained HTML report.

Charts are drawn in Python so the report needs no script or network to show them, and so
tests can check what is drawn. Each chart is one ``<svg>`` with ``role="img"`` and a
``<title>``; each series is a ``<g class="series" data-series="...">``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]
    markers: bool = True


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0, 1.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.floor(low / step) * step
    ticks = []
    value = start
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 12))
    return ticks


def fmt_number(value: float) -> str:
    """Short axis label: 12k, 1.5k, 250, 20.5, 0.25."""
    magnitude = abs(value)
    if magnitude >= 10000:
        return f"{value / 1000:.0f}k"
    if magnitude >= 1000:
        return f"{value / 1000:.3g}k"
    return f"{value:.4g}" if magnitude >= 1 else f"{value:.3g}"


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    chart_id: str,
    width: int = 560,
    height: int = 300,
    y_from_zero: bool = True,
    step: bool = False,
    vlines: Sequence[tuple[float, str]] = (),
    hlines: Sequence[tuple[float, str]] = (),
) -> str:
    """A line chart (``step=True`` draws a step function, as for a CDF). ``vlines``: ``(x, label)`` event
    markers, drawn as dashed vertical lines (``<g class="marker" data-event=label>``). ``hlines``: ``(y, label)``
    thresholds such as an SLO, drawn as dashed horizontal lines (``<g class="threshold" data-label=label>``) inside
    the y range."""
    left, right, top, bottom = 64, 16, 48, 46
    plot_w, plot_h = width - left - right, height - top - bottom
    points = [p for s in series for p in s.points]
    parts = [
        f'<svg id="{escape(chart_id)}" class="chart" role="img" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}">',
        f"<title>{escape(title)}</title>",
        f'<text class="chart-title" x="{left}" y="20">{escape(title)}</text>',
    ]
    if not points:
        parts.append(f'<text class="empty" x="{width / 2}" y="{height / 2}" text-anchor="middle">no data</text></svg>')
        return "".join(parts)
    xs = [p[0] for p in points] + [x for x, _ in vlines]
    ys = [p[1] for p in points] + [y for y, _ in hlines]
    x_ticks = nice_ticks(min(xs), max(xs))
    y_ticks = nice_ticks(0.0 if y_from_zero else min(ys), max(ys))
    x0, x1 = x_ticks[0], x_ticks[-1]
    y0, y1 = y_ticks[0], y_ticks[-1]

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y0) / (y1 - y0) * plot_h

    parts.append('<g class="axes">')
    for t in y_ticks:
        y = sy(t)
        parts.append(f'<line class="grid" x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt_number(t)}</text>')
    for t in x_ticks:
        x = sx(t)
        parts.append(f'<line class="tickmark" x1="{x:.1f}" x2="{x:.1f}" y1="{top + plot_h}" y2="{top + plot_h + 4}"/>')
        parts.append(f'<text class="tick" x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{fmt_number(t)}</text>')
    parts.append(f'<line class="axis" x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}"/>')
    parts.append(f'<line class="axis" x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}"/>')
    parts.append(f'<text class="label" x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle">{escape(x_label)}</text>')
    parts.append(
        f'<text class="label" transform="translate(14 {top + plot_h / 2}) rotate(-90)" text-anchor="middle">{escape(y_label)}</text>'
    )
    parts.append("</g>")
    for n, (x, label) in enumerate(vlines):
        parts.append(f'<g class="marker" data-event="{escape(label)}"><line x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{top}" '
                     f'y2="{top + plot_h}" stroke="#555" stroke-dasharray="4 3"/><text x="{sx(x) + 3:.1f}" '
                     f'y="{top + 12 + 12 * (n % 3)}">{escape(label)}</text><title>{escape(label)} at {fmt_number(x)} s</title></g>')
    for y, label in hlines:
        parts.append(f'<g class="threshold" data-label="{escape(label)}"><line x1="{left}" x2="{left + plot_w}" '
                     f'y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#b00" stroke-dasharray="6 3"/><text x="{left + plot_w - 4}" '
                     f'y="{sy(y) - 4:.1f}" text-anchor="end" fill="#b00">{escape(label)}</text></g>')
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        coords = []
        previous_y = None
        for x, y in s.points:
            if step and previous_y is not None:
                coords.append(f"{sx(x):.1f},{sy(previous_y):.1f}")
            coords.append(f"{sx(x):.1f},{sy(y):.1f}")
            previous_y = y
        parts.append(f'<g class="series" data-series="{escape(s.name)}">')
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(coords)}"/>')
        if s.markers:
            for x, y in s.points:
                parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{color}"><title>{escape(s.name)}: {fmt_number(x)}, {fmt_number(y)}</title></circle>')
        parts.append("</g>")
    # legend: one row under the title, left to right
    x = left
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        name = s.name[:28]
        parts.append(f'<rect x="{x}" y="28" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text class="legend" x="{x + 14}" y="37">{escape(name)}</text>')
        x += 24 + 6.5 * len(name)
    parts.append("</svg>")
    return "".join(parts)


def cdf_points(values: Sequence[float], max_points: int = 400) -> list[tuple[float, float]]:
    """Empirical CDF as ``(value, fraction <= value)``, thinned to at most ``max_points``."""
    data = sorted(values)
    n = len(data)
    if n == 0:
        return []
    stride = max(1, math.ceil(n / max_points))
    indices = list(range(0, n, stride))
    if indices[-1] != n - 1:
        indices.append(n - 1)
    return [(data[i], (i + 1) / n) for i in indices]
