"""The words of the alerts: the annotation templates Prometheus fills in, and the runbook's number formats."""

from __future__ import annotations

PCT = "{{ $value | humanizePercentage }}"
DUR = "{{ $value | humanizeDuration }}"
NUM = "{{ $value | humanize }}"
VAL = '{{ printf "%.4g" $value }}'
L_JOB = "{{ $labels.job_name }}"
L_RANK = "{{ $labels.rank }}"
L_NODE = "{{ $labels.node }}"
L_GPU = "{{ $labels.gpu }}"
L_PHASE = "{{ $labels.phase }}"
AT_RANK = f"job {L_JOB} rank {L_RANK} on node {L_NODE}"
AT_GPU = f"GPU {L_GPU} on node {L_NODE} (job {L_JOB})"


def params(*pairs: tuple[str, object]) -> tuple[tuple[str, str], ...]:
    """A runbook entry's thresholds as (name, text) pairs."""
    return tuple((name, str(value)) for name, value in pairs)


def pct(value: float) -> str:
    """A ratio as the runbook writes it: ``0.7`` -> ``70 %``."""
    return f"{value * 100:g} %"


def human(secs: float) -> str:
    """A duration for the runbook's detection limits: ``45 s``, ``2 min 5 s``, ``1 h 30 min``."""
    secs = round(secs)
    hours, rest = divmod(secs, 3600)
    minutes, s = divmod(rest, 60)
    parts = [f"{hours} h" if hours else "", f"{minutes} min" if minutes else "", f"{s} s" if s else ""]
    return " ".join(p for p in parts if p) or "0 s"


def nbytes(value: float) -> str:
    """A size in bytes as the runbook writes it: ``1.5 GiB``, ``512 MiB``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:g} {unit}"
    return f"{value:g} B"

