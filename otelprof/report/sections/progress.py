"""Training progress: the recorded scalars (loss, learning rate, throughput, gradient norm) against the step.
"""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.analysis import progress as prog
from otelprof.analysis.report import Report
from otelprof.report import svg
from otelprof.report.blocks import IN_RECORDING, charts, figure, from_prometheus, note, p, section, table
from otelprof.report.formatting import DASH, finite, num

CURVE_LABELS = {sc.SCALAR_LOSS: "Loss", sc.SCALAR_LEARNING_RATE: "Learning rate", prog.SAMPLES_PER_SECOND:
                "Throughput, samples/s", prog.TOKENS_PER_SECOND: "Throughput, tokens/s",
                sc.SCALAR_GRAD_NORM: "Gradient norm"}


MISSING_SCALARS = {
    sc.SCALAR_LOSS: "otelprof.record(\"loss\", loss) in the step (otelprof.torch.instrument and otelprof run record it "
                    "from backward())",
    sc.SCALAR_LEARNING_RATE: "otelprof.record(\"learning_rate\", lr) (otelprof.torch.instrument records it from the "
                             "optimizer)",
    sc.SCALAR_SAMPLES: "otelprof.record(\"samples\", batch_size) in the step (the data-loader hook records it when "
                       "a batch has a batch dimension)",
    sc.SCALAR_TOKENS: "otelprof.record(\"tokens\", n) for language models",
}


def _steps_fmt(v: float) -> str:
    return f"{v:,.0f}"


def tick(v: float) -> str:
    """A curve's value on its axis: thousands with separators, small values to 4 significant digits."""
    if not finite(v):
        return DASH
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _curve_label(c: prog.Curve, main: str) -> str:
    who = "all ranks" if c.rank is None else f"rank {c.rank}"
    return f"{c.phase} ({who})" if c.phase != main or c.rank is not None else c.phase


def training(r: Report) -> str:
    """Training progress: one curve per recorded scalar against the step."""
    g = r.progress
    out = []
    live = from_prometheus(r)
    if live:
        out.append(p(f"From Prometheus, at the resolution of its scrapes: each point is the gauge's last value "
                     f"(loss, learning rate) or the counter's rate (samples, tokens per second of wall time) at one "
                     f"evaluation time, against the {g.main_phase} steps counted by then. Every recorded value "
                     f"is in {IN_RECORDING}."))
    else:
        out.append(p(f"Recorded scalars against the {g.main_phase} step number. {g.main_phase.capitalize()} steps "
                     "give a point each; another phase (evaluation) gives a point per pass: the value the loop "
                     "recorded after the pass, else the mean of its steps' values, at the last "
                     f"{g.main_phase} step before it. Throughput is recorded samples (tokens) over each step's "
                     f"duration, all ranks added up. Long runs show at most {g.max_points} points per curve: "
                     "each the mean of a run of consecutive values, the band their minimum to maximum."))
    if not g.curves:
        out.append(note("No training scalar (loss, learning rate, samples, tokens) was recorded, so there is no "
                        "curve to draw.", "warn"))
    names = list(dict.fromkeys(c.name for c in g.curves))
    figures = []
    for name in names:
        curves = [c for c in g.curves if c.name == name]
        series = [(_curve_label(c, g.main_phase), c.x, c.y, c.low, c.high) for c in curves]
        title = CURVE_LABELS.get(name, name)
        if live:
            caption = "; ".join(f"{c.phase}: {c.values:,} point(s)" + (", where the value changed" if c.per_pass
                                                                       else "") for c in curves)
        else:
            caption = "; ".join(
                f"{c.phase}: " + ("one point per pass" if c.per_pass else
                                  "every step" if c.per_point == 1 else f"mean of {c.per_point:,} steps per point")
                + f", {c.values:,} value(s)" for c in curves)
        figures.append(figure(svg.xy(series, title, tick, _steps_fmt, width=560), f"{title} over {g.main_phase} "
                              f"steps ({caption})."))
    if figures:
        out.append(charts(*figures))
    for c in g.curves:
        if c.nonfinite:
            where = f", the first at step {c.first_nonfinite:,.0f}" if c.first_nonfinite is not None else ""
            out.append(note(f"{c.nonfinite:,} {CURVE_LABELS.get(c.name, c.name).lower()} value(s) of {c.phase} were "
                            f"NaN or infinite{where}; the curve leaves them out.", "bad"))
    if g.curves:
        out.append(table(("Curve", "Phase", "Rank", "Values", "First", "Last", "Not finite"),
                         [(CURVE_LABELS.get(c.name, c.name), c.phase, "all" if c.rank is None else c.rank,
                           f"{c.values:,}", num(c.first), num(c.last), f"{c.nonfinite:,}") for c in g.curves], 3))
    if g.curves_left_out:
        out.append(p("Curves not drawn (more than the report shows): " + ", ".join(g.curves_left_out) + "."))
    if g.missing:
        out.append(p("Not recorded: " + "; ".join(f"{name} — {MISSING_SCALARS.get(name, '')}" for name in g.missing)
                     + "."))
    return section("training", "Training progress", "".join(out))
