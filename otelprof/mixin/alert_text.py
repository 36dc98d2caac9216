"""The words of the alerts: the annotation templates Prometheus fills in, and the runbook's number formats."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

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



# ---------------------------------------------------------------------------------------------- values offline

def humanize(value: float) -> str:
    """Prometheus's ``humanize``: SI prefixes, four significant digits."""
    if value == 0 or not math.isfinite(value):
        return f"{value:.4g}"
    prefix = ""
    if abs(value) >= 1:
        for p in ("k", "M", "G", "T", "P", "E"):
            if abs(value) < 1000:
                break
            prefix, value = p, value / 1000
    else:
        for p in ("m", "u", "n", "p", "f", "a"):
            if abs(value) >= 1:
                break
            prefix, value = p, value * 1000
    return f"{value:.4g}{prefix}"


def humanize_duration(value: float) -> str:
    """Prometheus's ``humanizeDuration``: ``1m 5s``, ``2d 1h 0m 3s``, ``250ms``."""
    if not math.isfinite(value):
        return f"{value:.4g}"
    if abs(value) < 1:
        for unit, scale in (("ms", 1e3), ("us", 1e6), ("ns", 1e9)):
            if abs(value * scale) >= 1 or unit == "ns":
                return f"{value * scale:.4g}{unit}"
    whole = int(value)
    days, hours, minutes, secs = whole // 86400, whole // 3600 % 24, whole // 60 % 60, whole % 60
    if days:
        return f"{days}d {hours}h {minutes}m {secs}s"
    if hours:
        return f"{hours}h {minutes}m {secs}s"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{value:.4g}s"


_FORMATS: dict[str, Callable[[float], str]] = {
    PCT: lambda v: f"{v * 100:.4g}%", DUR: humanize_duration, NUM: humanize, VAL: lambda v: f"{v:.4g}"}
_PLACES = (AT_RANK + ": ", AT_RANK, AT_GPU + ": ", AT_GPU, f" on node {L_NODE}", f" (job {L_JOB})", f"Node {L_NODE}: ",
           f"Node {L_NODE} ")
_LABEL = re.compile(r"\{\{ \$labels\.\w+ \}\}\s?")


def value_phrase(description: str, value: float) -> str:
    """The clause of an alert's description that carries its value, rendered as Prometheus renders it, without
    the labels (an offline verdict has no one series): ``"outlier steps lost 31% of the last 10m's step time
    (their time above the median step)"``. ``""`` when the description quotes no value."""
    for sentence in re.split(r"(?<=\.) ", description):
        used = next((f for f in _FORMATS if f in sentence), None)
        if used is None:
            continue
        for place in _PLACES:
            sentence = sentence.replace(place, "")
        clause = sentence.split(": ")[-1] if ": " in sentence.split(used)[0] else sentence
        clause = _LABEL.sub("", clause).replace(used, _FORMATS[used](value)).rstrip(".")
        clause = re.sub(r"\s{2,}", " ", clause).strip()
        if clause.count(")") > clause.count("("):
            clause = clause.rstrip(")")
        return clause[:1].lower() + clause[1:]
    return ""
