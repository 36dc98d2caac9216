"""``tensors.jsonl``: tensor statistics of the saved steps, and the read API over them (a "trial").

One file per rank directory, beside ``steps.jsonl``; one JSON object per line:

* header (first line): ``{"k":"h","every":N,"bins":B,"reductions":[...],"collections":[{"name":...,
  "include":regex|null,"exclude":regex|null,"every":N|null,"start":N,"end":N|null},...]}``
* tensor: ``{"k":"t","n":step,"name":tensor,"kind":kind,"c":[collection,...],"shape":[...],
  "r":{reduction:value},"m":module_class,"h":[bin counts]}`` (``m`` for outputs/inputs, ``h`` with bins)
* label counts of a saved step's batches: ``{"k":"l","n":step,"counts":[count of class 0, 1, ...]}``
* a full tensor (``OTELPROF_TENSOR_SAVE``): ``{"k":"f","n":step,"name":tensor,"shape":[...],"at":byte offset,
  "count":elements}``, its values float32 little-endian in ``tensors-full.bin`` from ``at``
* full tensors of a step left out (over a byte budget, or not written): ``{"k":"fd","n":step,"names":[...]}``

``n`` is the 0-based optimizer step. Reductions (:data:`REDUCTIONS`) are of the whole tensor, as float32;
``abs_*`` of its absolute values; ``zeros`` and ``nonfinite`` are fractions of its elements. Outputs of
``Sigmoid``/``Tanh`` also have ``saturated`` (fraction within 0.01 of the bounds), ``optimizer`` tensors
(``update/<parameter>``) ``ratio``: the update's L2 norm over the weight's. Every line is strict JSON: a
non-finite value is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (as OTLP-JSON does;
earlier recordings wrote JSON's bare ``NaN``/``Infinity`` tokens, which are still read).

Read it with :func:`read_trial` (or :func:`trial` for a whole recording's first rank)::

    t = read_trial("otelprof-runs/RUN/rank-0")
    t.tensor_names(collection="gradients")
    t.steps("gradients/fc1.weight")
    t.reduction("gradients/fc1.weight", step=100, name="mean", abs=True)
    t.full_tensor("fc1.weight", step=100)       # (shape, values) when OTELPROF_TENSOR_SAVE saved it
"""

from __future__ import annotations

import json
import math
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TENSORS = "tensors.jsonl"
KIND_HEADER = "h"
KIND_TENSOR = "t"
KIND_LABELS = "l"
KIND_FULL = "f"
KIND_FULL_DROPPED = "fd"
TENSORS_FULL = "tensors-full.bin"

REDUCTIONS = ("mean", "std", "min", "max", "l1", "l2", "abs_mean", "abs_std", "abs_min", "abs_max", "zeros",
              "nonfinite")
"""The reductions of every saved tensor, in the order the collector computes them."""
MAX_LINE = 1 << 20
MAX_LINES = 5_000_000


@dataclass(frozen=True)
class TensorRecord:
    step: int
    name: str
    kind: str
    collections: tuple[str, ...]
    shape: tuple[int, ...]
    reductions: dict[str, float]
    module: str | None = None
    histogram: tuple[float, ...] = ()


@dataclass
class Trial:
    """The saved tensors of one rank: names by collection, steps saved, reductions."""

    path: Path
    header: dict[str, Any] = field(default_factory=dict)
    records: dict[str, dict[int, TensorRecord]] = field(default_factory=dict)
    labels: dict[int, list[int]] = field(default_factory=dict)
    skipped_lines: int = 0
    full: dict[str, dict[int, tuple[tuple[int, ...], int, int]]] = field(default_factory=dict)
    """Full tensors saved: name -> step -> (shape, byte offset in tensors-full.bin, elements)."""
    full_dropped: dict[int, list[str]] = field(default_factory=dict)
    """Per saved step, the full tensors left out (over a byte budget, or not written)."""

    @property
    def empty(self) -> bool:
        return not self.records and not self.labels

    def collections(self) -> list[str]:
        """The configured collections (header), else those seen in the records."""
        names = [str(c.get("name")) for c in self.header.get("collections", []) if isinstance(c, dict)]
        seen = {c for by_step in self.records.values() for r in by_step.values() for c in r.collections}
        return names + sorted(seen - set(names))

    def tensor_names(self, collection: str | None = None, kind: str | None = None) -> list[str]:
        """Tensor names (in first-saved order), optionally of one collection or one kind."""
        out = []
        for name, by_step in self.records.items():
            first = next(iter(by_step.values()))
            if collection is not None and collection not in first.collections:
                continue
            if kind is not None and first.kind != kind:
                continue
            out.append(name)
        return out

    def steps(self, name: str | None = None) -> list[int]:
        """The steps at which ``name`` (default: any tensor) was saved, ascending."""
        if name is not None:
            return sorted(self.records.get(name, {}))
        return sorted({n for by_step in self.records.values() for n in by_step})

    def record(self, name: str, step: int) -> TensorRecord:
        try:
            return self.records[name][step]
        except KeyError:
            raise KeyError(f"no tensor {name!r} saved at step {step}") from None

    def reduction(self, name: str, step: int, reduction: str = "mean", abs: bool = False) -> float:
        """One reduction of a saved tensor (``abs=True``: of its absolute values; ``l1``/``l2``/``zeros``/
        ``nonfinite``/``ratio``/``saturated`` are the same either way). KeyError when not saved."""
        values = self.record(name, step).reductions
        key = f"abs_{reduction}" if abs and f"abs_{reduction}" in values else reduction
        if key not in values:
            raise KeyError(f"no reduction {key!r} for {name!r} (have {', '.join(values)})")
        return values[key]

    def series(self, name: str, reduction: str = "mean", abs: bool = False) -> list[tuple[int, float]]:
        """(step, value) of one reduction over every saved step of ``name``."""
        return [(n, self.reduction(name, n, reduction, abs)) for n in self.steps(name)]

    def kind(self, name: str) -> str:
        return next(iter(self.records[name].values())).kind

    def module(self, name: str) -> str | None:
        return next(iter(self.records[name].values())).module

    def full_tensor(self, name: str, step: int) -> tuple[tuple[int, ...], list[float]]:
        """The saved values of ``name`` at ``step`` (shape, values in row-major order); KeyError when not saved,
        ValueError when ``tensors-full.bin`` does not hold them."""
        try:
            shape, at, count = self.full[name][step]
        except KeyError:
            raise KeyError(f"no full tensor {name!r} saved at step {step}") from None
        values = array("f")
        with open(self.path / TENSORS_FULL, "rb") as handle:
            handle.seek(at)
            data = handle.read(4 * count)
        if len(data) != 4 * count:
            raise ValueError(f"{TENSORS_FULL} is shorter than its index ({name!r} at step {step})")
        values.frombytes(data)
        if sys.byteorder == "big":
            values.byteswap()  # the file is little-endian
        return shape, values.tolist()

    def label_counts(self) -> list[int]:
        """Per class, the labels counted over every saved step."""
        total: list[int] = []
        for counts in self.labels.values():
            if len(counts) > len(total):
                total.extend([0] * (len(counts) - len(total)))
            for i, c in enumerate(counts):
                total[i] += c
        return total


_NON_FINITE = ("NaN", "Infinity", "-Infinity")  # float() reads each of them


def _record(obj: dict[str, Any]) -> TensorRecord | None:
    n, name, r = obj.get("n"), obj.get("name"), obj.get("r")
    if not isinstance(n, int) or not isinstance(name, str) or not isinstance(r, dict):
        return None
    reductions = {str(k): float(v) for k, v in r.items()
                  if (isinstance(v, int | float) and not isinstance(v, bool)) or v in _NON_FINITE}
    shape = obj.get("shape") or []
    module = obj.get("m")
    hist = obj.get("h") or []
    return TensorRecord(n, name, str(obj.get("kind", "")), tuple(str(c) for c in obj.get("c") or ()),
                        tuple(int(s) for s in shape if isinstance(s, int)), reductions,
                        module if isinstance(module, str) else None,
                        tuple(float(v) for v in hist if isinstance(v, int | float)))


def read_trial(rank_dir: str | Path) -> Trial:
    """Parse ``rank_dir/tensors.jsonl`` (an absent file: an empty trial). Bad lines are skipped and counted."""
    path = Path(rank_dir)
    trial = Trial(path)
    try:
        handle = open(path / TENSORS, "rb")  # noqa: SIM115
    except OSError:
        return trial
    with handle:
        for count, raw in enumerate(handle):
            if count >= MAX_LINES:
                trial.skipped_lines += 1
                continue
            if len(raw) > MAX_LINE:
                trial.skipped_lines += 1
                continue
            try:
                obj = json.loads(raw)
                kind = obj.get("k")
                if kind == KIND_TENSOR:
                    record = _record(obj)
                    if record is None:
                        raise ValueError("bad tensor record")
                    trial.records.setdefault(record.name, {})[record.step] = record
                elif kind == KIND_LABELS:
                    counts = obj.get("counts")
                    if not isinstance(obj.get("n"), int) or not isinstance(counts, list):
                        raise ValueError("bad label record")
                    trial.labels[obj["n"]] = [int(c) for c in counts]
                elif kind == KIND_FULL:
                    n, name, at, count = obj.get("n"), obj.get("name"), obj.get("at"), obj.get("count")
                    if not (isinstance(n, int) and isinstance(name, str) and isinstance(at, int) and at >= 0
                            and isinstance(count, int) and count >= 0):
                        raise ValueError("bad full tensor record")
                    shape = tuple(int(v) for v in obj.get("shape") or () if isinstance(v, int))
                    trial.full.setdefault(name, {})[n] = (shape, at, count)
                elif kind == KIND_FULL_DROPPED:
                    names = obj.get("names")
                    if not isinstance(obj.get("n"), int) or not isinstance(names, list):
                        raise ValueError("bad dropped record")
                    trial.full_dropped.setdefault(obj["n"], []).extend(str(v) for v in names)
                elif kind == KIND_HEADER:
                    trial.header = obj
                else:
                    raise ValueError("unknown record")
            except (ValueError, TypeError, AttributeError):
                trial.skipped_lines += 1
    return trial


def finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))
