"""A rough look at panels without a Grafana server: query results drawn as SVG line charts (stdlib only).

Used by the dashboards' meaning test when ``OTELPROF_DASHBOARD_PREVIEW`` names a directory: every time
series panel that returned data becomes ``<uid>-<panel id>.svg`` plus an ``index.html`` of them all
(and a PNG beside each SVG when ``rsvg-convert`` is installed).
"""

from __future__ import annotations

import html
import math
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

Series = tuple[str, Sequence[tuple[float, float]]]
"""(legend, [(unix time, value), ...])."""

PALETTE = ("#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0", "#508642",
           "#cca300")
WIDTH, HEIGHT = 760, 320
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 34, 90


def format_value(value: float, unit: str) -> str:
    """A tick label in the panel's unit (the common Grafana units only)."""
    if unit == "percentunit":
        return f"{value * 100:.0f}%"
    if unit == "s":
        return f"{value * 1000:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"
    if unit in ("bytes", "Bps"):
        suffix = "/s" if unit == "Bps" else ""
        for size, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(value) >= size:
                return f"{value / size:.3g} {name}{suffix}"
        return f"{value:.3g} B{suffix}"
    return f"{value:.3g}"


def svg_chart(title: str, unit: str, series: Sequence[Series], max_series: int = 10) -> str:
    points = [(t, v) for _, values in series for t, v in values if math.isfinite(v)]
    if not points:
        raise ValueError("no finite points to draw")
    t0, t1 = min(t for t, _ in points), max(t for t, _ in points)
    low, high = min(0.0, min(v for _, v in points)), max(v for _, v in points)
    if unit == "percentunit":
        low, high = min(low, 0.0), max(high, 1.0)
    if high == low:
        high = low + 1.0
    span_t = max(t1 - t0, 1e-9)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + (t - t0) / span_t * plot_w

    def y(v: float) -> float:
        return TOP + (1 - (v - low) / (high - low)) * plot_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#181b1f"/>',
           f'<text x="{LEFT}" y="20" fill="#d8d9da" font-size="14">{html.escape(title)}</text>']
    for i in range(5):
        value = low + (high - low) * i / 4
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
                   f'stroke="#2c3235"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" fill="#8e8e8e" text-anchor="end">'
                   f"{html.escape(format_value(value, unit))}</text>")
    for i in range(5):
        t = t0 + span_t * i / 4
        out.append(f'<text x="{x(t):.1f}" y="{TOP + plot_h + 14}" fill="#8e8e8e" text-anchor="middle">'
                   f"+{t - t0:.0f} s</text>")
    for index, (legend, values) in enumerate(series[:max_series]):
        color = PALETTE[index % len(PALETTE)]
        finite = [(t, v) for t, v in values if math.isfinite(v)]
        if finite:
            path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in finite)
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{path}"/>')
        row, col = divmod(index, 2)
        lx, ly = LEFT + col * (plot_w // 2), TOP + plot_h + 32 + row * 14
        out.append(f'<rect x="{lx}" y="{ly - 8}" width="10" height="3" fill="{color}"/>')
        out.append(f'<text x="{lx + 14}" y="{ly}" fill="#d8d9da">{html.escape(legend[:60])}</text>')
    if len(series) > max_series:
        out.append(f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 6}" fill="#8e8e8e" text-anchor="end">'
                   f"+{len(series) - max_series} more series</text>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_preview(directory: Path, charts: Sequence[tuple[str, str, str, str, Sequence[Series]]]) -> list[Path]:
    """Write (name, title, description, unit, series) charts as SVG (+ PNG when possible) and an index."""
    directory.mkdir(parents=True, exist_ok=True)
    converter = shutil.which("rsvg-convert")
    written = []
    items = []
    for name, title, description, unit, series in charts:
        svg = directory / f"{name}.svg"
        svg.write_text(svg_chart(title, unit, series), encoding="utf-8")
        written.append(svg)
        if converter:
            png = svg.with_suffix(".png")
            subprocess.run([converter, "-o", str(png), str(svg)], check=True, timeout=60)
            written.append(png)
        items.append(f'<figure><img src="{svg.name}"><figcaption>{html.escape(description)}</figcaption></figure>')
    index = directory / "index.html"
    index.write_text("<!doctype html><meta charset=utf-8><title>otelprof dashboards preview</title>"
                     "<style>body{background:#111217;color:#ccc;font-family:sans-serif}"
                     "figure{display:inline-block;width:760px;margin:8px}</style>\n" + "\n".join(items) + "\n",
                     encoding="utf-8")
    written.append(index)
    return written
