"""The report's "Layers" section: the per-layer norm heatmap and the layers the tensor checks named.

Rendering only: rows, values and their places on the color scale come from
:class:`otelprof.analysis.layers.LayerHeatmap`; a recording without tensor collections gets no section.
"""

from __future__ import annotations

from html import escape

from otelprof.analysis.layers import LayerHeatmap
from otelprof.analysis.report import Report

__all__ = ["LAYERS", "layers_section"]

LAYERS = ("layers", "Layers")  # the section's anchor and title, for the page's navigation
LIGHT = (0xFF, 0xF5, 0xEB)
DARK = (0x7F, 0x27, 0x04)
NONFINITE = "#d62728"
MISSING = "#eeeeee"
CELL = "width:9px;height:14px;padding:0;border:1px solid #fff"


def _color(shade: float) -> str:
    r, g, b = (round(lo + (hi - lo) * shade) for lo, hi in zip(LIGHT, DARK))
    return f"#{r:02x}{g:02x}{b:02x}"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _map(m: LayerHeatmap) -> str:
    head = "".join(f'<th style="{CELL};font-weight:normal;font-size:9px;writing-mode:vertical-rl">{n}</th>'
                   if i % 5 == 0 else f'<th style="{CELL}"></th>' for i, n in enumerate(m.steps))
    rows = []
    for row in m.rows:
        cells = []
        for step, value, shade, bad in zip(m.steps, row.values, row.shades, row.nonfinite):
            fill = NONFINITE if bad else MISSING if shade is None else _color(shade)
            title = f"{row.tensor} at step {step}: {'NaN/Inf' if bad else _num(value)}"
            cells.append(f'<td style="{CELL};background:{fill}" title="{escape(title)}"></td>')
        mark = f' <b class="warn">&#9888; {escape(", ".join(row.named_by))}</b>' if row.named_by else ""
        rows.append(f'<tr><th style="text-align:left;font-weight:normal;white-space:nowrap">'
                    f"{escape(row.tensor)}{mark}</th>{''.join(cells)}</tr>")
    return (f'<div style="overflow-x:auto"><table class="heatmap" style="border-collapse:collapse">'
            f'<tr><th style="text-align:left">tensor \\ step</th>{head}</tr>{"".join(rows)}</table></div>')


def layers_section(report: Report) -> str:
    """The section's HTML ("" for a recording without tensor collections)."""
    m = report.layers
    if m.empty:
        return ""
    intro = (f"L2 norm of each layer at the saved steps of rank {m.rank}: the {m.kind}, and every tensor a "
             f"per-layer check named (first, marked). Color: log scale from {_num(m.low)} (light) to "
             f"{_num(m.high)} (dark); red: NaN/Inf; grey: not saved.")
    out = [f"<p>{escape(intro)}</p>"]
    if m.named:
        by_check: dict[str, list[str]] = {}
        for check, subject in m.named:
            by_check.setdefault(check, []).append(subject)
        items = "".join(f'<tr><td>{escape(check)}</td><td style="text-align:left">{escape(", ".join(subjects))}'
                        "</td></tr>" for check, subjects in by_check.items())
        out.append(f"<table><tr><th>Check</th><th>Layers it named (rank, tensor)</th></tr>{items}</table>")
    else:
        out.append("<p>No per-layer check named a layer.</p>")
    out.append(_map(m))
    if m.omitted_rows or m.omitted_steps:
        more = (f"{m.omitted_rows} more tensors and {m.omitted_steps} more saved steps are in tensors.jsonl "
                "(read_trial).")
        out.append(f'<div class="note">{escape(more)}</div>')
    anchor, title = LAYERS
    return f'<section id="{anchor}"><h2>{title}</h2>{"".join(out)}</section>'
