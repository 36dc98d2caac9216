"""Per-layer norms over the saved steps, for the report's heatmap, with the layers the tensor checks named.

One rank (the first that saved tensors): a row per gradient tensor (else per weight), plus every tensor a
per-layer check named (of any kind), a column per saved step; the value is the tensor's L2 norm at that step.
Rows and columns are bounded (:data:`MAX_ROWS`, :data:`MAX_STEPS`: named layers first, steps evenly thinned)
and each cell carries its place on one log scale for the whole map (``shade``, 0-1), so the report only draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from otelprof.analysis.tensors import judge
from otelprof.recording.reader import Recording
from otelprof.recording.tensors import read_trial

MAX_ROWS = 48
MAX_STEPS = 60
REDUCTION = "l2"


@dataclass(frozen=True)
class LayerRow:
    tensor: str
    values: tuple[float | None, ...]
    """L2 norm per column (None: not saved at that step, or not finite)."""
    shades: tuple[float | None, ...]
    """Place of each value on the map's log scale, 0 (smallest) to 1 (largest); None without a finite value."""
    nonfinite: tuple[bool, ...]
    named_by: tuple[str, ...] = ()
    """Checks that fired on this tensor (alert names)."""


@dataclass(frozen=True)
class LayerHeatmap:
    rank: int | None = None
    kind: str = ""
    """The kind of the map's rows besides the named ones: ``gradients`` or ``weights``."""
    steps: tuple[int, ...] = ()
    rows: tuple[LayerRow, ...] = ()
    low: float | None = None
    high: float | None = None
    omitted_rows: int = 0
    omitted_steps: int = 0
    named: tuple[tuple[str, str], ...] = ()
    """(check, subject) of every per-layer finding, all ranks (subjects as ``otelprof check`` gives them)."""

    @property
    def empty(self) -> bool:
        return not self.rows


def _thin(steps: list[int]) -> list[int]:
    if len(steps) <= MAX_STEPS:
        return steps
    stride = math.ceil(len(steps) / MAX_STEPS)
    return steps[::stride]


def layer_heatmap(recording: Recording) -> LayerHeatmap:
    """The map of the first rank that saved tensors (empty without any)."""
    trial = None
    rank = None
    for r in recording.ranks:
        found = read_trial(r.path)
        if not found.empty:
            trial, rank = found, r.rank
            break
    if trial is None or rank is None:
        return LayerHeatmap()
    verdicts = judge(recording)
    named = tuple(sorted((check, subject) for check, v in verdicts.items() for subject in v.subjects))
    prefix = f"rank {rank} "
    by_tensor: dict[str, list[str]] = {}
    for check, subject in named:
        if subject.startswith(prefix) and subject[len(prefix):] in trial.records:
            by_tensor.setdefault(subject[len(prefix):], []).append(check)
    kind = "gradients" if trial.tensor_names(kind="gradients") else "weights"
    base = [n for n in trial.tensor_names(kind=kind) if n not in by_tensor]
    chosen = [*by_tensor, *base][:MAX_ROWS]
    order = {n: i for i, n in enumerate(trial.tensor_names())}
    chosen.sort(key=lambda n: (n not in by_tensor, order.get(n, 0)))
    steps = _thin(sorted({n for name in chosen for n in trial.steps(name)}))
    raw: list[tuple[str, list[float | None], list[bool]]] = []
    for name in chosen:
        values: list[float | None] = []
        bad: list[bool] = []
        for n in steps:
            record = trial.records[name].get(n)
            v = record.reductions.get(REDUCTION) if record is not None else None
            finite = v is not None and math.isfinite(v)
            values.append(v if finite else None)
            bad.append(record is not None and (not finite or record.reductions.get("nonfinite", 0.0) > 0))
        raw.append((name, values, bad))
    positive = [v for _, values, _ in raw for v in values if v is not None and v > 0]
    low, high = (min(positive), max(positive)) if positive else (None, None)

    def shade(v: float | None) -> float | None:
        if v is None or low is None or high is None:
            return None
        if v <= 0:
            return 0.0
        span = math.log10(high) - math.log10(low)
        return 1.0 if span <= 0 else (math.log10(v) - math.log10(low)) / span

    rows = tuple(LayerRow(name, tuple(values), tuple(shade(v) for v in values), tuple(bad),
                          tuple(by_tensor.get(name, ()))) for name, values, bad in raw)
    all_steps = {n for name in [*by_tensor, *trial.tensor_names(kind=kind)] for n in trial.steps(name)}
    return LayerHeatmap(rank, kind, tuple(steps), rows, low, high,
                        len(set(by_tensor) | set(trial.tensor_names(kind=kind))) - len(rows),
                        len(all_steps) - len(steps), named)
