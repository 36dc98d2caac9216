"""Framework summary: where training time went.

* phases: time inside steps of each phase and the time between steps (data the loop spends
  outside ``step()``), as shares of the training loop, all ranks together;
* forward vs backward: time in the ``forward`` and ``backward`` regions;
* per phase, the breakdown of step time into its top-level regions (data loader, forward, backward,
  optimizer, any other region directly inside the step) and the time no region covers;
* regions (annotations) inside steps and outside them (initialization, checkpoints);
* top CPU and GPU operators of the operator-profiling windows (``torch.profiler``), summed over
  windows and ranks, with the GPU activity mix (kernel / memcpy / memset / sync) and the kernel
  precision mix.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import compress
from operator import add, not_, sub
from typing import Any

from otelprof import semconv as sc
from otelprof.analysis.run import MAX_PHASES, RunView, per_rank
from otelprof.analysis.stats import Bucket, share
from otelprof.recording.columns import StepColumns
from otelprof.shared import nesting

TOP = 20
BETWEEN_STEPS = "between steps"
BREAKDOWN_REGIONS = (sc.REGION_DATALOADER, sc.REGION_FORWARD, sc.REGION_BACKWARD, sc.REGION_OPTIMIZER)
"""The regions the integrations make directly inside a step, first in the breakdown."""
UNCOVERED = "uncovered"
"""Step time in no top-level region: the loop's own code between its regions (loss bookkeeping, logging,
``zero_grad``, a host sync), or work not annotated."""
OTHER_REGIONS = "other regions"
MAX_OTHER_REGIONS = 4
"""Other top-level regions named in a breakdown; the rest are added up as OTHER_REGIONS."""
UNCOVERED_WARN = 0.2
"""A phase whose steps spend more than this share in no region is worth annotating."""
BETWEEN_STEPS_WARN = 0.25
"""Time between steps (outside otelprof.step()) above this share of the training loop is a finding."""
PASS_WARN = 0.7
"""Forward or backward above this share of forward plus backward time is unusual (backward usually costs one to
two times forward)."""
TOP_OPERATORS = 8
"""Operators the report names in its charts; the self time of the rest is added up as "other"."""


@dataclass(frozen=True)
class Part:
    name: str
    seconds: float
    share: float
    """Of the phase's step time."""
    per_step: float
    """Seconds per step of the phase."""


@dataclass(frozen=True)
class Breakdown:
    """Where the time inside one phase's steps went (all ranks)."""

    phase: str
    steps: int
    step_time: float
    """Seconds inside the phase's steps."""
    parts: tuple[Part, ...]
    """BREAKDOWN_REGIONS that occur, the other top-level regions by time (past MAX_OTHER_REGIONS added up as
    OTHER_REGIONS), then UNCOVERED. Top-level regions only (depth 0), so nested regions are not counted
    twice: the parts' seconds add up to ``step_time + overlap``."""
    overlap: float
    """Seconds by which a step's top-level regions added up to more than the step (regions that overlap,
    as regions timed on another thread can); 0 when they follow one another."""
    nesting_known: bool = True
    """False from Prometheus: region depths are unknown there, so only BREAKDOWN_REGIONS are counted
    (as top-level, as the integrations make them) and UNCOVERED is the step time they leave."""
    uncovered_high: bool = field(init=False)
    """UNCOVERED holds more than UNCOVERED_WARN of the step time."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "uncovered_high", any(x.name == UNCOVERED and x.share > UNCOVERED_WARN
                                                       for x in self.parts))

    def part(self, name: str) -> float:
        """Seconds of one part (0 when absent)."""
        return next((x.seconds for x in self.parts if x.name == name), 0.0)


def breakdown(phase: str, steps: int, step_time: float, regions: dict[str, float], uncovered: float,
              overlap: float, nesting_known: bool = True) -> Breakdown:
    """A :class:`Breakdown` from top-level region totals (seconds), its parts in their order."""
    named = [(name, regions[name]) for name in BREAKDOWN_REGIONS if name in regions]
    others = sorted(((n, t) for n, t in regions.items() if n not in BREAKDOWN_REGIONS), key=lambda kv: (-kv[1], kv[0]))
    named += others[:MAX_OTHER_REGIONS]
    if len(others) > MAX_OTHER_REGIONS:
        named.append((OTHER_REGIONS, math.fsum(t for _, t in others[MAX_OTHER_REGIONS:])))
    named.append((UNCOVERED, uncovered))
    return Breakdown(phase, steps, step_time, tuple(Part(name, seconds, share(seconds, step_time),
                                                         seconds / steps if steps else math.nan)
                                                    for name, seconds in named), overlap, nesting_known)


@dataclass(frozen=True)
class Region:
    name: str
    count: int
    total: float
    """Seconds, all ranks."""
    mean: float
    max: float
    share: float
    """Of the time inside steps (regions at depth 0 add up to at most 1)."""
    depth: int
    """Smallest nesting depth seen (0: directly inside the step)."""
    max_bucket: Bucket | None = None
    """When only the region-duration histogram is known (Prometheus): the bucket holding the longest
    instance (``max`` is then NaN)."""
    self_time: float = math.nan
    """Seconds, all ranks: ``total`` less the time of the regions directly inside it (NaN: not known). A region
    inside one of its own name (a user's ``annotate("backward")`` around the hooks' ``backward``) is counted
    once, as the outer one, in ``count``, ``total`` and ``self_time``."""


@dataclass(frozen=True)
class Operator:
    name: str
    calls: int
    self_time: float
    total_time: float
    share: float
    """Of the summed self time of the operators recorded."""


@dataclass(frozen=True)
class ProfileWindow:
    """One requested window, its segments folded in: a window stopped short (the event cap) goes on from the
    next step in a further segment, a record of its own (``segment`` 1, 2, ...)."""
    rank: int
    start_step: int
    num_steps: int
    """Steps profiled, all segments together."""
    start: float
    """Unix seconds."""
    duration: float
    """Seconds under the profiler, all segments together."""
    trace_file: str | None
    """The first segment's trace."""
    last_step: int = -1
    """The last step profiled (of the last segment); start_step + num_steps - 1 for a window of one segment."""
    segments: int = 1
    truncated: tuple[tuple[str, int], ...] = ()
    """(why, segments that stopped there before their planned steps: their last step profiled in part)."""
    trigger: str | None = None
    """What started it: ``periodic``, ``api`` (profile_window), ``capture`` (the control endpoint)."""
    phase: str | None = None


@dataclass(frozen=True)
class FrameworkSummary:
    phases: tuple[tuple[str, float, float], ...]
    """(phase or BETWEEN_STEPS, seconds, share of the training loop)."""
    between_steps_share: float
    forward: float
    backward: float
    forward_share: float
    """forward / (forward + backward)."""
    regions: tuple[Region, ...]
    outside_steps: tuple[Region, ...]
    cpu_operators: tuple[Operator, ...]
    gpu_operators: tuple[Operator, ...]
    cpu_operator_time: float
    gpu_operator_time: float
    gpu_activity: tuple[tuple[str, float], ...]
    kernel_precision: tuple[tuple[str, float], ...]
    windows: tuple[ProfileWindow, ...]
    window_counts: tuple[tuple[int, int], ...] = ()
    """When only metrics are known (Prometheus): (rank, operator-profiling windows completed) from the
    ``otelprof.profile.windows`` counter; the windows themselves and their operators are not known."""
    breakdowns: tuple[Breakdown, ...] = ()
    """Per phase (most step time first)."""
    between_steps_high: bool = field(init=False)
    """More than BETWEEN_STEPS_WARN of the training loop passed between steps."""
    heavier_pass: str = field(init=False)
    """``forward`` or ``backward`` when both ran and that pass took more than PASS_WARN of their time, else ""."""
    heavier_pass_share: float = field(init=False)
    """The heavier pass's share of forward plus backward time (NaN unless both ran)."""
    nested: bool = field(init=False)
    """Some region has regions inside it (its self time is below its total)."""
    cpu_operators_other: float = field(init=False)
    """Seconds of self time of the CPU operators past the first TOP_OPERATORS."""
    gpu_operators_other: float = field(init=False)
    """Seconds of self time of the GPU operators past the first TOP_OPERATORS."""

    def __post_init__(self) -> None:
        both = bool(self.forward and self.backward)
        heavier = max(self.forward_share, 1 - self.forward_share) if both else math.nan
        cpu_top, gpu_top = self.cpu_operators[:TOP_OPERATORS], self.gpu_operators[:TOP_OPERATORS]
        derived = {
            "between_steps_high": self.between_steps_share > BETWEEN_STEPS_WARN,
            "heavier_pass": ("forward" if self.forward_share > 0.5 else "backward") if heavier > PASS_WARN else "",
            "heavier_pass_share": heavier,
            "nested": any(math.isfinite(x.self_time) and x.self_time < x.total for x in self.regions),
            "cpu_operators_other": self.cpu_operator_time - sum(o.self_time for o in cpu_top),
            "gpu_operators_other": self.gpu_operator_time - sum(o.self_time for o in gpu_top),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def breakdown(self, phase: str) -> Breakdown | None:
        return next((b for b in self.breakdowns if b.phase == phase), None)


def _regions(totals: dict[str, list[float]], step_time: float, top: int,
             covered: dict[str, float] | None = None) -> tuple[Region, ...]:
    rows = [Region(name, int(count), total, total / count if count else math.nan, peak, share(total, step_time),
                   int(depth), None, total - covered.get(name, 0.0) if covered is not None else math.nan)
            for name, (count, total, peak, depth) in totals.items()]
    return tuple(sorted(rows, key=lambda r: -r.total)[:top])


def _covered(columns: StepColumns) -> dict[str, float]:
    """Per region name: seconds of its (counted) instances covered by the regions directly inside them, all
    steps of one rank; a region's self time is its total less this. Only steps with a region nested in
    another are looked at (the all-reduces, depth 1 wherever they fall, take nothing from their parent)."""
    names, codes, offsets, durations, depths, index = (columns.ann_names, columns.ann_name, columns.ann_offset,
                                                       columns.ann_duration, columns.ann_depth, columns.ann_index)
    apart = names.index(sc.REGION_COLLECTIVE) if sc.REGION_COLLECTIVE in names else -1
    out: dict[str, float] = {}
    if not any(depths):
        return out
    nested = [j for j in compress(range(len(codes)), depths) if codes[j] != apart]  # nested regions, in order
    for i in dict.fromkeys(bisect.bisect_right(index, j) - 1 for j in nested):  # their steps, in order
        lo, hi = index[i], index[i + 1]
        counts, self_ns = nesting.step_regions(codes[lo:hi], offsets[lo:hi], durations[lo:hi], depths[lo:hi], apart)
        for j, (counted, own) in enumerate(zip(counts, self_ns)):
            if counted and own != durations[lo + j]:
                name = names[codes[lo + j]]
                out[name] = out.get(name, 0.0) + (durations[lo + j] - own) / 1e9
    return out


def rank_regions(c: StepColumns) -> tuple[float | None, float, dict[str, float]]:
    """One rank's (seconds from its first step's start to its last step's end, None without steps; seconds in
    steps; :func:`_covered`), kept with its step columns (:func:`~otelprof.analysis.run.per_rank`)."""
    def compute() -> tuple[float | None, float, dict[str, float]]:
        loop = (max(map(add, c.start_ns, c.duration_ns)) - min(c.start_ns)) / 1e9 if len(c) else None
        return loop, math.fsum(c.duration_ns) / 1e9, _covered(c)

    return per_rank(c, "regions", compute)


def _operators(acc: dict[str, list[float]], top: int, rest: float = 0.0) -> tuple[tuple[Operator, ...], float]:
    """The ``top`` operators by self time; shares of all of them plus ``rest`` (what windows summed as other)."""
    total = math.fsum(v[1] for v in acc.values()) + rest
    rows = [Operator(name, int(calls), self_time, total_time, share(self_time, total))
            for name, (calls, self_time, total_time) in acc.items()]
    return tuple(sorted(rows, key=lambda o: -o.self_time)[:top]), total


def framework_summary(view: RunView, top: int = TOP) -> FrameworkSummary:
    phase_time: dict[str, float] = {}
    loop_time = 0.0
    inside: dict[str, list[float]] = {}
    outside: dict[str, list[float]] = {}
    covered: dict[str, float] = {}
    step_time = 0.0
    for index, rank in enumerate(view.ranks):
        view.say_rank("regions", index)
        c = rank.step_columns
        for phase, (_, seconds) in view.phase_totals(index).items():
            phase_time[phase] = phase_time.get(phase, 0.0) + seconds
        loop, in_steps_ns, rank_covered = rank_regions(c)
        if loop is not None:
            loop_time += loop
        step_time += in_steps_ns
        for name, (count, total, longest, depth) in c.region_totals().items():
            _add(inside, name, count, total / 1e9, longest / 1e9, depth)
        for name, seconds in rank_covered.items():
            covered[name] = covered.get(name, 0.0) + seconds
        for a in rank.annotations:
            _add(outside, a.name, 1, a.duration_ns / 1e9, a.duration_ns / 1e9, 0)
    in_steps = math.fsum(phase_time.values())
    between = max(loop_time - in_steps, 0.0)
    phases = [(p, t, share(t, loop_time)) for p, t in sorted(phase_time.items(), key=lambda kv: -kv[1])]
    if len(phases) > MAX_PHASES:
        others = math.fsum(t for _, t, _ in phases[MAX_PHASES:])
        phases[MAX_PHASES:] = [(f"{len(phases) - MAX_PHASES:,} other phases", others, share(others, loop_time))]
    if loop_time:
        phases.append((BETWEEN_STEPS, between, share(between, loop_time)))
    forward = inside.get(sc.REGION_FORWARD, [0, 0.0])[1]
    backward = inside.get(sc.REGION_BACKWARD, [0, 0.0])[1]
    cpu: dict[str, list[float]] = {}
    gpu: dict[str, list[float]] = {}
    activity: dict[str, float] = {}
    precision: dict[str, float] = {}
    windows: list[ProfileWindow] = []
    rest = {"cpu": 0.0, "gpu": 0.0}
    for rank in view.ranks:
        for record in rank.profiles():
            _window(rank.rank, record, cpu, gpu, activity, precision, windows, rest)
    cpu_ops, cpu_total = _operators(cpu, top, rest["cpu"])
    gpu_ops, gpu_total = _operators(gpu, top, rest["gpu"])
    return FrameworkSummary(
        tuple(phases), share(between, loop_time), forward, backward, share(forward, forward + backward),
        _regions(inside, step_time, 10 * top, covered), _regions(outside, step_time, 10 * top), cpu_ops, gpu_ops,
        cpu_total, gpu_total, tuple(sorted(activity.items(), key=lambda kv: -kv[1])),
        tuple(sorted(precision.items(), key=lambda kv: -kv[1])),
        tuple(sorted(windows, key=lambda w: (w.start, w.rank))), (), _breakdowns(view))


RankBreakdown = tuple[tuple[tuple[str, str, int], ...], tuple[tuple[str, int, int, int, int], ...]]
"""One rank's part of the breakdowns: (phase, region, ns) of the top-level regions, and per phase name (steps,
step ns, uncovered ns, overlap ns)."""


def rank_breakdown(c: StepColumns) -> RankBreakdown:
    """One rank's share of :func:`_breakdowns` (kept with its step columns: :func:`~otelprof.analysis.run.per_rank`)."""
    return per_rank(c, "breakdown", partial(_rank_breakdown, c))


def _rank_breakdown(c: StepColumns) -> RankBreakdown:
    n = len(c)
    masks = c.phase_steps() if len(c.phase_names) > 1 else None  # per phase: its steps
    covered = [0] * n
    top_counts = (Counter(compress(c.ann_name, map(not_, c.ann_depth))) if any(c.ann_depth)
                  else Counter(c.ann_name))  # instances directly inside their step, per name code
    regions: list[tuple[str, str, int]] = []
    for name, (count, *_) in c.region_totals().items():
        top = top_counts.get(c.ann_names.index(name), 0)
        if not top:  # always nested: inside its parent's time
            continue
        if top == count:  # all top-level: the per-step sums the reader keeps
            sums = c.annotation_sums(name)
            covered = list(map(add, covered, sums))
            totals = ({phase: sum(map(sums.__getitem__, mask)) for phase, mask in masks.items()}
                      if masks is not None else {c.phase_names[0]: sum(sums)})
        else:
            totals = {}
            at, durations, depths = c.region(name)
            for step, duration, depth in zip(at, durations, depths):
                if depth == 0:
                    covered[step] += duration
                    phase = c.phase_names[c.phase[step]]
                    totals[phase] = totals.get(phase, 0) + duration
        regions += [(phase, name, total) for phase, total in totals.items() if total]
    left = list(map(sub, c.duration_ns, covered))
    phases = []
    for phase in c.phase_names:
        mine = left if masks is None else list(map(left.__getitem__, masks.get(phase, ())))
        phases.append((phase, len(mine), sum(c.duration_ns) if masks is None
                       else sum(map(c.duration_ns.__getitem__, masks.get(phase, ()))),
                       sum(x for x in mine if x > 0), -sum(x for x in mine if x < 0)))
    return tuple(regions), tuple(phases)


def _breakdowns(view: RunView) -> tuple[Breakdown, ...]:
    """Per phase, all ranks: step time split into its top-level regions and what none covers (the phases of
    :meth:`RunView.shown_phases`)."""
    shown = view.shown_phases()
    steps: dict[str, int] = {}
    step_ns: dict[str, int] = {}
    regions: dict[str, dict[str, int]] = {}
    uncovered: dict[str, int] = {}
    overlap: dict[str, int] = {}
    for index, rank in enumerate(view.ranks):
        c = rank.step_columns
        if not len(c):
            continue
        view.say_rank("step time breakdown", index)
        rank_regions, rank_phases = rank_breakdown(c)
        for phase, name, total in rank_regions:
            found = regions.setdefault(phase, {})
            found[name] = found.get(name, 0) + total
        for phase, count, phase_ns, phase_uncovered, phase_overlap in rank_phases:
            steps[phase] = steps.get(phase, 0) + count
            step_ns[phase] = step_ns.get(phase, 0) + phase_ns
            uncovered[phase] = uncovered.get(phase, 0) + phase_uncovered
            overlap[phase] = overlap.get(phase, 0) + phase_overlap
    out = [breakdown(phase, steps[phase], step_ns[phase] / 1e9, {k: v / 1e9 for k, v in regions.get(phase, {}).items()},
                     uncovered[phase] / 1e9, overlap[phase] / 1e9) for phase in steps
           if steps[phase] and phase in shown]
    return tuple(sorted(out, key=lambda b: (-b.step_time, b.phase)))


def _add(acc: dict[str, list[float]], name: str, count: int, total: float, peak: float, depth: int) -> None:
    entry = acc.get(name)
    if entry is None:
        acc[name] = [count, total, peak, depth]
    else:
        entry[0] += count
        entry[1] += total
        entry[2] = max(entry[2], peak)
        entry[3] = min(entry[3], depth)


def _window(rank: int, record: dict[str, Any], cpu: dict[str, list[float]], gpu: dict[str, list[float]],
            activity: dict[str, float], precision: dict[str, float], windows: list[ProfileWindow],
            rest: dict[str, float] | None = None) -> None:
    """Add one window record. The profiler's own tables (``cpu_ops``, ``gpu_ops``, the GPU mixes) come first;
    where they are empty (the device times of the profiler's averages missing, as on the Kineto path), the
    window's Kineto trace summary (``operators``: host operators, kernels/memcpys/memsets, the device-time mix
    by kind and the kernel precision mix) stands in, so the tables agree with the timeline and the overlap."""
    rest = rest if rest is not None else {"cpu": 0.0, "gpu": 0.0}
    try:
        _add_segment(windows, rank, record)
        found = record.get("operators")
        trace: dict[str, Any] = found if isinstance(found, dict) else {}
        sources = (("cpu", record.get("cpu_ops") or trace.get("ops") or [], cpu),
                   ("gpu", record.get("gpu_ops") or trace.get("kernels") or [], gpu))
        for device, ops, acc in sources:
            for op in ops:
                if str(op["name"]) == sc.OTHER_LABEL_VALUE and "launches" in op:  # the trace summary's top-k rest
                    rest[device] += float(op.get("self_s", 0.0))
                    continue
                entry = acc.setdefault(str(op["name"]), [0.0, 0.0, 0.0])
                entry[0] += float(op.get("calls", 0))
                entry[1] += float(op.get("self_s", 0.0))
                entry[2] += float(op.get("total_s", 0.0))
        for mix, acc2 in ((record.get("gpu_activity_s") or trace.get("device_kinds_s") or {}, activity),
                          (record.get("kernel_precision_s") or trace.get("kernel_precision_s") or {}, precision)):
            for key, seconds in mix.items():
                acc2[str(key)] = acc2.get(str(key), 0.0) + float(seconds)
    except (KeyError, TypeError, ValueError, AttributeError):
        return  # a malformed window record: nothing of it is used



def _add_segment(windows: list[ProfileWindow], rank: int, record: dict[str, Any]) -> None:
    """Add a window record: a new window, or the next segment of the rank's latest window of the same trigger
    and phase (a window's segments are recorded in order, one at a time)."""
    start_step, num_steps = int(record.get("start_step", 0)), int(record.get("num_steps", 0))
    duration, segment = int(record.get("d", 0)) / 1e9, int(record.get("segment", 0))
    why = record.get("truncated")
    trigger, phase = (str(record[k]) if record.get(k) is not None else None for k in ("trigger", "phase"))
    if segment > 0:
        for i in range(len(windows) - 1, -1, -1):
            w = windows[i]
            if w.rank == rank and w.segments == segment and (w.trigger, w.phase) == (trigger, phase):
                counts = Counter(dict(w.truncated))
                if why:
                    counts[str(why)] += 1
                windows[i] = replace(w, num_steps=w.num_steps + num_steps, duration=w.duration + duration,
                                     last_step=start_step + num_steps - 1, segments=segment + 1,
                                     truncated=tuple(sorted(counts.items())))
                return
    windows.append(ProfileWindow(rank, start_step, num_steps, int(record.get("t", 0)) / 1e9, duration,
                                 str(record["trace_file"]) if record.get("trace_file") else None,
                                 start_step + num_steps - 1, 1, ((str(why), 1),) if why else (), trigger, phase))
