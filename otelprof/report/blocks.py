"""The HTML building blocks the report's sections are made of: paragraphs, notes, tables, figures, sections
(folded when their checks found nothing), and the wording for a report read from Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

from otelprof.analysis import diagnosis as dg
from otelprof.analysis.report import ORIGIN_PROMETHEUS, Report


class Html(str):
    """Text that is already HTML (not escaped again by :func:`table`)."""


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], left: int = 1, cls: Sequence[str] = ()) -> str:
    """A table; the first ``left`` columns are left-aligned; ``cls`` gives a class per row."""
    head = "".join(f'<th class="l">{escape(h)}</th>' if i < left else f"<th>{escape(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for n, row in enumerate(rows):
        cells = []
        for i, cell in enumerate(row):
            text = cell if isinstance(cell, Html) else escape(str(cell))
            cells.append(f'<td class="l">{text}</td>' if i < left else f"<td>{text}</td>")
        row_cls = f' class="{cls[n]}"' if n < len(cls) and cls[n] else ""
        body.append(f"<tr{row_cls}>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def p(text: str) -> str:
    return f"<p>{escape(text)}</p>"


def note(text: str, kind: str = "") -> str:
    return f'<div class="note {kind}">{escape(text)}</div>'


def figure(chart: str, caption: str) -> str:
    return f"<figure>{chart}<figcaption>{escape(caption)}</figcaption></figure>"


def charts(*figures: str) -> str:
    return f'<div class="charts">{"".join(f for f in figures if f)}</div>'


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{escape(title)}</h2>{body}</section>'


FOLD_BADGES = {dg.STATUS_OK: ("ok", "nothing found"), dg.STATUS_NO_DATA: ("nodata", "no data"),
               dg.STATUS_MINOR: ("ok", "minor")}


def fold(html: str, verdict: dg.SectionVerdict | None) -> str:
    """A section whose checks found nothing, as one line (its verdict) that opens to the whole section."""
    if verdict is None or verdict.status not in FOLD_BADGES:
        return html
    head_end = html.index("</h2>") + len("</h2>")
    open_tag = html.index(">") + 1
    heading = html[open_tag:head_end]
    body = html[head_end:-len("</section>")]
    cls, label = FOLD_BADGES[verdict.status]
    return (f'{html[:open_tag]}<details class="fold"><summary>{heading}<span class="badge {cls}">{label}</span> '
            f'<span class="foldline">{escape(verdict.line)}</span></summary>{body}</details></section>')


def from_prometheus(r: Report) -> bool:
    """Whether the report was read from Prometheus (no individual steps or operators), not a recording."""
    return r.origin == ORIGIN_PROMETHEUS


IN_RECORDING = "the recording (otelprof report RUN_DIR)"
"""Where the figures Prometheus lacks are: wording shared by the sections."""
