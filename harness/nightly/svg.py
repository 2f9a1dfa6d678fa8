"""Trend charts as inline SVG text: a metric of one deployment over the nights, a line per concurrency.

Written by hand (no plotting library, no script) so the dashboard is one static folder that any
browser opens offline. Regressions the gate found are ringed in red; change points are a dashed
vertical line at their first night, labelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

COLOURS = ("#1f5fa8", "#d9541e", "#2a9d4b", "#8e44ad", "#c0392b", "#16a0a0", "#b8860b", "#555555")
WIDTH, HEIGHT = 760, 300
LEFT, RIGHT, TOP, BOTTOM = 70, 120, 28, 62


@dataclass(frozen=True)
class Series:
    label: str  # e.g. "c16"
    values: list[float | None]  # one per night, None where the point did not run or failed


@dataclass(frozen=True)
class Marker:
    """A change point: a vertical line at a night."""

    night: int
    label: str
    worse: bool | None


@dataclass(frozen=True)
class TrendChart:
    title: str
    metric: str
    deployment: str
    nights: list[str]  # night ids, oldest first
    night_labels: list[str]  # what the x axis prints
    night_links: list[str]  # where a night's label links
    series: list[Series]
    regressions: set[tuple[str, int]]  # (series label, night index) the gate flagged
    markers: list[Marker]


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if m * step >= raw)
    first = math.floor(low / step) * step
    return [first + i * step for i in range(count + 3) if first + i * step <= high + step * 0.999]


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def render(chart: TrendChart) -> str:
    """The chart as an <svg> element (class trend-chart, data-metric and data-deployment set)."""
    values = [v for s in chart.series for v in s.values if v is not None]
    ticks = _ticks(min(values, default=0.0), max(values, default=1.0))
    y_low, y_high = ticks[0], ticks[-1]
    n = max(1, len(chart.nights))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + (plot_w * (i + 0.5) / n)

    def y(v: float) -> float:
        return TOP + plot_h * (1.0 - (v - y_low) / ((y_high - y_low) or 1.0))

    out = [f'<svg class="trend-chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
           f'width="{WIDTH}" height="{HEIGHT}" role="img" data-metric="{escape(chart.metric)}" '
           f'data-deployment="{escape(chart.deployment)}">',
           f"<title>{escape(chart.title)}</title>",
           f'<text x="{LEFT}" y="16" class="chart-title">{escape(chart.title)}</text>',
           f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="#fbfbfb" stroke="#ccc"/>']
    for t in ticks:
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#e4e4e4"/>'
                   f'<text x="{LEFT - 6}" y="{y(t) + 4:.1f}" text-anchor="end" class="tick">{_fmt(t)}</text>')
    every = max(1, math.ceil(n / 16))  # at most ~16 labels, so they never overlap
    for i, (label, link) in enumerate(zip(chart.night_labels, chart.night_links, strict=True)):
        if i % every == 0 or i == n - 1:
            out.append(f'<a href="{escape(link)}"><text x="{x(i):.1f}" y="{TOP + plot_h + 14}" '
                       f'text-anchor="end" class="tick" transform="rotate(-35 {x(i):.1f} {TOP + plot_h + 14})">'
                       f"{escape(label)}</text></a>")
    for m in chart.markers:
        colour = "#c0392b" if m.worse else ("#2a9d4b" if m.worse is False else "#777")
        out.append(f'<g class="change-point"><line x1="{x(m.night) - plot_w / n / 2:.1f}" '
                   f'x2="{x(m.night) - plot_w / n / 2:.1f}" y1="{TOP}" y2="{TOP + plot_h}" stroke="{colour}" '
                   f'stroke-dasharray="5 4" stroke-width="1.5"/><title>{escape(m.label)}</title></g>')
    for si, s in enumerate(chart.series):
        colour = COLOURS[si % len(COLOURS)]
        runs: list[list[tuple[float, float]]] = [[]]
        for i, v in enumerate(s.values):
            if v is None:
                runs.append([])  # a gap where the point is missing: never draw across it
            else:
                runs[-1].append((x(i), y(v)))
        for run in (r for r in runs if len(r) > 1):
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in run)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.8"/>')
        for i, v in enumerate(s.values):
            if v is None:
                continue
            tip = escape(f"{chart.nights[i]} {s.label}: {v:,.4g}")
            if (s.label, i) in chart.regressions:
                out.append(f'<circle class="regression" cx="{x(i):.1f}" cy="{y(v):.1f}" r="7" fill="none" '
                           f'stroke="#c0392b" stroke-width="2.2"><title>regression: {tip}</title></circle>')
            out.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3" fill="{colour}"><title>{tip}</title>'
                       "</circle>")
        ly = TOP + 14 + 16 * si
        out.append(f'<line x1="{LEFT + plot_w + 12}" x2="{LEFT + plot_w + 30}" y1="{ly - 4}" y2="{ly - 4}" '
                   f'stroke="{colour}" stroke-width="2"/><text x="{LEFT + plot_w + 34}" y="{ly}" class="tick">'
                   f"{escape(s.label)}</text>")
    if chart.regressions:
        ly = TOP + 14 + 16 * len(chart.series) + 8
        out.append(f'<circle cx="{LEFT + plot_w + 21}" cy="{ly - 4}" r="5" fill="none" stroke="#c0392b" '
                   f'stroke-width="2"/><text x="{LEFT + plot_w + 34}" y="{ly}" class="tick">regression</text>')
    if chart.markers:
        ly = TOP + 14 + 16 * len(chart.series) + 26
        out.append(f'<line x1="{LEFT + plot_w + 21}" x2="{LEFT + plot_w + 21}" y1="{ly - 10}" y2="{ly + 2}" '
                   f'stroke="#777" stroke-dasharray="3 2"/><text x="{LEFT + plot_w + 34}" y="{ly}" '
                   'class="tick">change point</text>')
    if not values:
        out.append(f'<text x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" text-anchor="middle" class="tick">'
                   "no completed points</text>")
    out.append("</svg>")
    return "\n".join(out)

