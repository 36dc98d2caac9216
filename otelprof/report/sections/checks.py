"""What the checks found: the diagnosis that opens the report and the rules summary (each alert's offline
twin and its verdict).
"""

from __future__ import annotations

from html import escape

from otelprof.analysis import diagnosis as dg
from otelprof.analysis.report import Report
from otelprof.report.blocks import IN_RECORDING, Html, from_prometheus, note, p, section, table
from otelprof.report.formatting import DASH, secs, when


def diagnosis(r: Report) -> str:
    """The diagnosis: the headline, where the step time goes, the findings by cost."""
    d = r.diagnosis
    out = [f'<p class="headline {"good" if d.healthy else "warn"}">{escape(d.headline)}</p>']
    if d.time_split:
        out.append(f'<p class="split"><b>Where the step time goes:</b> {escape(d.time_split)}</p>')
    if d.findings:
        items = []
        for i, f in enumerate(d.findings):
            checks = "".join(f'<span class="badge fired">{escape(c)}</span> ' for c in f.checks)
            items.append(
                f'<li class="finding" id="finding-{i + 1}"><div class="cost"><b>{escape(f.title)}</b>: '
                f'{escape(f.cost_text)} {checks}<span class="muted">({escape(f.kind)}, {escape(f.severity)})</span>'
                f'</div><div class="action">What to do: {escape(f.action)}</div>'
                f'<div class="evidence muted">{escape(f.evidence)}. <a href="#{escape(f.section)}">Details</a></div>'
                "</li>")
        out.append(f'<ol class="findings">{"".join(items)}</ol>')
    if d.minor:
        out.append(p("Minor (less than " + dg.pct(dg.MATERIAL) + " of the step time each): "
                     + "; ".join(f"{f.title.lower()}: {f.cost_text}" for f in d.minor) + "."))
    if from_prometheus(r):
        out.append(p("From Prometheus: the same diagnosis from the metrics; figures only a recording holds (outlier "
                     f"step time, operator tables) are in {IN_RECORDING}."))
    return section("diagnosis", "Diagnosis", "".join(out))


def rules(r: Report) -> str:
    """The rules summary: each check's verdict, what it means, what to do."""
    rules = r.rules
    out = []
    if rules.skipped:
        out.append(note(rules.skipped))
        return section("rules", "Rules summary", "".join(out))
    if rules.error:
        out.append(note(f"The checks could not be evaluated: {rules.error}", "bad"))
        return section("rules", "Rules summary", "".join(out))
    if from_prometheus(r):
        out.append(p("The otelprof alerts this Prometheus evaluates: “Fired” counts the evaluations at which the "
                     "alert was firing for the job over the range; datapoints are the samples of the series the "
                     "alert's expression reads, for the job over the range (none: the alert had nothing to judge)."))
    else:
        out.append(p("The alert rules' offline twin: each check the Prometheus alerts make, evaluated on this "
                     f"recording every {secs(rules.interval)} with the same windows, warm-up and thresholds. “Fired” "
                     "counts the evaluations at which the check was firing; datapoints are the samples or steps it "
                     "judged."))
    order = {name: i for i, name in enumerate(dg.check_order(r.diagnosis))}
    judged = tuple(sorted(rules.judged, key=lambda row: (not row.triggered, order.get(row.alert, len(order)))))
    no_data = rules.no_data
    fired = [row for row in judged if row.triggered]
    if fired:
        top = fired[0]
        out.append(note(f"{len(fired)} of {len(judged)} checks with data fired, in the diagnosis's order (causes "
                        f"first): {', '.join(row.alert for row in fired)}. {top.alert} judged {top.datapoints:,} "
                        f"datapoints and fired at {top.firing_evaluations} of {top.evaluations} evaluations"
                        + (f", first at {when(top.first_fired)}" if top.first_fired else "") + ".", "warn"))
    elif judged:
        out.append(note(f"None of the {len(judged)} checks with data fired.", "good"))
    elif rules.rows:
        out.append(note("No check had anything to judge.", "warn"))
    rows = []
    for row in judged:
        badge = Html(f'<span class="badge {"fired" if row.triggered else "ok"}">{escape(row.status)}</span>')
        rows.append((Html(f"<b>{escape(row.alert)}</b><br><span class=muted>{escape(row.original or 'otelprof')}"
                           f"</span>"), badge, Html(escape(row.description)), Html(escape(row.recommendation)),
                     f"{row.firing_evaluations} of {row.evaluations}", f"{row.datapoints:,}",
                     ", ".join(row.subjects) or DASH,
                     Html("<br>".join(escape(f"{k}: {v}") for k, v in row.parameters))))
    if rows:
        out.append('<div class="rules">' + table(
            ("Check (original rule)", "Verdict", "What it means", "What to do", "Fired", "Datapoints", "Where",
             "Parameters"), rows, 8, ["fired" if row.triggered else "" for row in judged]) + "</div>")
    if no_data:
        out.append(Html(f'<p class="nodata"><span class="badge nodata">no data</span> Not judged, no data: '
                         f'{escape(", ".join(row.alert for row in no_data))}. These checks found nothing of what '
                         "they read (GPU samples for the GPU checks, steps or regions for the step checks), so they "
                         "say nothing about this run, neither fired nor ok.</p>"))
    if rules.not_evaluated:
        out.append(p("Alerts that need live series and have no offline twin: " + ", ".join(rules.not_evaluated) + "."))
    return section("rules", "Rules summary", "".join(out))
