"""What every offline check reads: the ranks' sample and step tables (built once), the config, the
windows they share, and the set of checks that judged anything; a check is a :data:`Condition`, and a
:class:`CheckGroup` lists one group's checks for the registry in :mod:`otelprof.analysis.checks`."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass

from otelprof.analysis.check_tables import PhaseSteps, RankData, SampleTable, Series, StepTable
from otelprof.mixin.config import MixinConfig, seconds


@dataclass(frozen=True)
class Firing:
    """A subject (a rank, a GPU, a phase, a job) for which a condition holds, and the value it judged."""

    subject: str
    value: float


Condition = Callable[[float], list[Firing]]
"""A check: the subjects firing at an evaluation time."""

Conditions = dict[str, tuple[Condition, int]]
"""Condition and datapoint count per alert short name."""

FEW_PHASES = 16
"""Up to this many phases per rank, the step checks look at each phase's steps in every window."""


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
        self._at: float | None = None
        self._quantiles: dict[tuple[int, float, int, int], float] = {}
        self.judged: set[str] = set()
        """Checks that compared something with their threshold at least once (past warm-up, with data)."""
        self._phase_indexes: dict[int, tuple[list[float], list[int], list[tuple[str, PhaseSteps]]]] = {}

    def quantile(self, series: Series, q: float, i: int, j: int, t: float) -> float:
        """``series.quantile(q, i, j)`` at evaluation time ``t``, computed once however many checks read it (the
        checks are evaluated time by time: what one computed at ``t`` is kept until the next time)."""
        if t != self._at:
            self._quantiles.clear()
            self._at = t
        key = (id(series), q, i, j)
        found = self._quantiles.get(key)
        if found is None:
            found = self._quantiles[key] = series.quantile(q, i, j)
        return found

    def warm(self, rank: RankData, t: float) -> bool:
        return t - rank.process_start > self.patience

    def alive(self, rank: RankData, t: float) -> bool:
        return rank.process_start <= t <= rank.end

    def gpu_windows(self, series: dict[str, Series], start: float, end: float) -> dict[str, tuple[Series, int, int]]:
        """Per GPU with values in the window: its series and the window's index range."""
        out = {}
        for gpu, values in series.items():
            i, j = values.span(start, end)
            if j > i:
                out[gpu] = (values, i, j)
        return out

    def phase_windows(self, rank: RankData, start: float, end: float) -> Iterable[tuple[str, PhaseSteps, int, int]]:
        """Per phase with steps ending in the window: its columns and the window's index range. With many phases
        (a run that names one per step) only those with a step in the window are looked at: the evaluations cost
        the steps in their windows, not every phase each time."""
        phases = self.steps[id(rank)].phases
        if len(phases) <= FEW_PHASES:
            candidates: Iterable[tuple[str, PhaseSteps]] = phases.items()
        else:
            ends, order, items = self._phase_index(rank)
            found = order[bisect.bisect_right(ends, start):bisect.bisect_right(ends, end)]
            candidates = map(items.__getitem__, sorted(set(found)))  # in the phases' order, as above
        for phase, steps in candidates:
            i, j = steps.span(start, end)
            if j > i:
                yield phase, steps, i, j

    def _phase_index(self, rank: RankData) -> tuple[list[float], list[int], list[tuple[str, PhaseSteps]]]:
        """Every step end of the rank in time order, the position of its phase, and the phases (built once)."""
        found = self._phase_indexes.get(id(rank))
        if found is None:
            items = list(self.steps[id(rank)].phases.items())
            pairs = sorted((e, k) for k, (_, steps) in enumerate(items) for e in steps.ends)
            found = self._phase_indexes[id(rank)] = ([e for e, _ in pairs], [k for _, k in pairs], items)
        return found

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
    """One group of checks: the alerts they twin (short names, in runbook order), and their conditions."""

    checks: tuple[str, ...]
    conditions: Callable[[CheckContext], Conditions]
