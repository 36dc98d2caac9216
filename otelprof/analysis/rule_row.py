"""One row of the checks' table: an alert check's (or a tensor rule's, or a check rule's) verdict on a recording.

Its own module so that every analysis that makes rows (:mod:`~otelprof.analysis.rules`,
:mod:`~otelprof.analysis.tensors`, :mod:`~otelprof.analysis.check_rules`, :mod:`~otelprof.analysis.prometheus`)
imports it without importing the others."""

from __future__ import annotations

from dataclasses import dataclass


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
    summary: str = ""
    """The alert's one-line summary ("The loss or the gradient norm became NaN or infinite.")."""
    value_text: str = ""
    """The value when it first fired in the words of the alert's description ("12 non-finite values recorded in
    steps over the last 10m"); "" without a value."""

    @property
    def status(self) -> str:
        """``"fired"``, ``"ok"``, or ``"no data"`` when the check had nothing to judge (no datapoints)."""
        return check_status(self.triggered, self.datapoints)


def check_status(triggered: bool, datapoints: int) -> str:
    """A check's verdict: it fired, it judged data and stayed quiet, or it had nothing to judge."""
    if triggered:
        return "fired"
    return "ok" if datapoints > 0 else "no data"
