"""The diagnosis: what this run's time went to, ranked by what it costs, each with this run's numbers and an
action derived from them.

It reads the check results generically (name, severity, status, value, subjects) and the run's analyses
(step-time breakdown, data loading, load balance, system usage, bottlenecks, GPU use, job summary), and
never the recording itself, so a report from a recording and one from Prometheus get the same diagnosis
from the same figures. Causes (waiting for data, a straggler, a CPU or I/O bottleneck, a slow start)
come before symptoms (outlier steps, idle GPUs); time costs before risks. A finding that costs less than
:data:`MATERIAL` of the step time is minor: the run is still healthy. A healthy run says so, with the one
line of where its time goes.

Every text here is final: the HTML report, ``otelprof check`` and its JSON only display it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from otelprof import semconv as sc
from otelprof.analysis.batch import BatchSize
from otelprof.analysis.bottlenecks import Bottleneck
from otelprof.analysis.dataloader import DataLoaderAnalysis, LoaderConfig
from otelprof.analysis.device import DeviceAnalysis
from otelprof.analysis.framework import BETWEEN_STEPS, BETWEEN_STEPS_WARN, FrameworkSummary
from otelprof.analysis.gpu import GpuAnalysis
from otelprof.analysis.loadbalance import LoadBalance
from otelprof.analysis.rule_row import RuleRow
from otelprof.analysis.rules import RulesSummary
from otelprof.analysis.steps import PhaseSteps, StepAnalysis
from otelprof.analysis.summary import JobSummary
from otelprof.analysis.system import SystemUsage
from otelprof.mixin import alert_model
from otelprof.mixin.config import ALERT_PREFIX
from otelprof.mixin.declared import declared, section_checks

MATERIAL = 0.05
"""A finding that costs less than this share of the step time (or of the job, for a slow start) is minor."""

SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}

CAUSE, SYMPTOM, RISK = alert_model.CAUSE, alert_model.SYMPTOM, alert_model.RISK
"""What a finding is: a cause of lost time, a symptom of one, or a risk that costs no time yet (an alert declares
which it backs)."""

STATUS_FINDING = "finding"
STATUS_MINOR = "minor"
STATUS_OK = "ok"
STATUS_NO_DATA = "no data"
"""A report section's verdict: a finding points at it, only minor ones do, its checks judged and found nothing,
or there was nothing to judge."""


@dataclass(frozen=True)
class Finding:
    key: str
    """A stable id: "input-bound", "straggler", "check:LossNotDecreasing", ..."""
    title: str
    cost: float | None
    """Share of the time it costs (see ``cost_text`` for of what); None for a risk that costs no time yet."""
    cost_text: str
    """What it costs, in this run's numbers: "52.6 % of train step time (6.31 s of 12.0 s)"."""
    evidence: str
    """The figures it rests on."""
    action: str
    """What to do, derived from those figures."""
    kind: str
    """CAUSE, SYMPTOM or RISK."""
    severity: str
    checks: tuple[str, ...]
    """The alerts that fired for it (none when the analyses alone found it)."""
    section: str
    """The report section with the details."""


@dataclass(frozen=True)
class SectionVerdict:
    anchor: str
    status: str
    """STATUS_FINDING, STATUS_MINOR, STATUS_OK or STATUS_NO_DATA."""
    line: str
    """One line saying what the section found (shown when it is folded)."""


@dataclass(frozen=True)
class Diagnosis:
    healthy: bool
    headline: str
    time_split: str
    """Where the step time goes, in one line (the main phase's breakdown)."""
    findings: tuple[Finding, ...] = ()
    """Ranked: critical first, then causes and symptoms by cost, then risks."""
    minor: tuple[Finding, ...] = ()
    """Findings that cost less than MATERIAL."""
    sections: tuple[SectionVerdict, ...] = ()

    def section(self, anchor: str) -> SectionVerdict | None:
        return next((s for s in self.sections if s.anchor == anchor), None)


def pending() -> Diagnosis:
    """A placeholder until the report's analyses are done (an empty headline)."""
    return Diagnosis(False, "", "")


# ---------------------------------------------------------------------------------------------- words

def pct(v: float | None) -> str:
    return f"{v * 100:.1f} %" if v is not None and math.isfinite(v) else "-"


def secs(v: float | None) -> str:
    """A duration in the unit that reads best (µs to h); "-" when there is none."""
    if v is None or not math.isfinite(v):
        return "-"
    a = abs(v)
    if a < 1e-3:
        return f"{v * 1e6:.0f} µs"
    if a < 1:
        return f"{v * 1e3:.3g} ms"
    if a < 120:
        return f"{v:.3g} s"
    if a < 7200:
        return f"{v / 60:.1f} min"
    return f"{v / 3600:.2f} h"


def short(alert: str) -> str:
    """An alert's name without the mixin's prefix: OtelprofInputBound -> InputBound."""
    return alert[len(ALERT_PREFIX):] if alert.startswith(ALERT_PREFIX) else alert


# ---------------------------------------------------------------------------------------------- sections

SECTIONS = ("training", "steps", "gpu", "balance", "dataloader", "batch", "cpu-bottleneck", "io-bottleneck",
            "gpu-memory")
"""The report sections that fold to one line when nothing was found, in the report's order."""

SECTION_CHECKS: dict[str, tuple[str, ...]] = section_checks(SECTIONS)
"""Each folding section and the checks that judge it: the alerts declared with that ``section``."""

CHECK_SECTION = {alert.short: alert.section for alert in declared()}
"""The report section each alert's finding points at."""

MAPPED = {alert.short for alert in declared() if alert.kind != RISK}
"""Checks whose firing becomes one of the analyses' findings below (the causes and symptoms they weigh); every
other fired check is a finding of its own."""


# ---------------------------------------------------------------------------------------------- findings

def _fired(rules: RulesSummary, *names: str) -> tuple[str, ...]:
    return tuple(r.alert for r in rules.rows if r.triggered and short(r.alert) in names)


def _main_breakdown(framework: FrameworkSummary) -> tuple[str, float, dict[str, float]] | None:
    """The phase with the most step time: its name, step time and seconds per part."""
    if not framework.breakdowns:
        return None
    b = framework.breakdowns[0]
    return b.phase, b.step_time, {x.name: x.seconds for x in b.parts}


def time_split(framework: FrameworkSummary) -> str:
    main = framework.breakdowns[0] if framework.breakdowns else None
    if main is None:
        phases = [(name, t) for name, t, _ in framework.phases if name != BETWEEN_STEPS]
        return "No steps were recorded." if not phases else ""
    parts = sorted(((x.name, x.share) for x in main.parts if x.seconds > 0), key=lambda kv: -kv[1])
    text = (f"{main.phase} steps ({main.steps:,}, {secs(main.step_time)}): "
            + ", ".join(f"{name} {pct(share)}" for name, share in parts))
    between = next((share for name, _, share in framework.phases if name == BETWEEN_STEPS), None)
    others = [(name, share) for name, _, share in framework.phases if name not in (BETWEEN_STEPS, main.phase)]
    extra = [f"{name} steps {pct(share)}" for name, share in others[:3]]
    if between is not None:
        extra.append(f"between steps {pct(between)}")
    return text + (f"; of the training loop: {', '.join(extra)}" if extra else "") + "."


def _suggested_workers(loader: LoaderConfig, ranks_on_node: int) -> int | None:
    if not loader.cpus_available:
        return None
    return max(1, int(loader.cpus_available // max(ranks_on_node, 1)))


def _loader_action(loader: LoaderConfig | None, ranks_on_node: int, gpus: bool, io: float | None) -> str:
    if loader is None:
        return ("Instrument the data loader (otelprof.torch.instrument(dataloader=...) or otelprof run) to see its "
                "workers; give it more workers (num_workers), prefetching and cheaper preprocessing.")
    pin = ", pin_memory=True" if gpus and loader.pin_memory is not True else ""
    cpus = f"{loader.cpus_available:g} CPUs" if loader.cpus_available else "an unknown number of CPUs"
    share = f" shared by {ranks_on_node} ranks" if ranks_on_node > 1 else ""
    want = _suggested_workers(loader, ranks_on_node)
    if io is not None and io > 0:
        storage = (f" The node waited on I/O in {pct(io)} of its samples while a GPU idled: read from faster "
                   "storage or a local cache.")
    else:
        storage = ""
    if loader.workers is None:
        return (f"Workers not recorded, {cpus}{share} → num_workers={want or 'the CPUs per rank'}"
                f"{pin}, persistent_workers=True.{storage}")
    if want is not None and loader.workers < want:
        return (f"{loader.workers} worker(s) on {cpus}{share} → num_workers={want}{pin}"
                + (", persistent_workers=True" if loader.workers == 0 else "") + f".{storage}")
    return (f"{loader.workers} worker(s) already on {cpus}{share}: more would compete for cores. Make each batch "
            "cheaper: decode or preprocess once offline, smaller samples, prefetch_factor"
            + (", pin_memory=True" if pin else "") + f".{storage}")


def _input_bound(rules: RulesSummary, framework: FrameworkSummary, loader: DataLoaderAnalysis,
                 summary: JobSummary, gpus: GpuAnalysis, io: Bottleneck) -> Finding | None:
    main = _main_breakdown(framework)
    checks = _fired(rules, "InputBound", "TooFewDataLoaderWorkers")
    if main is None or not loader.phases:
        return None
    phase, step_time, parts = main
    wait = parts.get(loader.region, 0.0)
    cost = wait / step_time if step_time > 0 else 0.0
    if not checks and cost < MATERIAL:
        return None
    worst = max((x for x in loader.phases if x.phase == phase), default=None, key=lambda x: x.wait_share) \
        or max(loader.phases, key=lambda x: x.wait_share)
    node = next((r.node for r in summary.ranks if r.rank == worst.rank), "")
    ranks_on_node = sum(1 for r in summary.ranks if r.node == node) or 1
    config = next((x for x in loader.loaders if x.rank == worst.rank), None)
    io_share = max((n.fraction for n in io.nodes if n.node == node), default=None)
    evidence = (f"rank {worst.rank} ({worst.phase}) waited {pct(worst.wait_share)} of its step time; median wait "
                f"{secs(worst.wait.p50)}, p95 {secs(worst.wait.p95)} per step; {worst.input_bound_steps:,} of "
                f"{worst.steps:,} steps waited more than {pct(loader.input_bound_threshold)} of their time")
    return Finding("input-bound", "Waiting for data", cost,
                   f"{pct(cost)} of {phase} step time ({secs(wait)} of {secs(step_time)})",
                   evidence, _loader_action(config, ranks_on_node, bool(gpus.gpus), io_share), CAUSE, "warning",
                   checks, "dataloader")


def _straggler(rules: RulesSummary, load: LoadBalance) -> Finding | None:
    stragglers = [x for x in load.ranks if x.straggler]
    checks = _fired(rules, "RankStraggler")
    if not stragglers:
        return None
    worst = max(stragglers, key=lambda x: x.ratio)
    excess = worst.mean_compute * (1 - 1 / worst.ratio) if worst.ratio > 0 else 0.0
    cost = excess / worst.median_step if worst.median_step > 0 else None
    return Finding(
        "straggler", "A straggling rank", cost,
        f"every rank waits {secs(excess)} per {worst.phase} step for rank {worst.rank} "
        f"({pct(cost)} of the median step)",
        f"rank {worst.rank} computes {worst.ratio:.2f} times its peers' median per {worst.phase} step "
        f"({secs(worst.mean_compute)}, the threshold is {load.straggler_ratio:g} times)"
        + (f"; {len(stragglers) - 1} more straggler(s)" if len(stragglers) > 1 else ""),
        f"Look at rank {worst.rank}'s node: another process on it, thermal or power throttling, a slower GPU, or a "
        "larger data shard; the overlap table shows the collective time the others spend waiting.",
        CAUSE, "warning", checks, "balance")


def _bottleneck(rules: RulesSummary, b: Bottleneck, loader: DataLoaderAnalysis, summary: JobSummary) -> Finding | None:
    io = b.kind == "io"
    name = "IOBottleneck" if io else "CPUBottleneck"
    checks = _fired(rules, name)
    nodes = [n for n in b.nodes if n.datapoints]
    if not nodes:
        return None
    worst = max(nodes, key=lambda n: n.fraction)
    if not checks and worst.fraction <= b.threshold:
        return None
    what = "waited on I/O" if io else "was busy"
    evidence = (f"on {worst.node}, {worst.coincidences:,} of {worst.datapoints:,} samples had a GPU below "
                f"{pct(b.gpu_threshold)} while a CPU {what} above {pct(b.busy_threshold)}"
                + (f"; the ranks were mostly in {worst.regions[0][0]}" if worst.regions else ""))
    if io:
        action = ("Read the data from faster storage or a local copy, in larger files (sharded archives instead of "
                  "many small files), and prefetch.")
    else:
        config = next((x for x in loader.loaders), None)
        ranks_on_node = sum(1 for r in summary.ranks if r.node == worst.node) or 1
        action = ("The CPUs cannot feed the GPUs. " + _loader_action(config, ranks_on_node, True, None)
                  + " Move heavy preprocessing off the step (or to the GPU).")
    return Finding(f"{b.kind}-bottleneck", "I/O bottleneck" if io else "CPU bottleneck", worst.fraction,
                   f"a GPU waited for {'I/O' if io else 'the CPUs'} in {pct(worst.fraction)} of the samples",
                   evidence, action, CAUSE, "warning", checks, f"{b.kind}-bottleneck")


def _slow_start(rules: RulesSummary, summary: JobSummary, framework: FrameworkSummary) -> Finding | None:
    checks = _fired(rules, "SlowInitialization")
    if not checks and not summary.slow_start:
        return None
    before = [r for r in framework.outside_steps if r.total > 0]
    biggest = max(before, key=lambda r: r.total) if before else None
    return Finding(
        "slow-start", "Slow start", summary.initialization_share,
        f"{secs(summary.initialization)} before the first step, {pct(summary.initialization_share)} of the job",
        f"the first step began {secs(summary.initialization)} after the first process started"
        + (f"; the longest region outside steps was {biggest.name} ({secs(biggest.total)})" if biggest else ""),
        (f"Shorten {biggest.name}" if biggest else "Annotate what runs before the first step "
         "(otelprof.annotate) and shorten it")
        + ": cache the data set index, load weights once, compile ahead, check that all ranks start together.",
        CAUSE, "warning", checks, "summary")


def _between_steps(framework: FrameworkSummary) -> Finding | None:
    if framework.between_steps_share <= BETWEEN_STEPS_WARN:
        return None
    between = next((t for name, t, _ in framework.phases if name == BETWEEN_STEPS), 0.0)
    return Finding(
        "between-steps", "Time outside the steps", framework.between_steps_share,
        f"{pct(framework.between_steps_share)} of the training loop ({secs(between)}) passed between steps",
        "time between the end of one step and the start of the next, outside otelprof.step()",
        "Wrap evaluation in its own phase (otelprof.phase(\"eval\")) and annotate checkpointing and logging "
        "(otelprof.annotate) to see what runs there; move what need not run every step out of the loop.",
        CAUSE, "info", (), "framework")


def _outliers(rules: RulesSummary, steps: StepAnalysis, framework: FrameworkSummary) -> Finding | None:
    checks = _fired(rules, "StepOutliers")
    rows = [x for x in steps.rows if x.outliers]
    if not rows:
        return None
    known = [x for x in rows if math.isfinite(x.outlier_excess)]
    step_time = sum(x.durations.mean * x.durations.count for x in steps.rows if x.durations.count)
    excess = math.fsum(x.outlier_excess for x in known)
    cost = excess / step_time if known and step_time > 0 else None
    if not checks and (cost is None or cost < MATERIAL):
        return None
    worst = max(rows, key=lambda x: x.outliers)
    count = sum(x.outliers for x in rows)
    listed = ", ".join(map(str, worst.outlier_steps[:5]))
    known_figures = [f"{name} {secs(v)}" for name, v in (("median", worst.durations.p50),
                                                         ("slowest", worst.durations.max)) if _known(v)]
    slower = (f"steps slower than {secs(worst.threshold)}" if _known(worst.threshold)
              else "outlier steps (each process judges against its own rolling threshold)")
    return Finding(
        "outliers", "Outlier steps", cost,
        (f"{count:,} outlier steps took {secs(excess)} beyond the median step, {pct(cost)} of step time"
         if cost is not None else f"{count:,} outlier steps"),
        f"rank {worst.rank} {worst.phase}: {worst.outliers:,} {slower}"
        + (f" ({', '.join(known_figures)})" if known_figures else "") + (f"; steps {listed}" if listed else ""),
        _outlier_action(worst), SYMPTOM, "warning", checks, "steps")


def _known(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _outlier_action(row: PhaseSteps) -> str:
    """What the outlier steps' own regions say: the region that grew most, against the time they lost."""
    per_step = row.outlier_excess / row.outliers if row.outliers and math.isfinite(row.outlier_excess) else None
    first = row.outlier_steps[0] if row.outlier_steps else None
    where = (f" Open them on the timeline: otelprof timeline RUN_DIR --phase {row.phase} --from-step {first} "
             f"--to-step {first}." if first is not None else " Open them on the timeline (otelprof timeline).")
    if not row.outlier_regions:
        return ("No region grew in them: the time went outside every region (host syncs, logging, checkpointing "
                "inside the step); annotate the loop (otelprof.annotate) to see where." + where)
    name, more = row.outlier_regions[0]
    share = f", of the {secs(per_step)} each lost" if per_step else ""
    text = f"In the outlier steps {name} took {secs(more)} more than in the others{share}: "
    if name == sc.REGION_DATALOADER:
        text += ("the data loader stalls (a slow read, a worker restarting each epoch): more workers, "
                 "prefetch_factor, persistent_workers=True, a faster store.")
    elif name in (sc.REGION_FORWARD, sc.REGION_BACKWARD, sc.REGION_OPTIMIZER):
        text += ("the computation itself slowed — another process on the cores, garbage collection, or longer "
                 "inputs (record tokens per step, so that a long batch is judged per token).")
    else:
        text += f"look at what {name} does at those steps."
    if per_step and more < per_step / 2:
        text += " Most of the rest is outside every region: annotate the loop (otelprof.annotate)."
    return text + where


def _gpu_idle(rules: RulesSummary, gpus: GpuAnalysis, batch: BatchSize) -> Finding | None:
    checks = _fired(rules, "GPUUnderutilized", "GPUUtilizationFluctuating", "BatchSizeTooSmall")
    idle = [g for g in gpus.gpus if g.underused or g.fluctuating]
    if not checks and not idle:
        return None
    used = [g for g in gpus.gpus if g.utilization.count and math.isfinite(g.utilization.mean)]
    if not used:
        return None
    mean = math.fsum(g.utilization.mean for g in used) / len(used)
    cost = max(1.0 - mean, 0.0)
    small = [g for g in batch.gpus if g.small]
    if small:
        memory = max(g.memory_p95 for g in small)
        factor = max(2, int(batch.memory_threshold_p95 / memory)) if memory > 0 else 2
        action = (f"GPU memory p95 is only {pct(memory)}: raise the batch size about {factor} times (scale the "
                  "learning rate with it), or use a smaller GPU.")
    else:
        action = ("Find what the GPUs wait for: the data-loading and bottleneck findings, or host work between "
                  "kernels (launch overhead: fewer, larger kernels, torch.compile, CUDA graphs).")
    return Finding(
        "gpu-idle", "GPUs idle", cost, f"the GPUs were idle {pct(cost)} of the time on average",
        "; ".join(f"GPU {g.gpu} on {g.node}: p50 {pct(g.utilization.median)}, p95 {pct(g.utilization.p95)}"
                  for g in used[:4]),
        action, SYMPTOM, "warning", checks, "gpu")


def _check_finding(row: RuleRow) -> Finding:
    name = short(row.alert)
    where = ", ".join(row.subjects[:4]) or "the job"
    value = f"; when it first fired: {row.value_text}" if row.value_text else ""
    return Finding(
        f"check:{name}", (row.summary or row.description or name).rstrip("."), None,
        f"{row.alert} fired ({row.severity})",
        f"fired at {row.firing_evaluations} of {row.evaluations} evaluations on {where}{value}",
        row.recommendation or "See the alert's runbook entry.", RISK, row.severity, (row.alert,),
        CHECK_SECTION.get(name, "rules"))


# ---------------------------------------------------------------------------------------------- together

def _rank(f: Finding) -> tuple[int, int, int, float]:
    return (0 if f.severity == "critical" else 1, {CAUSE: 0, SYMPTOM: 1, RISK: 2}[f.kind],
            0 if f.cost is not None else 1, -(f.cost or 0.0))


def _sections(findings: Sequence[Finding], minor: Sequence[Finding], rules: RulesSummary,
              lines: dict[str, str]) -> tuple[SectionVerdict, ...]:
    by_short = {short(r.alert): r for r in rules.rows}
    out = []
    for anchor, checks in SECTION_CHECKS.items():
        pointed = [f for f in findings if f.section == anchor]
        small = [f for f in minor if f.section == anchor]
        rows = [by_short[c] for c in checks if c in by_short]
        judged = [r for r in rows if r.status != STATUS_NO_DATA]
        if pointed:
            status, line = STATUS_FINDING, pointed[0].cost_text
        elif small:
            status, line = STATUS_MINOR, small[0].cost_text
        elif judged:
            status = STATUS_OK
            line = ", ".join(f"{short(r.alert)} ok ({r.datapoints:,} datapoints)" for r in judged)
        else:
            status = STATUS_NO_DATA
            line = (", ".join(short(r.alert) for r in rows) + " had nothing to judge") if rows else \
                "nothing was recorded for it"
        extra = lines.get(anchor)
        out.append(SectionVerdict(anchor, status, f"{line}; {extra}" if extra and status != STATUS_FINDING
                                  else line))
    if rules.rows and not rules.fired:
        count = len(rules.judged)
        out.append(SectionVerdict("rules", STATUS_OK if count else STATUS_NO_DATA,
                                  f"{len(rules.rows)} checks, none fired: {count} judged the run, "
                                  f"{len(rules.no_data)} had no data"))
    return tuple(out)


def check_order(d: Diagnosis) -> tuple[str, ...]:
    """The fired checks in the order of the findings they back (causes first)."""
    return tuple(dict.fromkeys(c for f in (*d.findings, *d.minor) for c in f.checks))


def _section_lines(framework: FrameworkSummary, loader: DataLoaderAnalysis, gpus: GpuAnalysis,
                   system: SystemUsage, steps: StepAnalysis) -> dict[str, str]:
    """A figure per section for its folded line."""
    lines = {}
    main = _main_breakdown(framework)
    if main is not None and loader.phases:
        phase, step_time, parts = main
        lines["dataloader"] = (f"waiting for data {pct(parts.get(loader.region, 0.0) / step_time if step_time else 0)}"
                               f" of {phase} step time")
    if not gpus.gpus:
        for anchor in ("gpu", "batch", "cpu-bottleneck", "io-bottleneck"):
            lines[anchor] = "no GPU was sampled"
    if steps.rows:
        main_rows = [x for x in steps.rows if main is None or x.phase == main[0]] or list(steps.rows)
        lines["steps"] = f"median {main_rows[0].phase} step {secs(main_rows[0].durations.p50)}, " \
                         f"{sum(x.outliers for x in steps.rows):,} outlier step(s)"
    if not system.nodes:
        lines.setdefault("gpu-memory", "no node samples")
    return lines


def _finite(f: Finding) -> Finding:
    """A cost that is not a number (a figure Prometheus lacks) is no cost."""
    return f if f.cost is None or math.isfinite(f.cost) else dataclasses.replace(f, cost=None)


def diagnose(rules: RulesSummary, summary: JobSummary, framework: FrameworkSummary, steps: StepAnalysis,
             loader: DataLoaderAnalysis, load: LoadBalance, gpus: GpuAnalysis, system: SystemUsage,
             cpu: Bottleneck, io: Bottleneck, batch: BatchSize, device: DeviceAnalysis | None = None) -> Diagnosis:
    """The ranked findings of a run from its analyses and check results."""
    io_finding = _bottleneck(rules, io, loader, summary)
    candidates: Iterable[Finding | None] = (
        _input_bound(rules, framework, loader, summary, gpus, io), _straggler(rules, load),
        _bottleneck(rules, cpu, loader, summary), io_finding, _slow_start(rules, summary, framework),
        _between_steps(framework), _outliers(rules, steps, framework), _gpu_idle(rules, gpus, batch))
    found = [_finite(f) for f in candidates if f is not None]
    found += [_check_finding(r) for r in rules.rows if r.triggered and short(r.alert) not in MAPPED]
    minor = sorted((f for f in found if f.cost is not None and f.cost < MATERIAL and f.kind != RISK
                    and f.severity != "critical"), key=_rank)
    findings = sorted((f for f in found if f not in minor), key=_rank)
    split = time_split(framework)
    healthy = not findings
    if healthy:
        headline = ("Healthy: " + ("no check fired" if not rules.fired else "the checks that fired cost little")
                    + f" and nothing costs {pct(MATERIAL)} of the step time or more.")
        if not summary.steps_per_phase:
            headline = "Nothing to judge: no steps were recorded."
            healthy = False
        elif rules.skipped or rules.error:
            headline = (f"Nothing costs {pct(MATERIAL)} of the step time or more; the checks were not evaluated, so "
                        "this is the analyses' word alone.")
        elif rules.rows and not rules.judged:
            headline = (f"Nothing costs {pct(MATERIAL)} of the step time or more, but no check had data to judge "
                        "(a run shorter than their warm-up, or no GPU): no verdict yet.")
            healthy = False
    else:
        top = findings[0]
        count = "1 finding" if len(findings) == 1 else f"{len(findings)} findings"
        headline = f"{count}. {top.title}: {top.cost_text}."
    lines = _section_lines(framework, loader, gpus, system, steps)
    sections = _sections(findings, minor, rules, lines)
    if device is not None and device == DeviceAnalysis():
        sections += (SectionVerdict("device", STATUS_NO_DATA, "no profiling window counted FLOPs or saw "
                                    "kernels or allocations, no CUDA-event device time, no CUDA allocator figures"),)
    return Diagnosis(healthy, headline, split, tuple(findings), tuple(minor), sections)


def diagnosis_dict(d: Diagnosis) -> dict[str, object]:
    """The diagnosis as JSON-ready data (``otelprof check --json``)."""
    return {
        "healthy": d.healthy, "headline": d.headline, "time_split": d.time_split,
        "findings": [_finding_dict(f, i + 1) for i, f in enumerate(d.findings)],
        "minor": [_finding_dict(f, None) for f in d.minor],
    }


def _finding_dict(f: Finding, rank: int | None) -> dict[str, object]:
    out: dict[str, object] = {"rank": rank} if rank is not None else {}
    out.update({"key": f.key, "title": f.title, "cost": f.cost if f.cost is None or math.isfinite(f.cost) else None,
                "cost_text": f.cost_text, "evidence": f.evidence, "action": f.action, "kind": f.kind,
                "severity": f.severity, "checks": list(f.checks), "section": f.section})
    return out

