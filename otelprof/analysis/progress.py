"""Training progress: the curves an ML engineer looks at first.

* Per recorded scalar (``loss``, ``learning_rate``, ``grad_norm``, any other name) and phase, its value
  over the training steps. The x axis is the number of the main phase's steps (``train``, else the
  phase with most steps). Steps of the main phase give one point each. Another phase (evaluation) gives
  one point per pass: the value the loop recorded outside steps in that phase (the evaluation's own
  mean, as the Hugging Face callback records it) when it recorded one, else the mean of the values
  recorded in the pass's steps; the point sits at the number of the last main-phase step before the
  pass. A scalar's curves are those of the lowest rank that recorded it (data-parallel ranks log their own).
* Throughput per main-phase step: recorded ``samples`` (``tokens``) over the step's duration, added
  up over the ranks by step number (data parallelism adds them up), as the throughput table does.
* Step time over wall time per phase and rank, with the outlier steps (as the step-duration section
  defines them) marked.

Long runs are downsampled here, not when drawing: a curve keeps at most MAX_POINTS points, each the
mean (with the minimum and maximum) of an equal run of consecutive values; NaN and infinite values are
counted and left out of the means, the first one's position kept. So the report's size is bounded
whatever the run's length: at most MAX_CURVES curves and MAX_TIMELINES step-time series of MAX_POINTS
points each.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import add, mul, truediv

from otelprof import semconv as sc
from otelprof.analysis.run import RunView, per_rank
from otelprof.analysis.stats import Series
from otelprof.analysis.steps import outlier_flags, outlier_threshold
from otelprof.recording.columns import StepColumns, group_indexes

MAX_POINTS = 400
"""Points per curve at most."""
MAX_CURVES = 12
MAX_TIMELINE_PHASES = 3
MAX_TIMELINE_RANKS = 4
"""Ranks per phase whose step times are drawn: rank 0 and the slowest others (highest mean step time)."""
MAX_TIMELINES = MAX_TIMELINE_PHASES * MAX_TIMELINE_RANKS
MAX_OUTLIER_MARKS = 100
"""Outlier steps marked per step-time series: the slowest ones."""

MAIN_PHASE = "train"
SAMPLES_PER_SECOND = "samples/s"
TOKENS_PER_SECOND = "tokens/s"
FIRST_CURVES = (sc.SCALAR_LOSS, sc.SCALAR_LEARNING_RATE, SAMPLES_PER_SECOND, TOKENS_PER_SECOND,
                sc.SCALAR_GRAD_NORM)
"""Curve order: these first, other scalars after them by name."""
ALIASES = {"lr": sc.SCALAR_LEARNING_RATE}
EXPECTED = (sc.SCALAR_LOSS, sc.SCALAR_LEARNING_RATE, sc.SCALAR_SAMPLES, sc.SCALAR_TOKENS)
"""Scalars whose absence the report points out."""


@dataclass(frozen=True)
class Curve:
    name: str
    """Scalar name (``lr`` as ``learning_rate``), or SAMPLES_PER_SECOND / TOKENS_PER_SECOND."""
    phase: str
    rank: int | None
    """The rank whose values these are; None: all ranks added up."""
    x: tuple[float, ...]
    """Main-phase step numbers."""
    y: tuple[float, ...]
    """Mean of the values a point stands for."""
    low: tuple[float, ...]
    high: tuple[float, ...]
    values: int
    """Finite values the curve was made from."""
    per_point: int
    """Consecutive values one point stands for (1: every value drawn)."""
    first: float
    last: float
    nonfinite: int = 0
    """NaN or infinite values, left out."""
    first_nonfinite: float | None = None
    """x of the first of them."""
    per_pass: bool = False
    """One point per pass of a phase that is not the main one."""


@dataclass(frozen=True)
class StepTimeline:
    rank: int
    phase: str
    series: Series
    """Step durations (seconds) against the steps' start, seconds since the job started: means and maxima of
    runs of consecutive steps."""
    steps: int
    per_point: int
    threshold: float
    """The outlier threshold (seconds; NaN when only counted, as from Prometheus)."""
    outliers: tuple[tuple[float, float, int], ...]
    """(start, duration, step number) of the slowest outlier steps, by start (at most MAX_OUTLIER_MARKS);
    from Prometheus: (window end, mean step time in it, -1) of the windows in which outliers were counted."""
    outlier_count: int


@dataclass(frozen=True)
class Progress:
    main_phase: str
    curves: tuple[Curve, ...]
    timelines: tuple[StepTimeline, ...]
    missing: tuple[str, ...]
    """Of EXPECTED: the scalars no rank recorded."""
    curves_left_out: tuple[str, ...] = ()
    """``name (phase)`` of curves past MAX_CURVES."""
    timelines_left_out: int = 0
    """Rank/phase step-time series not drawn."""
    max_points: int = MAX_POINTS


def canonical(name: str) -> str:
    return ALIASES.get(name, name)


def curve_order(name: str, phase: str, main: str) -> tuple[int, int, str, str]:
    rank = FIRST_CURVES.index(name) if name in FIRST_CURVES else len(FIRST_CURVES)
    return rank, phase != main, name, phase


def downsample(name: str, phase: str, rank: int | None, x: Sequence[float], y: Sequence[float],
               max_points: int = MAX_POINTS, per_pass: bool = False) -> Curve | None:
    """A curve of at most ``max_points`` points from values in order (None when there is no value at all)."""
    if not y:
        return None
    keep = list(map(math.isfinite, y))
    nonfinite = len(keep) - sum(keep)
    first_bad = next((x[i] for i, ok in enumerate(keep) if not ok), None)
    xs, ys = list(compress(x, keep)), list(compress(y, keep))
    n = len(ys)
    if n == 0:
        return Curve(name, phase, rank, (), (), (), (), 0, 1, math.nan, math.nan, nonfinite, first_bad, per_pass)
    size = max(1, -(-n // max_points))
    if size == 1:
        return Curve(name, phase, rank, tuple(xs), tuple(ys), tuple(ys), tuple(ys), n, 1, ys[0], ys[-1], nonfinite,
                     first_bad, per_pass)
    px, py, lo, hi = [], [], [], []
    for i in range(0, n, size):
        chunk = ys[i:i + size]
        px.append(xs[min(i + len(chunk) // 2, n - 1)])
        py.append(math.fsum(chunk) / len(chunk))
        lo.append(min(chunk))
        hi.append(max(chunk))
    return Curve(name, phase, rank, tuple(px), tuple(py), tuple(lo), tuple(hi), n, size, ys[0], ys[-1], nonfinite,
                 first_bad, per_pass)


def main_phase(view: RunView) -> str:
    counts: dict[str, int] = {}
    for index in range(len(view.ranks)):
        for phase, (steps, _) in view.phase_totals(index).items():
            counts[phase] = counts.get(phase, 0) + steps
    if MAIN_PHASE in counts or not counts:
        return MAIN_PHASE
    return max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]


class _RankSteps:
    """One rank's steps as the curves need them: the main-phase step each step follows, and when main-phase
    steps ended (both worked out on first use: most runs need neither)."""

    def __init__(self, view: RunView, index: int, main: str) -> None:
        c = view.ranks[index].step_columns
        self.columns = c
        self.main_code = c.phase_names.index(main) if main in c.phase_names else -1
        self._positions: list[int] | None = None
        self._ends: tuple[list[int], list[int]] | None = None

    def _main(self) -> list[int]:
        if self._positions is None:
            c = self.columns
            self._positions = list(compress(range(len(c)), map(self.main_code.__eq__, c.phase)))
        return self._positions

    @property
    def before(self) -> int:
        """x of what comes before the first main-phase step: its number minus one."""
        positions = self._main()
        return self.columns.number[positions[0]] - 1 if positions else -1

    def last_main(self, i: int) -> int:
        """Number of the last main-phase step at or before step ``i`` (file order)."""
        positions = self._main()
        k = bisect.bisect_right(positions, i)
        return self.columns.number[positions[k - 1]] if k else self.before

    def number_at(self, t_ns: int) -> int:
        """Number of the last main-phase step that ended by ``t_ns``."""
        if self._ends is None:
            c = self.columns
            positions = self._main()
            ends = sorted(zip(map(add, map(c.start_ns.__getitem__, positions), map(c.duration_ns.__getitem__,
                                                                                   positions)),
                              map(c.number.__getitem__, positions)))
            self._ends = ([e for e, _ in ends], [n for _, n in ends])
        end_ns, numbers = self._ends
        i = bisect.bisect_right(end_ns, t_ns)
        return numbers[i - 1] if i else self.before


def _scalar_points(view: RunView, rs: _RankSteps, index: int, name: str, main: str
                   ) -> dict[str, tuple[list[float], list[float], bool]]:
    """Per phase: (x, values, per pass) of scalar ``name`` (and its aliases) on rank ``index``."""
    c = rs.columns
    in_steps: dict[str, tuple[list[float], list[float]]] = {}
    for recorded in (n for n in c.scalar_names if canonical(n) == name):
        at, values = c.scalar(recorded)
        groups = group_indexes(map(c.phase.__getitem__, at))  # per phase code: its values' positions
        for code in sorted(groups):
            if len(c.phase_names) == 1:
                where, found = list(at), list(values)
            else:
                where, found = list(map(at.__getitem__, groups[code])), list(map(values.__getitem__, groups[code]))
            x = map(c.number.__getitem__, where) if code == rs.main_code else map(rs.last_main, where)
            xs, ys = in_steps.setdefault(c.phase_names[code], ([], []))
            xs.extend(x)
            ys.extend(found)
    outside: dict[str, tuple[list[float], list[float]]] = {}
    for t_ns, phase, recorded, value in view.ranks[index].scalars:
        if canonical(recorded) == name:
            xs, ys = outside.setdefault(phase, ([], []))
            xs.append(rs.number_at(t_ns))
            ys.append(value)
    out: dict[str, tuple[list[float], list[float], bool]] = {}
    for phase in sorted({*in_steps, *outside}):
        if phase == main:
            xs, ys = in_steps.get(phase) or outside[phase]
            out[phase] = (xs, ys, False)
        elif phase in outside:
            out[phase] = (*outside[phase], True)
        else:
            out[phase] = (*_pass_means(*in_steps[phase]), True)
    return out


def _pass_means(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    """One point per pass (consecutive values after the same main-phase step): their mean, NaN if any is."""
    px: list[float] = []
    py: list[float] = []
    run: list[float] = []
    for i, (x, y) in enumerate(zip(xs, ys)):
        run.append(y)
        if i + 1 == len(xs) or xs[i + 1] != x:
            px.append(x)
            py.append(math.fsum(run) / len(run) if all(map(math.isfinite, run)) else math.nan)
            run = []
    return px, py


def rank_throughput(c: StepColumns, main: str, scalar: str, read: tuple[array[int], array[float]] | None = None
                    ) -> tuple[array[int], array[float]] | None:
    """One rank's (main-phase step numbers, recorded ``scalar`` over the step's duration); None without
    main-phase steps. Kept with the step columns (:func:`~otelprof.analysis.run.per_rank`; ``read``: the
    scalar's columns when already read)."""
    def compute() -> tuple[array[int], array[float]] | None:
        if main not in c.phase_names:
            return None
        code = c.phase_names.index(main)
        at, values = c.scalar(scalar) if read is None else read
        if len(c.phase_names) > 1:
            mask = list(map(code.__eq__, map(c.phase.__getitem__, at)))
            at, values = array("q", compress(at, mask)), array("d", compress(values, mask))
        durations = list(map(c.duration_ns.__getitem__, at))
        keep = [d > 0 and math.isfinite(v) for d, v in zip(durations, values)]
        rates = array("d", map(truediv, map(mul, compress(values, keep), repeat(1e9)), compress(durations, keep)))
        return array("q", map(c.number.__getitem__, compress(at, keep))), rates

    return per_rank(c, ("throughput", main, scalar), compute)


def _throughput(view: RunView, main: str, scalar: str) -> tuple[list[float], list[float]]:
    """Per main-phase step number: recorded ``scalar`` over the step's duration, added up over ranks."""
    per_rank: list[tuple[array[int], array[float]]] = []
    for rank in view.ranks:
        found = rank_throughput(rank.step_columns, main, scalar)
        if found is not None:
            per_rank.append(found)
    if not per_rank:
        return [], []
    numbers, first = per_rank[0]
    if all(other == numbers for other, _ in per_rank[1:]):  # the ranks stepped in lockstep: add them up in place
        total = list(first)
        for _, rates in per_rank[1:]:
            total = list(map(add, total, rates))
        return [float(n) for n in numbers], total
    per_number: dict[int, float] = {}
    for ranks_numbers, rates in per_rank:
        for n, r in zip(ranks_numbers, rates):
            per_number[n] = per_number.get(n, 0.0) + r
    return [float(n) for n in per_number], list(per_number.values())


def _timelines(view: RunView, main: str, max_points: int) -> tuple[list[StepTimeline], int]:
    origin = view.origin
    by_phase: dict[str, list[tuple[int, float]]] = {}
    counts: dict[str, int] = {}
    for index in range(len(view.ranks)):
        for phase, (steps, seconds) in view.phase_totals(index).items():
            by_phase.setdefault(phase, []).append((index, seconds / steps))
            counts[phase] = counts.get(phase, 0) + steps
    phases = sorted(by_phase, key=lambda p: (p != main, -counts[p], p))
    out: list[StepTimeline] = []
    left_out = sum(len(v) for p, v in by_phase.items() if p not in phases[:MAX_TIMELINE_PHASES])
    for phase in phases[:MAX_TIMELINE_PHASES]:
        ranks = by_phase[phase]
        first = [r for r in ranks if view.info[r[0]].rank == min(view.info[i].rank for i, _ in ranks)]
        slowest = sorted((r for r in ranks if r not in first), key=lambda r: -r[1])
        chosen = sorted((first + slowest)[:MAX_TIMELINE_RANKS], key=lambda r: view.info[r[0]].rank)
        left_out += len(ranks) - len(chosen)
        for index, _ in chosen:
            view.say(f"step times over the run, rank {view.info[index].rank} {phase}")
            out.append(_timeline(view, index, phase, origin, max_points))
    return out, left_out


def _timeline(view: RunView, index: int, phase: str, origin: float, max_points: int) -> StepTimeline:
    c = view.ranks[index].step_columns
    mask = c.phase_steps()[phase]  # the phase's steps
    starts = [c.start_ns[i] / 1e9 for i in mask]
    durations = view.durations(index)[phase]
    numbers = list(map(c.number.__getitem__, mask))
    flags = list(map(outlier_flags(view, index).__getitem__, mask))
    series = Series.of(starts, durations, origin, max_points)
    marked = [(starts[i] - origin, durations[i], numbers[i]) for i, flag in enumerate(flags) if flag]
    slowest = sorted(sorted(marked, key=lambda m: -m[1])[:MAX_OUTLIER_MARKS])
    limit = outlier_threshold(durations, view.outlier_sigma, view.outlier_floor)
    return StepTimeline(view.info[index].rank, phase, series, len(durations), max(1, -(-len(durations) // max_points)),
                        limit, tuple(slowest), len(marked))


def progress(view: RunView, max_points: int = MAX_POINTS) -> Progress:
    view.say("training curves")
    main = main_phase(view)
    recorded_by = [{canonical(n) for n in r.step_columns.scalar_names} | {canonical(x[2]) for x in r.scalars}
                   for r in view.ranks]
    names = sorted(set().union(*recorded_by)) if recorded_by else []
    order = sorted(range(len(view.ranks)), key=lambda i: view.info[i].rank)
    curves: list[Curve] = []
    for name in names:
        if name in (sc.SCALAR_SAMPLES, sc.SCALAR_TOKENS):
            continue
        index = next(i for i in order if name in recorded_by[i])  # the lowest rank that recorded it
        rs = _RankSteps(view, index, main)
        for phase, (xs, ys, per_pass) in _scalar_points(view, rs, index, name, main).items():
            curve = downsample(name, phase, view.info[index].rank, xs, ys, max_points, per_pass)
            if curve is not None:
                curves.append(curve)
    for scalar, label in ((sc.SCALAR_SAMPLES, SAMPLES_PER_SECOND), (sc.SCALAR_TOKENS, TOKENS_PER_SECOND)):
        xs, ys = _throughput(view, main, scalar)
        curve = downsample(label, main, None if len(view.ranks) > 1 else (view.info[0].rank if view.info else 0),
                           xs, ys, max_points)
        if curve is not None:
            curves.append(curve)
    curves.sort(key=lambda cv: curve_order(cv.name, cv.phase, main))
    recorded = set(names)
    timelines, left_out = _timelines(view, main, max_points)
    return Progress(main, tuple(curves[:MAX_CURVES]), tuple(timelines),
                    tuple(n for n in EXPECTED if n not in recorded),
                    tuple(f"{cv.name} ({cv.phase})" for cv in curves[MAX_CURVES:]), left_out, max_points)


def no_progress() -> Progress:
    """Nothing known (a report built before these curves existed)."""
    return Progress(MAIN_PHASE, (), (), EXPECTED)
