"""Rules summary: every offline-capable alert check (:mod:`otelprof.analysis.checks`, the alert rules'
offline twin) evaluated on the recording, with the alert's own description and advice from its
runbook entry, in the original report's vocabulary: triggered N times, over M datapoints, with
these parameters."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from otelprof.mixin.config import MixinConfig
from otelprof.recording.reader import Recording

MIN_INTERVAL = 10.0
MAX_EVALUATIONS = 360
"""Long runs are evaluated at a coarser interval so that the checks take a bounded time."""


@dataclass(frozen=True)
class RuleRow:
    alert: str
    original: str
    """SageMaker Debugger rule it stands for ("" when otelprof adds it)."""
    severity: str
    description: str
    recommendation: str
    triggered: bool
    firing_evaluations: int
    """Evaluations at which the check fired (the original's "triggered N times")."""
    evaluations: int
    datapoints: int
    first_fired: float | None
    """Unix seconds."""
    value: float | None
    subjects: tuple[str, ...]
    parameters: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RulesSummary:
    interval: float
    """Seconds between evaluations."""
    rows: tuple[RuleRow, ...]
    """Most often fired first."""
    not_evaluated: tuple[str, ...]
    """Alerts of the mixin without an offline twin (they need live series)."""
    error: str | None = None
    skipped: str | None = None
    """Why the checks were not evaluated (asked not to), when they were not."""

    @property
    def fired(self) -> tuple[RuleRow, ...]:
        return tuple(r for r in self.rows if r.triggered)


def evaluation_interval(duration: float | None) -> float:
    if not duration or duration <= 0 or math.isnan(duration):
        return MIN_INTERVAL
    return max(MIN_INTERVAL, math.ceil(duration / MAX_EVALUATIONS))


def rules_summary(recording: Recording, duration: float | None, config: MixinConfig | None = None,
                  interval: float | None = None) -> RulesSummary:
    config = config or MixinConfig()
    interval = interval or evaluation_interval(duration)
    try:
        from otelprof.analysis import checks
        from otelprof.mixin.alerts import alerts

        results = checks.evaluate(recording, config, interval)
        by_name = {a.name: a for a in alerts(config)}
    except Exception as exc:  # the checks are another module's: a failure there must not cost the report
        logging.getLogger("otelprof.report").warning("the offline checks failed", exc_info=True)
        return RulesSummary(interval, (), (), f"{type(exc).__name__}: {exc}")
    rows = []
    for r in results:
        alert = by_name.get(r.alert)
        rows.append(RuleRow(r.alert, r.original, r.severity, alert.runbook.meaning if alert else "",
                            alert.runbook.todo if alert else "", r.triggered, r.firing_evaluations, r.evaluations,
                            r.datapoints, r.first_fired, r.value, tuple(r.subjects), tuple(r.parameters)))
    rows.sort(key=lambda row: (-row.firing_evaluations, not row.triggered, row.alert))
    evaluated = {r.alert for r in rows}
    return RulesSummary(interval, tuple(rows), tuple(n for n in by_name if n not in evaluated))


def skipped_rules(reason: str) -> RulesSummary:
    return RulesSummary(0.0, (), (), None, reason)
