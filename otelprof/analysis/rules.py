"""Rules summary: every offline-capable alert check (:mod:`otelprof.analysis.checks`, the alert rules'
offline twin) evaluated on the recording, with the alert's own description and advice from its
runbook entry, in the original report's vocabulary: triggered N times, over M datapoints, with
these parameters."""

from __future__ import annotations

import logging
import math
import multiprocessing
from collections.abc import Callable, Collection
from dataclasses import dataclass
from multiprocessing.connection import Connection

from otelprof.analysis.rule_row import RuleRow
from otelprof.mixin.alert_text import value_phrase
from otelprof.mixin.config import MixinConfig
from otelprof.recording.ranks import Recording

MIN_INTERVAL = 10.0
MAX_EVALUATIONS = 360
"""Long runs are evaluated at a coarser interval so that the checks take a bounded time."""
BACKGROUND_STEPS = 200_000
"""Recordings with more steps than this evaluate the checks in a forked process, beside the other analyses."""


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

    @property
    def judged(self) -> tuple[RuleRow, ...]:
        """The checks that had something to judge (fired or ok), in row order."""
        return tuple(r for r in self.rows if r.status != "no data")

    @property
    def no_data(self) -> tuple[RuleRow, ...]:
        """The checks that had nothing to judge (no GPU for the GPU checks, no steps for the step checks)."""
        return tuple(r for r in self.rows if r.status == "no data")


def evaluation_interval(duration: float | None) -> float:
    if not duration or duration <= 0 or math.isnan(duration):
        return MIN_INTERVAL
    return max(MIN_INTERVAL, math.ceil(duration / MAX_EVALUATIONS))


def rules_summary(recording: Recording, duration: float | None, config: MixinConfig | None = None,
                  interval: float | None = None, part: int | None = None) -> RulesSummary:
    """The offline checks' verdicts; ``part`` 0 or 1: only one of two halves of the checks (:data:`checks.HALF`,
    the tensor checks with part 0), for :func:`merged` to join."""
    config = config or MixinConfig()
    interval = interval or evaluation_interval(duration)
    try:
        from otelprof.analysis import checks
        from otelprof.mixin.alerts import alerts

        only = None
        if part is not None:
            shorts = {a.short for a in alerts(config)}
            only = checks.HALF if part == 0 else shorts - checks.HALF
        results = checks.evaluate(recording, config, interval, only)
        by_name = {a.name: a for a in alerts(config)}
    except Exception as exc:  # the checks are another module's: a failure there must not cost the report
        logging.getLogger("otelprof.report").debug("the offline checks failed", exc_info=True)  # otelprof --debug
        return RulesSummary(interval, (), (), f"{type(exc).__name__}: {exc}")
    rows = []
    for r in results:
        alert = by_name.get(r.alert)
        valued = alert is not None and r.value is not None and math.isfinite(r.value)
        value_text = value_phrase(alert.description, r.value) if alert and r.value is not None and valued else ""
        rows.append(RuleRow(r.alert, r.original, r.severity, alert.runbook.meaning if alert else "",
                            alert.runbook.todo if alert else "", r.triggered, r.firing_evaluations, r.evaluations,
                            r.datapoints, r.first_fired, r.value, tuple(r.subjects), tuple(r.parameters),
                            alert.summary if alert else "", value_text))
    if part in (None, 0):
        rows.extend(_tensor_rows(recording))
    return _summary(interval, rows, by_name)


def _summary(interval: float, rows: list[RuleRow], by_name: Collection[str]) -> RulesSummary:
    rows.sort(key=lambda row: (-row.firing_evaluations, not row.triggered, row.alert))
    evaluated = {r.alert for r in rows}
    return RulesSummary(interval, tuple(rows), tuple(n for n in by_name if n not in evaluated))


def merged(parts: list[RulesSummary], config: MixinConfig | None = None) -> RulesSummary:
    """The verdicts of both halves (:func:`rules_summary` ``part`` 0 and 1) as one summary."""
    from otelprof.mixin.alerts import alerts

    error = next((p.error for p in parts if p.error), None)
    if error:
        return RulesSummary(parts[0].interval, (), (), error)
    return _summary(parts[0].interval, [row for p in parts for row in p.rows],
                    [a.name for a in alerts(config or MixinConfig())])


def _tensor_rows(recording: Recording) -> list[RuleRow]:
    """The per-layer tensor rules (:mod:`otelprof.analysis.tensors`); their failure costs only them."""
    try:
        from otelprof.analysis.tensors import rule_rows

        return rule_rows(recording)
    except Exception:
        logging.getLogger("otelprof.report").debug("the tensor rules failed", exc_info=True)
        return []


def skipped_rules(reason: str) -> RulesSummary:
    return RulesSummary(0.0, (), (), None, reason)


def rules_summary_later(recording: Recording, duration: float | None, config: MixinConfig | None = None,
                        interval: float | None = None, background: bool | None = None) -> Callable[[], RulesSummary]:
    """Start :func:`rules_summary`; the returned function waits for its result.

    On long recordings (``background`` unset: more than :data:`BACKGROUND_STEPS` steps) the checks
    run in two forked processes, half the checks each (:func:`merged`), that share the parsed recording, so
    that on a machine with several CPUs they cost little time beside the report's other analyses. If a
    process cannot start or dies, the checks run here instead."""
    if background is None:
        background = sum(len(r.step_columns) for r in recording.ranks) > BACKGROUND_STEPS
    if background and "fork" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("fork")
        started: list[tuple[Connection, multiprocessing.process.BaseProcess]] = []
        try:
            for part in (0, 1):
                receive, send = context.Pipe(duplex=False)
                child = context.Process(target=_evaluate_into, args=(send, recording, duration, config, interval,
                                                                     part), name="otelprof-checks", daemon=True)
                child.start()
                send.close()  # the child holds the only writer: its death ends the pipe
                started.append((receive, child))
        except OSError:
            logging.getLogger("otelprof.report").warning("cannot start a process for the checks; running them here")
            for pipe, process in started:
                pipe.close()
                process.join(5.0)
        else:
            return lambda: _receive(started, recording, duration, config, interval)
    result = rules_summary(recording, duration, config, interval)
    return lambda: result


def _evaluate_into(send: Connection, recording: Recording, duration: float | None, config: MixinConfig | None,
                   interval: float | None, part: int) -> None:
    send.send(rules_summary(recording, duration, config, interval, part))
    send.close()


def _receive(started: list[tuple[Connection, multiprocessing.process.BaseProcess]], recording: Recording,
             duration: float | None, config: MixinConfig | None, interval: float | None) -> RulesSummary:
    parts: list[RulesSummary] = []
    for receive, child in started:
        try:
            parts.append(receive.recv())
        except (EOFError, OSError):
            logging.getLogger("otelprof.report").warning(
                "the checks' process ended without a result (exit code %s); running them here", child.exitcode)
        finally:
            receive.close()
            child.join(5.0)
    if len(parts) < len(started):
        return rules_summary(recording, duration, config, interval)
    return merged(parts, config)
