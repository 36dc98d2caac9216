"""What every offline check reads: the ranks' sample and step tables (built once), the config, the
windows they share, and the set of checks that judged anything; a check is a :data:`Condition`, and a
:class:`CheckGroup` lists one group's checks for the registry in :mod:`otelprof.analysis.checks`.

A condition judges every evaluation time at once, rank by rank: a window's index range at each time comes
from one bisection per time (:meth:`CheckContext.spans`), and what several checks read of a series (its least
value and extent, its window means and the window counts at the GPU checks' bucket cuts at every time) is
computed once per series; where what a series can make of a window decides a check, no window is summed or
counted (:mod:`otelprof.analysis.window_bounds`)."""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable, Iterable, Sequence, Sized
from dataclasses import dataclass
from functools import partial

from otelprof.analysis import window_bounds
from otelprof.analysis.check_tables import PhaseSteps, RankData, SampleTable, Series, StepTable
from otelprof.mixin.config import MixinConfig, seconds


@dataclass(frozen=True)
class Firing:
    """A subject (a rank, a GPU, a phase, a job) for which a condition holds, and the value it judged."""

    subject: str
    value: float


Condition = Callable[[Sequence[float]], list[list[Firing]]]
"""A check: the subjects firing at each evaluation time (sorted times), in the order they were found."""

Conditions = dict[str, tuple[Condition, int]]
"""Condition and datapoint count per alert short name."""

Spans = tuple[list[int], list[int]]
"""Per evaluation time, a window's index range ``[lo, hi)`` in a sorted array of times."""

FEW_PHASES = 16
"""Up to this many phases per rank, the step checks look at each phase's steps at every time."""


class CheckContext:
    """The ranks' tables built once, the config, and which checks judged anything; every check reads it."""

    def __init__(self, ranks: list[RankData], config: MixinConfig) -> None:
        self.ranks = ranks
        self.c = config
        self.w = seconds(config.window)
        self.patience = seconds(config.patience)
        self.samples = {id(r): r.sample_table or SampleTable.from_samples(r.samples, config) for r in ranks}
        self.steps = {id(r): r.step_table or StepTable.from_records(r.steps) for r in ranks}
        self.first_steps = {id(r): r.first_step if r.first_step is not None else
                            min((s.start for s in r.steps), default=None) for r in ranks}
        self.judged: set[str] = set()
        """Checks that compared something with their threshold at least once (past warm-up, with data)."""
        self._spans: dict[tuple[int, float, float], tuple[object, Spans]] = {}
        self._positions: dict[tuple[int, float], tuple[object, list[int]]] = {}
        self._canonical: dict[int, tuple[array[float], array[float]]] = {}
        self._by_content: dict[tuple[int, int], list[array[float]]] = {}
        self._counts: dict[tuple[int, float, tuple[int, ...]], tuple[object, list[tuple[int, ...]] | None]] = {}
        self._extents: dict[int, tuple[Series, tuple[float, float]]] = {}
        self._least: dict[int, tuple[Series, float | None]] = {}
        self._means: dict[tuple[int, float, float], tuple[object, list[float | None]]] = {}
        """Kept per object id with the object itself (so that its id is not another's while kept)."""
        self._times: Sequence[float] = ()
        self._backs: dict[float, Sequence[float]] = {}
        self._live: dict[tuple[int, bool], tuple[RankData, list[int]]] = {}

    def _at(self, times: Sequence[float]) -> None:
        """What was kept for other evaluation times is dropped (firing_at and evaluate ask for different times)."""
        if times is not self._times:
            self._backs.clear()
            self._live.clear()
            self._spans.clear()
            self._positions.clear()
            self._counts.clear()
            self._means.clear()
            self._times = times

    def spans(self, at: Sequence[float], times: Sequence[float], back: float, until: float = 0.0) -> Spans:
        """The index ranges in ``at`` (sorted) of the windows ``t - back < x <= t - until`` at each time ``t``
        (the rules' windows), kept for the other checks that read the same array with the same window."""
        self._at(times)
        key = (id(at), back, until)
        found = self._spans.get(key)
        if found is None:
            found = self._spans[key] = (at, (self._bisected(at, back), self._bisected(at, until)))
        return found[1]

    def _bisected(self, at: Sequence[float], back: float) -> list[int]:
        """``bisect_right(at, t - back)`` for each evaluation time, kept per array and ``back`` (a window's upper ends
        are another's lower ends, and every window ending at ``t`` shares them)."""
        key = (id(at), back)
        found = self._positions.get(key)
        if found is None:
            same = self._same(at)
            found = self._positions.get((id(same), back))
            if found is None:
                # a list's items are compared without boxing them: worth making for arrays not much longer than times
                listed = at.tolist() if isinstance(at, array) and len(at) < 16 * len(self._times) else at
                found = self._positions[(id(same), back)] = (same, list(map(partial(bisect.bisect_right, listed),
                                                                             self._minus(back))))
            self._positions[key] = (at, found[1])
        return found[1]

    def _same(self, at: Sequence[float]) -> Sequence[float]:
        """The first array seen with the same times as ``at`` (itself if none): a phase's step end times, its losses',
        gradient norms' and data-wait shares' times are often the same, in arrays of their own."""
        if not isinstance(at, array) or at.typecode != "d":
            return at
        found = self._canonical.get(id(at))
        if found is None:
            data = at.tobytes()
            seen = self._by_content.setdefault((len(at), hash(data)), [])
            same = next((a for a in seen if a.tobytes() == data), None)
            if same is None:
                seen.append(at)
                same = at
            found = self._canonical[id(at)] = (at, same)
        return found[1]

    def _minus(self, back: float) -> Sequence[float]:
        """``t - back`` for each evaluation time (kept per ``back``)."""
        found = self._backs.get(back)
        if found is None:
            found = self._backs[back] = self._times if back == 0.0 else [t - back for t in self._times]
        return found

    def cut_counts(self, series: Series, times: Sequence[float], back: float,
                   cuts: tuple[int, ...]) -> list[tuple[int, ...]] | None:
        """:func:`~otelprof.analysis.window_bounds.cut_counts` of the windows ``(t - back, t]``, computed once however
        many checks read them."""
        self._at(times)
        key = (id(series), back, cuts)
        found = self._counts.get(key)
        if found is None:
            lo, hi = self.spans(series.times, times, back)
            least = self.least(series)
            found = self._counts[key] = (series, window_bounds.cut_counts(series, cuts, lo, hi, least))
        return found[1]

    def least(self, series: Series) -> float | None:
        """The least value of a series (None when empty; NaN when its first value is), kept."""
        found = self._least.get(id(series))
        if found is None:
            found = self._least[id(series)] = (series, min(series.values) if series.values else None)
        return found[1]

    def extent(self, series: Series) -> tuple[float, float]:
        """:func:`~otelprof.analysis.window_bounds.extent` of a series, kept (it does not depend on the times)."""
        found = self._extents.get(id(series))
        if found is None:
            found = self._extents[id(series)] = (series, window_bounds.extent(series))
        return found[1]

    def means(self, series: Series, times: Sequence[float], back: float, until: float = 0.0) -> list[float | None]:
        """``series.mean(i, j)`` of the window ``(t - back, t - until]`` at each time (None where it is empty)."""
        self._at(times)
        key = (id(series), back, until)
        found = self._means.get(key)
        if found is None:
            spans = zip(*self.spans(series.times, times, back, until))
            sums = series.exact_sums()
            if sums is not None:  # whole numbers (bytes): the running totals are the slices' sums, exactly
                means = [(sums[j] - sums[i]) / (j - i) if j > i else None for i, j in spans]
            else:
                values = series.values.tolist()  # a list sums its floats without boxing them: the same sums
                means = [sum(values[i:j]) / (j - i) if j > i else None for i, j in spans]
            found = self._means[key] = (series, means)
        return found[1]

    def mean_at(self, series: Series, times: Sequence[float], k: int) -> float | None:
        """:meth:`means` of the window ``(t - w, t]`` of the check window at the ``k``-th time alone."""
        i, j = (span[k] for span in self.spans(series.times, times, self.w))
        if j <= i:
            return None
        sums = series.exact_sums()
        return (sums[j] - sums[i]) / (j - i) if sums is not None else sum(series.values[i:j]) / (j - i)

    def live(self, rank: RankData, times: Sequence[float], warm: bool = False) -> list[int]:
        """The indexes of the times at which the rank was alive (and past its warm-up, when ``warm``); kept."""
        self._at(times)
        key = (id(rank), warm)
        found = self._live.get(key)
        if found is None:
            start, end, patience = rank.process_start, rank.end, self.patience
            found = self._live[key] = (rank, [k for k, t in enumerate(times)
                                              if start <= t <= end and (not warm or t - start > patience)])
        return found[1]

    def phase_windows(self, rank: RankData, times: Sequence[float],
                      back: float) -> Iterable[tuple[str, PhaseSteps, list[tuple[int, int, int]]]]:
        """Per phase (in the phases' order), the times whose window ``(t - back, t]`` holds some of its steps:
        (time index, index range). With many phases (a run that names one per step) each phase looks only at
        the times near its steps: the evaluations cost the steps, not every phase at every time."""
        phases = self.steps[id(rank)].phases
        few = len(phases) <= FEW_PHASES
        for phase, steps in phases.items():
            ends = steps.ends
            if not ends:
                continue
            if few:
                found = [(k, i, j) for k, (i, j) in enumerate(zip(*self.spans(ends, times, back))) if j > i]
            else:  # no window past these times can hold a step (the test of each window is the exact one)
                first = bisect.bisect_left(times, ends[0])
                last = bisect.bisect_right(times, ends[-1] + back + 1.0, first)
                after = partial(bisect.bisect_right, ends)
                found = [(k, i, j) for k in range(first, last)
                         if (j := after(times[k])) > (i := after(times[k] - back))]
            if found:
                yield phase, steps, found

    def phase_count(self, phase: str | None, column: Callable[[PhaseSteps], Sized]) -> int:
        """Datapoints of a per-phase column over every rank (of one phase, or of all when None)."""
        return sum(len(column(p)) for t in self.steps.values() for name, p in t.phases.items()
                   if phase is None or name == phase)

    def step_count(self) -> int:
        """Steps of every rank."""
        return sum(len(t) for t in self.steps.values())


def by_job(ranks: Iterable[RankData]) -> dict[str, list[RankData]]:
    """The ranks of each job."""
    out: dict[str, list[RankData]] = {}
    for r in ranks:
        out.setdefault(r.job, []).append(r)
    return out


@dataclass(frozen=True)
class CheckGroup:
    """One group of checks: the module holding them (an alert's ``offline`` names it), and their conditions."""

    where: str
    """One of :data:`otelprof.mixin.alert_model.OFFLINE`."""
    conditions: Callable[[CheckContext], Conditions]

    @property
    def checks(self) -> tuple[str, ...]:
        """The alerts they twin (short names, in runbook order): those declared with ``offline`` = ``where``."""
        from otelprof.mixin.declared import offline_twins

        return offline_twins(self.where)
