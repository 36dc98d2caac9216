"""Small inline-SVG charts for the HTML report: pie, bars, histogram, box plots, lines.

Each function returns one ``<svg>`` element as a string (no scripts, no external resources);
labels are escaped here. Styling comes from the report's stylesheet (``.chart`` classes).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from html import escape

from otelprof.analysis.stats import BoxPlot, Series

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac")
Fmt = Callable[[float], str]


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _num(v: float) -> str:
    return f"{v:.1f}"


def _svg(width: float, height: float, body: str, title: str) -> str:
    return (f'<svg class="chart" role="img" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" xmlns="http://www.w3.org/2000/svg">'
            f"<title>{escape(title)}</title>{body}</svg>")


def _text(x: float, y: float, text: str, anchor: str = "start", cls: str = "lbl") -> str:
    return f'<text x="{_num(x)}" y="{_num(y)}" text-anchor="{anchor}" class="{cls}">{escape(text)}</text>'


def pie(items: Sequence[tuple[str, float]], title: str, fmt: Fmt, size: int = 180,
        colors: Sequence[str] | None = None) -> str:
    """A pie with a legend; items with a non-positive value are left out; ``colors`` gives an item's color
    by its position in ``items`` (default: the palette in order)."""
    shade = _shades(items, colors)
    data = [(label, value) for label, value in items if value > 0 and math.isfinite(value)]
    total = sum(v for _, v in data)
    legend_width = 260
    height = max(size, 22 * len(data) + 10)
    if not total:
        return _svg(size + legend_width, 40, _text(4, 24, "no data"), title)
    r = size / 2 - 4
    cx = cy = size / 2
    parts = []
    angle = -math.pi / 2
    for label, value in data:
        sweep = 2 * math.pi * value / total
        tip = f"<title>{escape(label)}: {escape(fmt(value))} ({value / total:.1%})</title>"
        if len(data) == 1 or sweep >= 2 * math.pi - 1e-9:
            parts.append(f'<circle cx="{_num(cx)}" cy="{_num(cy)}" r="{_num(r)}" fill="{shade[label]}">{tip}</circle>')
        else:
            x1, y1 = cx + r * math.cos(angle), cy + r * math.sin(angle)
            x2, y2 = cx + r * math.cos(angle + sweep), cy + r * math.sin(angle + sweep)
            large = 1 if sweep > math.pi else 0
            parts.append(f'<path d="M{_num(cx)},{_num(cy)} L{_num(x1)},{_num(y1)} A{_num(r)},{_num(r)} 0 {large} 1 '
                         f'{_num(x2)},{_num(y2)} Z" fill="{shade[label]}" stroke="#fff" stroke-width="1">{tip}</path>')
        angle += sweep
    for i, (label, value) in enumerate(data):
        y = 16 + 22 * i
        parts.append(f'<rect x="{size + 10}" y="{y - 10}" width="12" height="12" fill="{shade[label]}"/>')
        parts.append(_text(size + 28, y, f"{_short(label, 24)} {value / total:.1%}"))
    return _svg(size + legend_width, height, "".join(parts), title)


def bars(items: Sequence[tuple[str, float]], title: str, fmt: Fmt, width: int = 640,
         limit: float | None = None) -> str:
    """Horizontal bars, one per item, with the formatted value at the end of each bar."""
    data = [(label, value if math.isfinite(value) else 0.0) for label, value in items]
    if not data:
        return _svg(width, 30, _text(4, 20, "no data"), title)
    left, right, row = 190, 90, 20
    top = max(limit or 0.0, max(v for _, v in data)) or 1.0
    span = width - left - right
    parts = []
    for i, (label, value) in enumerate(data):
        y = 6 + row * i
        w = max(span * value / top, 0.0)
        parts.append(_text(left - 6, y + 13, _short(label, 30), "end"))
        parts.append(f'<rect x="{left}" y="{y + 2}" width="{_num(w)}" height="{row - 6}" fill="{color(0)}">'
                     f"<title>{escape(label)}: {escape(fmt(value))}</title></rect>")
        parts.append(_text(left + w + 4, y + 13, fmt(value)))
    return _svg(width, 12 + row * len(data), "".join(parts), title)


def histogram(edges: Sequence[float], counts: Sequence[int], title: str, fmt: Fmt, width: int = 640,
              height: int = 180, markers: Sequence[tuple[str, float]] = ()) -> str:
    """Columns of counts over bins, x axis labelled with ``fmt`` of the edges; optional vertical markers."""
    if not counts:
        return _svg(width, 30, _text(4, 20, "no data"), title)
    left, right, top, bottom = 50, 10, 10, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max(counts) or 1
    lo, hi = edges[0], edges[-1]
    span = (hi - lo) or 1.0
    bw = plot_w / len(counts)
    parts = [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" class="axis"/>']
    for i, c in enumerate(counts):
        h = plot_h * c / peak
        parts.append(f'<rect x="{_num(left + i * bw)}" y="{_num(top + plot_h - h)}" width="{_num(max(bw - 1, 0.5))}" '
                     f'height="{_num(h)}" fill="{color(0)}"><title>{escape(fmt(edges[i]))} to '
                     f"{escape(fmt(edges[i + 1]))}: {c}</title></rect>")
    for k in range(5):
        x = left + plot_w * k / 4
        parts.append(_text(x, height - 18, fmt(lo + span * k / 4), "middle", "tick"))
    parts.append(_text(left - 4, top + 10, str(peak), "end", "tick"))
    parts.append(_text(left - 4, top + plot_h, "0", "end", "tick"))
    for i, (label, value) in enumerate(markers):
        if lo <= value <= hi:
            x = left + plot_w * (value - lo) / span
            parts.append(f'<line x1="{_num(x)}" y1="{top}" x2="{_num(x)}" y2="{top + plot_h}" stroke="{color(i + 3)}" '
                         f'stroke-dasharray="4 3"/>')
            parts.append(_text(x + 3, top + 12 + 12 * i, label, "start", "tick"))
    parts.append(_text(left + plot_w / 2, height - 3, "count per bin", "middle", "tick"))
    return _svg(width, height, "".join(parts), title)


def columns(values: Sequence[float], title: str, fmt: Fmt, label: Callable[[int], str], high: float = 1.0,
            width: int = 640, height: int = 150) -> str:
    """Vertical bars, one per value (e.g. per logical CPU), against a 0..``high`` axis."""
    if not values:
        return _svg(width, 30, _text(4, 20, "no data"), title)
    left, right, top, bottom = 50, 10, 10, 24
    plot_w, plot_h = width - left - right, height - top - bottom
    bw = plot_w / len(values)
    parts = [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" class="axis"/>']
    for k in range(3):
        gy = top + plot_h - plot_h * k / 2
        parts.append(f'<line x1="{left}" y1="{_num(gy)}" x2="{left + plot_w}" y2="{_num(gy)}" class="grid"/>')
        parts.append(_text(left - 4, gy + 4, fmt(high * k / 2), "end", "tick"))
    step = max(1, len(values) // 8)
    for i, v in enumerate(values):
        h = plot_h * min(max(v, 0.0), high) / high if math.isfinite(v) else 0.0
        parts.append(f'<rect x="{_num(left + i * bw)}" y="{_num(top + plot_h - h)}" width="{_num(max(bw - 1, 0.5))}" '
                     f'height="{_num(h)}" fill="{color(0)}"><title>{escape(label(i))}: {escape(fmt(v))}</title></rect>')
        if i % step == 0:
            parts.append(_text(left + (i + 0.5) * bw, height - 8, label(i), "middle", "tick"))
    return _svg(width, height, "".join(parts), title)


def overlaid(edges: Sequence[float], series: Sequence[tuple[str, Sequence[int]]], title: str, fmt: Fmt,
             width: int = 640, height: int = 200) -> str:
    """Several histograms over the same bins as step lines (one color each)."""
    data = [(label, counts) for label, counts in series if counts and max(counts) > 0]
    if not data:
        return _svg(width, 30, _text(4, 20, "no data"), title)
    left, right, top, bottom = 50, 130, 10, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max(max(c) for _, c in data)
    bins = len(data[0][1])
    parts = [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" class="axis"/>']
    for i, (label, counts) in enumerate(data):
        points = []
        for b, c in enumerate(counts):
            y = top + plot_h - plot_h * c / peak
            points += [f"{_num(left + plot_w * b / bins)},{_num(y)}",
                       f"{_num(left + plot_w * (b + 1) / bins)},{_num(y)}"]
        parts.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="{color(i)}" stroke-width="1.5">'
                     f"<title>{escape(label)}</title></polyline>")
        parts.append(f'<rect x="{width - right + 8}" y="{top + 14 * i}" width="10" height="10" fill="{color(i)}"/>')
        parts.append(_text(width - right + 22, top + 9 + 14 * i, _short(label, 16), "start", "tick"))
    for k in range(5):
        parts.append(_text(left + plot_w * k / 4, height - 14, fmt(edges[0] + (edges[-1] - edges[0]) * k / 4),
                           "middle", "tick"))
    parts.append(_text(left - 4, top + 10, str(peak), "end", "tick"))
    return _svg(width, height, "".join(parts), title)


def boxplots(items: Sequence[tuple[str, BoxPlot]], title: str, fmt: Fmt, low: float = 0.0,
             high: float | None = None, width: int = 640) -> str:
    """Horizontal box plots: box from q1 to q3 with the median, Tukey whiskers, a dot at the mean."""
    data = [(label, box) for label, box in items if box.count]
    if not data:
        return _svg(width, 30, _text(4, 20, "no data"), title)
    left, right, row = 150, 20, 26
    top_value = high if high is not None else max(b.max for _, b in data)
    span = (top_value - low) or 1.0
    plot_w = width - left - right
    height = 30 + row * len(data)

    def x(v: float) -> float:
        return left + plot_w * (min(max(v, low), top_value) - low) / span

    parts = []
    for k in range(5):
        gx = left + plot_w * k / 4
        parts.append(f'<line x1="{_num(gx)}" y1="4" x2="{_num(gx)}" y2="{height - 22}" class="grid"/>')
        parts.append(_text(gx, height - 8, fmt(low + span * k / 4), "middle", "tick"))
    for i, (label, b) in enumerate(data):
        y = 8 + row * i
        mid = y + row / 2 - 3
        tip = (f"<title>{escape(label)}: min {escape(fmt(b.min))}, q1 {escape(fmt(b.q1))}, median "
               f"{escape(fmt(b.median))}, q3 {escape(fmt(b.q3))}, max {escape(fmt(b.max))}</title>")
        parts.append(_text(left - 6, mid + 4, _short(label, 22), "end"))
        parts.append(f'<line x1="{_num(x(b.whisker_low))}" y1="{_num(mid)}" x2="{_num(x(b.whisker_high))}" '
                     f'y2="{_num(mid)}" class="whisker"/>')
        for v in (b.whisker_low, b.whisker_high):
            parts.append(f'<line x1="{_num(x(v))}" y1="{_num(mid - 5)}" x2="{_num(x(v))}" y2="{_num(mid + 5)}" '
                         'class="whisker"/>')
        parts.append(f'<rect x="{_num(x(b.q1))}" y="{_num(mid - 8)}" width="{_num(max(x(b.q3) - x(b.q1), 1))}" '
                     f'height="16" fill="{color(i)}" fill-opacity="0.55" stroke="{color(i)}">{tip}</rect>')
        parts.append(f'<line x1="{_num(x(b.median))}" y1="{_num(mid - 8)}" x2="{_num(x(b.median))}" '
                     f'y2="{_num(mid + 8)}" stroke="#222" stroke-width="2"/>')
        parts.append(f'<circle cx="{_num(x(b.mean))}" cy="{_num(mid)}" r="2.5" fill="#222"/>')
    return _svg(width, height, "".join(parts), title)


def lines(series: Sequence[tuple[str, Series]], title: str, fmt: Fmt, low: float = 0.0, high: float | None = None,
          width: int = 640, height: int = 200, x_fmt: Fmt | None = None, use_max: bool = False) -> str:
    """Time series (bucket means, or maxima with ``use_max``) against seconds since the run's start."""
    data = [(label, s) for label, s in series if s.t]
    if not data:
        return _svg(width, 30, _text(4, 20, "no data"), title)
    left, right, top, bottom = 56, 130, 10, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    t0 = min(s.t[0] for _, s in data)
    t1 = max(s.t[-1] for _, s in data)
    tspan = (t1 - t0) or 1.0
    values = [v for _, s in data for v in (s.max if use_max else s.mean)]
    vhigh = high if high is not None else max(values)
    vspan = (vhigh - low) or 1.0
    x_fmt = x_fmt or (lambda v: f"{v:.0f} s")
    parts = [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" class="axis"/>']
    for k in range(5):
        gy = top + plot_h - plot_h * k / 4
        parts.append(f'<line x1="{left}" y1="{_num(gy)}" x2="{left + plot_w}" y2="{_num(gy)}" class="grid"/>')
        parts.append(_text(left - 4, gy + 4, fmt(low + vspan * k / 4), "end", "tick"))
        parts.append(_text(left + plot_w * k / 4, height - 12, x_fmt(t0 + tspan * k / 4), "middle", "tick"))
    for i, (label, s) in enumerate(data):
        ys = s.max if use_max else s.mean
        pts = " ".join(f"{_num(left + plot_w * (t - t0) / tspan)},"
                       f"{_num(top + plot_h - plot_h * (min(max(v, low), vhigh) - low) / vspan)}"
                       for t, v in zip(s.t, ys))
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{color(i)}" stroke-width="1.4">'
                     f"<title>{escape(label)}</title></polyline>")
        parts.append(f'<rect x="{width - right + 8}" y="{top + 14 * i}" width="10" height="10" fill="{color(i)}"/>')
        parts.append(_text(width - right + 22, top + 9 + 14 * i, _short(label, 16), "start", "tick"))
    return _svg(width, height, "".join(parts), title)


def _shades(items: Sequence[tuple[str, float]], colors: Sequence[str] | None) -> dict[str, str]:
    """Color per label: from ``colors`` by position, else the palette in order."""
    return {label: colors[i] if colors is not None and i < len(colors) else color(i)
            for i, (label, _) in enumerate(items)}


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


XySeries = tuple[str, Sequence[float], Sequence[float], Sequence[float], Sequence[float]]
"""(label, x, y, band low, band high): a line of y over x with a shaded band (no band where low == high)."""


def xy(series: Sequence[XySeries], title: str, fmt: Fmt, x_fmt: Fmt, width: int = 640, height: int = 210,
       markers: Sequence[tuple[float, float, str]] = (), zero: bool = False, dots: int = 40) -> str:
    """Lines of y over a numeric x (steps, seconds), each with its band; ``markers`` are (x, y, tooltip) points
    drawn in red on top (outliers). The y axis spans the data (from 0 with ``zero``); a series of at most
    ``dots`` points also gets a dot per point (so a single evaluation shows)."""
    data = [s for s in series if s[1]]
    if not data and not markers:
        return _svg(width, 30, _text(4, 20, "no data"), title)
    left, right, top, bottom = 60, 130, 10, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [v for s in data for v in s[1]] + [m[0] for m in markers]
    ys = ([v for s in data for v in (*s[2], *s[3], *s[4]) if math.isfinite(v)]
          + [m[1] for m in markers if math.isfinite(m[1])])
    x0, x1 = min(xs), max(xs)
    y0, y1 = (min(ys), max(ys)) if ys else (0.0, 1.0)
    floor = 0.0 if y0 >= 0 else -math.inf  # data that cannot be negative (bytes, seconds) gets no negative tick
    if zero:
        y0 = min(y0, 0.0)
    if y1 <= y0:
        y0, y1 = y0 - (abs(y0) * 0.05 or 0.5), y1 + (abs(y1) * 0.05 or 0.5)
    else:
        pad = (y1 - y0) * 0.05
        y0, y1 = (y0 if zero and y0 == 0 else y0 - pad), y1 + pad
    y0 = max(y0, floor)
    xspan, yspan = (x1 - x0) or 1.0, y1 - y0

    def px(v: float) -> str:
        return _num(left + plot_w * (v - x0) / xspan if x1 > x0 else left + plot_w / 2)

    def py(v: float) -> str:
        return _num(top + plot_h - plot_h * (min(max(v, y0), y1) - y0) / yspan)

    parts = [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" class="axis"/>']
    for k in range(5):
        gy = top + plot_h - plot_h * k / 4
        parts.append(f'<line x1="{left}" y1="{_num(gy)}" x2="{left + plot_w}" y2="{_num(gy)}" class="grid"/>')
        parts.append(_text(left - 4, gy + 4, fmt(y0 + yspan * k / 4), "end", "tick"))
        if x1 > x0 or k == 2:
            parts.append(_text(left + plot_w * k / 4, height - 12, x_fmt(x0 + xspan * k / 4), "middle", "tick"))
    for i, (label, x, y, low, high) in enumerate(data):
        for a, b in _segments(x):
            if any(lo != hi for lo, hi in zip(low[a:b], high[a:b])):
                outline = ([f"{px(u)},{py(v)}" for u, v in zip(x[a:b], high[a:b])]
                           + [f"{px(u)},{py(v)}" for u, v in zip(reversed(x[a:b]), reversed(low[a:b]))])
                parts.append(f'<polygon points="{" ".join(outline)}" fill="{color(i)}" fill-opacity="0.18" '
                             'stroke="none"/>')
            points = " ".join(f"{px(u)},{py(v)}" for u, v in zip(x[a:b], y[a:b]))
            parts.append(f'<polyline points="{points}" fill="none" stroke="{color(i)}" stroke-width="1.4">'
                         f"<title>{escape(label)}</title></polyline>")
        if len(x) <= dots:
            parts += [f'<circle cx="{px(a)}" cy="{py(b)}" r="2.5" fill="{color(i)}"><title>{escape(label)} at '
                      f"{escape(x_fmt(a))}: {escape(fmt(b))}</title></circle>" for a, b in zip(x, y)]
        parts.append(f'<rect x="{width - right + 8}" y="{top + 14 * i}" width="10" height="10" fill="{color(i)}"/>')
        parts.append(_text(width - right + 22, top + 9 + 14 * i, _short(label, 16), "start", "tick"))
    for mx, my, tip in markers:
        parts.append(f'<circle cx="{px(mx)}" cy="{py(my)}" r="3" fill="none" stroke="#d62728" stroke-width="1.5">'
                     f"<title>{escape(tip)}</title></circle>")
    if markers:
        n = len(data)
        parts.append(f'<circle cx="{width - right + 13}" cy="{top + 14 * n + 5}" r="3" fill="none" stroke="#d62728" '
                     'stroke-width="1.5"/>')
        parts.append(_text(width - right + 22, top + 9 + 14 * n, "outlier", "start", "tick"))
    return _svg(width, height, "".join(parts), title)


def _segments(x: Sequence[float], gap: float = 8.0) -> list[tuple[int, int]]:
    """Index ranges of ``x`` to draw as one line each: a line breaks where consecutive points lie more than
    ``gap`` times the median spacing apart (the passes of an evaluation phase, a pause)."""
    n = len(x)
    if n < 3:
        return [(0, n)]
    spacing = sorted(b - a for a, b in itertools.pairwise(x))
    limit = gap * spacing[len(spacing) // 2]
    if limit <= 0:
        return [(0, n)]
    out, start = [], 0
    for i in range(1, n):
        if x[i] - x[i - 1] > limit:
            out.append((start, i))
            start = i
    out.append((start, n))
    return out


def stacked(items: Sequence[tuple[str, float]], title: str, fmt: Fmt, width: int = 640,
            colors: Sequence[str] | None = None) -> str:
    """One horizontal bar split into its items (left to right, a color each: ``colors`` by position in ``items``,
    else the palette), with a legend under it."""
    shade = _shades(items, colors)
    data = [(label, value) for label, value in items if value > 0 and math.isfinite(value)]
    total = sum(v for _, v in data)
    if not total:
        return _svg(width, 30, _text(4, 20, "no data"), title)
    left, bar = 4, 26
    span = width - 2 * left
    parts = []
    x = float(left)
    for label, value in data:
        w = span * value / total
        parts.append(f'<rect x="{_num(x)}" y="4" width="{_num(max(w, 0.5))}" height="{bar}" fill="{shade[label]}">'
                     f"<title>{escape(label)}: {escape(fmt(value))} ({value / total:.1%})</title></rect>")
        if w > 48:
            parts.append(f'<text x="{_num(x + w / 2)}" y="{4 + bar / 2 + 4}" text-anchor="middle" class="lbl" '
                         f'fill="#fff" style="fill:#fff">{value / total:.0%}</text>')
        x += w
    per_row = 4
    for i, (label, value) in enumerate(data):
        lx = left + (span / per_row) * (i % per_row)
        ly = bar + 22 + 18 * (i // per_row)
        parts.append(f'<rect x="{_num(lx)}" y="{ly - 10}" width="12" height="12" fill="{shade[label]}"/>')
        parts.append(_text(lx + 16, ly, f"{_short(label, 18)} {fmt(value)}"))
    rows = -(-len(data) // per_row)
    return _svg(width, bar + 18 + 18 * rows, "".join(parts), title)
