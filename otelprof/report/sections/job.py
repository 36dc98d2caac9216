"""The job: its summary (time split, steps, ranks) and the environment it ran in.
"""

from __future__ import annotations

from collections.abc import Sequence

from otelprof import semconv as sc
from otelprof.analysis import environment as envmod
from otelprof.analysis.report import Report
from otelprof.report import svg
from otelprof.report.blocks import charts, figure, from_prometheus, note, p, section, table
from otelprof.report.formatting import DASH, pct, secs, when
from otelprof.report.sections.ranks import summaries


def summary(r: Report) -> str:
    """The training job summary: when it ran, how its time split, its ranks."""
    s = r.summary
    out = []
    if s.missing:
        out.append(note("This recording lacks: " + "; ".join(s.missing) + ". The sections that need it say so.",
                        "warn"))
    if s.skipped_lines:
        out.append(note(f"{s.skipped_lines} truncated or corrupt lines were skipped while reading the recording "
                        "(a process killed while writing leaves a partial last line). Figures cover the rest.",
                        "warn"))
    if s.killed_ranks:
        out.append(note("Rank(s) " + ", ".join(map(str, s.killed_ranks)) + " never recorded a clean shutdown: the "
                        "process was killed or is still running, so the job's end is the last thing it recorded.",
                        "warn"))
    if s.terminated:
        out.append(note("Rank(s) " + ", ".join(f"{rank} at {when(at)}" for rank, at in s.terminated) + " received "
                        "SIGTERM (pod eviction or preemption, a deleted job, a stop request, a timeout): otelprof "
                        "flushed the recording then; what followed depended on the program's own handler.", "warn"))
    rows = [
        ("Job", s.job or DASH), ("Run id", s.run_id or DASH),
        ("Ranks (world size)", f"{len(s.ranks)} ({s.world_size})"),
        ("Nodes", ", ".join(s.nodes) or DASH), ("Start", when(s.start)), ("End", when(s.end)),
        ("Job duration", secs(s.duration)), ("Training loop start (first step)", when(s.training_start)),
        ("Training loop end (last step)", when(s.training_end)), ("Training loop duration", secs(s.training_duration)),
        ("Initialization", f"{secs(s.initialization)} ({pct(s.initialization_share)})"),
        ("Training loop", f"{secs(s.training_duration)} ({pct(s.training_share)})"),
        ("Finalization", f"{secs(s.finalization)} ({pct(s.finalization_share)})"),
        ("Steps", ", ".join(f"{phase}: {n:,}" for phase, n in s.steps_per_phase) or "none"),
        ("Instrumented with", (f"otelprof {s.otelprof_version}" if s.otelprof_version else
                               f"{DASH} (no target_info series of the job carries {sc.OTELPROF_VERSION})"))
        if from_prometheus(r) else
        ("Recorded with", f"otelprof {s.otelprof_version or '?'}, recording schema {s.schema_version or '?'}"),
    ]
    out.append(charts(table(("Statistic", "Value"), rows, 2),
                      figure(svg.pie([("initialization", s.initialization or 0.0),
                                      ("training loop", s.training_duration or 0.0),
                                      ("finalization", s.finalization or 0.0)], "Job time", secs),
                             "How the job's time split: before the first step, the steps, after the last step.")))
    if not s.steps_per_phase:
        out.append(p("No step information was recorded, so there is no training loop to measure: wrap each "
                     "iteration in otelprof.step() (or use otelprof.torch.instrument / otelprof run)."))
    elif s.slow_start:
        out.append(note(f"Initialization took {pct(s.initialization_share)} of the job. Look at what runs before "
                        "the first step: data set download or indexing, model construction and compilation, "
                        "checkpoint loading, waiting for all ranks to join.", "warn"))
    if s.rank_summaries:
        out.append("<h3>Ranks</h3>" + summaries(s.rank_summaries)
                   + p(f"Ranks not finished, that dropped records or whose lines were skipped: the first "
                       f"{len(s.standing_out)}." if s.standing_out else
                       "Every rank finished without dropped records or skipped lines."))
    if s.standing_out and (len(s.ranks) > 1 or any(x.dropped and any(v for _, v in x.dropped) for x in s.ranks)):
        out.append(("" if s.rank_summaries else "<h3>Ranks</h3>") + table(
            ("Rank", "Local rank", "Node", "Status", "Started", "First step", "Last step end", "Shutdown", "Steps",
             "Dropped records", "Skipped lines"),
            [(x.rank, x.local_rank, x.node, f"{x.status} ({x.status_basis})" if x.status_basis else x.status,
              when(x.process_start), when(x.first_step_start),
              when(x.last_step_end), when(x.shutdown), f"{x.steps:,}",
              ", ".join(f"{k}: {v:,.0f}" for k, v in x.dropped if v) or "0", x.skipped_lines) for x in s.standing_out],
            4))
    return section("summary", "Training job summary", "".join(out))


MISSING_HINTS: dict[str, str] = {
    sc.HOST_TYPE: "detected on AWS and SageMaker only; elsewhere give it with "
                  "OTEL_RESOURCE_ATTRIBUTES=host.type=<type> (on Kubernetes the value of the node's "
                  "node.kubernetes.io/instance-type label: the downward API cannot pass node labels, so set it "
                  "where the job picks its nodes)",
    sc.CLOUD_PROVIDER: "the machine's DMI strings name no cloud (on premises, or /sys/class/dmi not visible)",
    sc.OTELPROF_GPU_MODEL: "no NVIDIA GPU or NVML library visible, or OTELPROF_GPU_METRICS / OTELPROF_SYSTEM_METRICS "
                           "off",
    envmod.GPUS_SAMPLED: "no node samples",
    envmod.LOGICAL_CPUS: "no node samples",
    sc.OTELPROF_TORCH_VERSION: "PyTorch not installed where the process ran",
}
MISSING_HINTS.update(dict.fromkeys((sc.OTELPROF_GPU_COUNT, sc.OTELPROF_GPU_DRIVER, sc.OTELPROF_CUDA_DRIVER),
                                   MISSING_HINTS[sc.OTELPROF_GPU_MODEL]))
MISSING_HINTS[sc.OTELPROF_TORCH_CUDA] = MISSING_HINTS[sc.OTELPROF_TORCH_VERSION]


def ranks_text(ranks: Sequence[int]) -> str:
    """0, 1, 2, 3, 7 as "0-3, 7"."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:12])
    return text + (" …" if len(runs) > 12 else "")


def _where(row: envmod.EnvironmentRow) -> str:
    if row.everywhere:
        return "all nodes" if row.scope == envmod.SCOPE_NODE else "all ranks"
    if row.scope == envmod.SCOPE_NODE:
        return "node(s) " + ", ".join(row.nodes[:8]) + (" …" if len(row.nodes) > 8 else "")
    return f"rank(s) {ranks_text(row.ranks)}"


def environment(r: Report) -> str:
    """Where the job ran, per rank or node where that differs."""
    e = r.environment
    out = []
    if from_prometheus(r):
        out.append(p("From the resource attributes of the job's processes on target_info (and the instance type "
                     "from kube-state-metrics' kube_node_labels when Prometheus has it), and the node facts the "
                     "system series give."))
    else:
        out.append(p("What each rank recorded about where it ran when it started (its resource attributes), and "
                     "what the node samples counted. A value that differs between ranks or nodes gets a row per "
                     "value."))
    if e.rows:
        out.append(table(("Field", "Value", "Where"),
                         [(row.label, row.value or "not recorded", _where(row)) for row in e.rows], 3,
                         ["fired" if not row.everywhere else "" for row in e.rows]))
    differing = sorted({row.label for row in e.rows if not row.everywhere})
    if differing:
        out.append(note("Not the same everywhere: " + ", ".join(differing) + ". Ranks on different hardware or "
                        "software run at different speeds; compare them in the load-balancing section.", "warn"))
    for field, extra in e.more_values:
        out.append(p(f"{dict((f, lbl) for f, lbl, _, _ in envmod.FIELDS).get(field, field)}: {extra} more value(s) "
                     "not listed."))
    if e.missing:
        by_hint: dict[str, list[str]] = {}
        for field, label in e.missing:
            by_hint.setdefault(MISSING_HINTS.get(field, ""), []).append(label)
        older = any(field == sc.PROCESS_RUNTIME_VERSION for field, _ in e.missing)  # recorded by every otelprof since
        out.append(p("Not recorded: " + "; ".join(", ".join(labels) + (f" ({hint})" if hint else "")
                                                   for hint, labels in by_hint.items()) + "."
                     + (" Processes of an otelprof older than this report record none of these." if older else "")))
    return section("environment", "Environment", "".join(out))
