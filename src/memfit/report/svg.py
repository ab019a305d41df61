"""Small inline-SVG charts for the HTML report: no JavaScript, no fonts or files to fetch."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape

#: Series colours (matplotlib's tab10, also used by the PNG), chosen apart for colour-blind
#: readers; the report's tests look for these exact colours in a screenshot.
COLORS = {
    "allocated": "#1f77b4",
    "reserved": "#ff7f0e",
    "device": "#2ca02c",
    "estimate": "#9467bd",
    "oom": "#d62728",
    "step_time": "#8c564b",
    "throughput": "#17becf",
    "sample": "#7f7f7f",
}

MAX_POINTS = 1500  # per series; longer runs are reduced keeping each bucket's extremes


@dataclass
class Series:
    name: str
    color: str
    points: list[tuple[float, float]]
    dash: bool = False
    width: float = 2.5


@dataclass
class Chart:
    title: str
    x_label: str
    y_format: Callable[[float], str]
    series: list[Series] = field(default_factory=list)
    hlines: list[tuple[float, str, str]] = field(default_factory=list)  # (y, label, color)
    vlines: list[tuple[float, str, str]] = field(default_factory=list)  # (x, label, color)
    width: int = 920
    height: int = 300


def reduce_points(
    points: Sequence[tuple[float, float]], n: int = MAX_POINTS
) -> list[tuple[float, float]]:
    """At most ~n points: each bucket keeps its lowest and highest point, in x order."""
    if len(points) <= n:
        return list(points)
    size = math.ceil(len(points) / (n // 2))
    out: list[tuple[float, float]] = []
    for i in range(0, len(points), size):
        bucket = points[i : i + size]
        lo = min(bucket, key=lambda p: p[1])
        hi = max(bucket, key=lambda p: p[1])
        out += sorted({lo, hi})
    return out


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    ticks = []
    t = start
    while t <= hi + 1e-9 * step:
        ticks.append(round(t, 10))
        t += step
    return ticks


def byte_ticks(hi: float, n: int = 5) -> list[float]:
    """Ticks at round multiples of a power-of-two unit (GiB, MiB…)."""
    unit = 1024 ** max(0, min(4, int(math.log(max(hi, 1), 1024))))
    return [t * unit for t in nice_ticks(0, hi / unit, n)]


def render(chart: Chart, *, y_ticks: list[float] | None = None) -> str:
    w, h = chart.width, chart.height
    left, right, top, bottom = 78, 16, 34, 44
    pw, ph = w - left - right, h - top - bottom
    xs = [x for s in chart.series for x, _ in s.points] + [x for x, _, _ in chart.vlines]
    ys = [y for s in chart.series for _, y in s.points] + [y for y, _, _ in chart.hlines]
    if not xs or not ys:
        return (
            f'<svg class="chart" width="{w}" height="60" role="img"><text x="10" y="35" '
            f'class="empty">{escape(chart.title)}: no data in the log</text></svg>'
        )
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x1 = x0 + 1
    y1 = max(ys) * 1.05 or 1.0
    y0 = min(0.0, min(ys))
    yt = y_ticks if y_ticks is not None else nice_ticks(y0, y1)
    y1 = max(y1, max(yt) if yt else y1)

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    out = [
        f'<svg class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        f'aria-label="{escape(chart.title)}">',
        f'<text x="{left}" y="20" class="title">{escape(chart.title)}</text>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="plot"/>',
    ]
    for t in yt:
        y = sy(t)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" class="ytick">{escape(chart.y_format(t))}</text>'
        )
    for t in nice_ticks(x0, x1, 8):
        x = sx(t)
        label = f"{t:g}"
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + ph}" y2="{top + ph + 4}" class="axis"/>'
        )
        out.append(f'<text x="{x:.1f}" y="{top + ph + 17}" class="xtick">{label}</text>')
    out.append(
        f'<text x="{left + pw / 2}" y="{h - 6}" class="xlabel">{escape(chart.x_label)}</text>'
    )
    label_ys = _spread([sy(y) - 4 for y, _, _ in chart.hlines], gap=15, lo=top + 24, hi=top + ph)
    for (y, label, color), ly in zip(chart.hlines, label_ys, strict=True):
        yy = sy(y)
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="{color}" '
            f'stroke-width="1.5" stroke-dasharray="6 4"/>'
            f'<text x="{left + pw - 4}" y="{ly:.1f}" class="hlabel" fill="{color}">'
            f"{escape(label)}</text>"
        )
    for x, label, color in chart.vlines:
        xx = sx(x)
        out.append(
            f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top}" y2="{top + ph}" stroke="{color}" '
            f'stroke-width="2"/><text x="{xx - 4:.1f}" y="{top + ph - 6}" class="vlabel" '
            f'fill="{color}">{escape(label)}</text>'
        )
    for s in chart.series:
        pts = reduce_points(sorted(s.points))
        if not pts:
            continue
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        dash = ' stroke-dasharray="5 4"' if s.dash else ""
        if len(pts) == 1:
            x, y = pts[0]
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{s.color}"/>')
        else:
            out.append(
                f'<polyline points="{d}" fill="none" stroke="{s.color}" stroke-width="{s.width}" '
                f'stroke-linejoin="round"{dash}/>'
            )
    lx = left + max(200, 8 * len(chart.title))
    for s in chart.series:
        if not s.points:
            continue
        out.append(
            f'<rect x="{lx}" y="14" width="16" height="4" fill="{s.color}"/>'
            f'<text x="{lx + 20}" y="20" class="legend">{escape(s.name)}</text>'
        )
        lx += 34 + 6 * len(s.name)
    out.append("</svg>")
    return "\n".join(out)


def _spread(ys: list[float], *, gap: float, lo: float, hi: float) -> list[float]:
    """Label positions near ``ys`` (pixels), at least ``gap`` apart, kept within [lo, hi]."""
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    out = list(ys)
    prev = None
    for i in order:
        y = max(out[i], lo)
        if prev is not None and y < prev + gap:
            y = prev + gap
        out[i] = min(y, hi)
        prev = out[i]
    return out


def stacked_bar(
    rows: list[tuple[str, list[tuple[str, int, str]]]],
    fmt: Callable[[float], str],
    width: int = 920,
) -> str:
    """Horizontal stacked bars: ``rows`` of (label, [(part, bytes, color)]) on one byte scale."""
    total = max((sum(v for _, v, _ in parts) for _, parts in rows), default=0) or 1
    left, bar_h, gap = 150, 26, 16
    h = len(rows) * (bar_h + gap) + 30
    pw = width - left - 120
    out = [f'<svg class="chart" viewBox="0 0 {width} {h}" width="{width}" height="{h}" role="img">']
    for i, (label, parts) in enumerate(rows):
        y = 10 + i * (bar_h + gap)
        out.append(f'<text x="{left - 8}" y="{y + 17}" class="ytick">{escape(label)}</text>')
        x = float(left)
        for name, value, color in parts:
            wv = value / total * pw
            if wv <= 0:
                continue
            out.append(
                f'<rect x="{x:.1f}" y="{y}" width="{wv:.1f}" height="{bar_h}" fill="{color}">'
                f"<title>{escape(name)}: {escape(fmt(value))}</title></rect>"
            )
            if wv > 70:
                out.append(
                    f'<text x="{x + 4:.1f}" y="{y + 17}" class="inbar">{escape(name)}</text>'
                )
            x += wv
        total_s = escape(fmt(sum(v for _, v, _ in parts)))
        out.append(f'<text x="{x + 6:.1f}" y="{y + 17}" class="legend">{total_s}</text>')
    out.append("</svg>")
    return "\n".join(out)
