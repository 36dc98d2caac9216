"""What every section of the report shares: who the ranks and nodes are, the time origin, and the
per-rank and per-node columns, computed once from a :class:`~otelprof.recording.ranks.Recording`."""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, TypeVar

from otelprof import semconv as sc
from otelprof import thresholds
from otelprof.analysis import ranksummary
from otelprof.recording.columns import SampleColumns, StepColumns
from otelprof.recording.ranks import RankRecording, Recording

T = TypeVar("T")

MAX_PHASES = 20
"""Phases a report section lists one by one: those with the most step time over all ranks (a run may name a phase
per step); the framework summary adds up the others in one row."""


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    node: str
    job: str
    pid: int | None
    status: str
    """``finished`` or ``running`` (a run whose process was killed stays ``running``)."""


class RunView:
    """Read-only helper over a recording (not a result: sections return their own dataclasses)."""

    def __init__(self, recording: Recording, progress: Callable[[str], None] | None = None) -> None:
        self.recording = recording
        self.ranks: list[RankRecording] = list(recording.ranks)
        self.progress = progress
        self.info = [_info(r) for r in self.ranks]
        self._durations: dict[int, dict[str, list[float]]] = {}
        self._sums: dict[tuple[int, str], array[int]] = {}
        self._nodes: dict[str, tuple[RankInfo, SampleColumns]] | None = None
        self._memo: dict[object, Any] = {}

    def memo(self, key: object, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per key (figures several sections share)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    # ------------------------------------------------------------------ identity and time
    @property
    def config(self) -> dict[str, Any]:
        return dict(self.ranks[0].manifest.get("config") or {}) if self.ranks else {}

    @property
    def outlier_sigma(self) -> float:
        return outlier_settings(self.config)[0]

    @property
    def outlier_floor(self) -> tuple[float, float]:
        """(ratio, seconds): how much slower than its phase's median step an outlier must also be."""
        return outlier_settings(self.config)[1]

    def samples(self, index: int) -> SampleColumns:
        return self.ranks[index].sample_columns()

    def first_time(self) -> float | None:
        """Earliest time anything happened (Unix seconds): process start, else the first record."""
        times = []
        for i, rank in enumerate(self.ranks):
            life = rank.lifecycle
            if life.get("process_start") is not None:
                times.append(float(life["process_start"]))  # type: ignore[arg-type]
                continue
            candidates = [life.get(k) for k in ("init", "first_step_start")]
            samples = self.samples(i)
            if len(samples):
                candidates.append(samples.t_ns[0] / 1e9)
            candidates += [a.start_ns / 1e9 for a in rank.annotations[:1]]
            times += [float(c) for c in candidates if c is not None]
        return min(times) if times else None

    def last_time(self) -> float | None:
        """Latest time anything happened: shutdown, else the last step, sample or annotation."""
        times = []
        for i, rank in enumerate(self.ranks):
            life = rank.lifecycle
            candidates = [life.get("shutdown"), life.get("last_step_end")]
            samples = self.samples(i)
            if len(samples):
                candidates.append(samples.t_ns[-1] / 1e9)
            candidates += [(a.start_ns + a.duration_ns) / 1e9 for a in rank.annotations[-1:]]
            times += [float(c) for c in candidates if c is not None]
        return max(times) if times else None

    @property
    def origin(self) -> float:
        found: float = self.memo("origin", lambda: self.first_time() or 0.0)
        return found

    # ------------------------------------------------------------------ steps
    def durations(self, index: int) -> dict[str, list[float]]:
        """Step durations in seconds per phase, in file order."""
        found = self._durations.get(index)
        if found is None:
            found = self._durations[index] = phase_durations(self.ranks[index].step_columns)
        return found

    def phase_totals(self, index: int) -> dict[str, tuple[int, float]]:
        """Per phase of rank ``index``'s steps: (steps, seconds in them) (:func:`phase_totals`)."""
        return phase_totals(self.ranks[index].step_columns)

    def shown_phases(self) -> frozenset[str]:
        """The :data:`MAX_PHASES` phases with the most step time over all ranks (all of them when there are no
        more)."""
        def compute() -> frozenset[str]:
            totals: dict[str, float] = {}
            for index in range(len(self.ranks)):
                for name, (_, seconds) in self.phase_totals(index).items():
                    totals[name] = totals.get(name, 0.0) + seconds
            return frozenset(sorted(totals, key=lambda name: (-totals[name], name))[:MAX_PHASES])

        found: frozenset[str] = self.memo("shown_phases", compute)
        return found

    def region(self, index: int, name: str) -> tuple[list[int], list[int], list[int]]:
        """(step indexes, durations in ns, depths) of rank ``index``'s regions called ``name``."""
        result: tuple[list[int], list[int], list[int]] = self.memo(
            ("region", index, name), lambda: self.ranks[index].step_columns.region(name))
        return result

    def region_sums(self, index: int, name: str) -> array[int]:
        """Per step of rank ``index``: nanoseconds in regions called ``name``."""
        key = (index, name)
        found = self._sums.get(key)
        if found is None:
            found = self._sums[key] = self.ranks[index].step_columns.annotation_sums(name)
        return found

    # ------------------------------------------------------------------ nodes
    def nodes(self) -> dict[str, tuple[RankInfo, SampleColumns]]:
        """Per node: the rank that sampled it (most node samples) and its sample columns."""
        if self._nodes is None:
            best: dict[str, tuple[RankInfo, SampleColumns]] = {}
            for i, info in enumerate(self.info):
                columns = self.samples(i)
                if columns.node_samples == 0:
                    continue
                current = best.get(info.node)
                if current is None or columns.node_samples > current[1].node_samples:
                    best[info.node] = (info, columns)
            self._nodes = dict(sorted(best.items()))
        return self._nodes

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)

    def say_rank(self, what: str, index: int) -> None:
        """Progress through the ranks: each one up to :data:`ranksummary.THRESHOLD` ranks, beyond about ten
        lines and the last (a line per rank of a thousand ranks would be thousands of lines)."""
        if self.progress is None:
            return
        count = len(self.info)
        every = 1 if count <= ranksummary.THRESHOLD else max(1, count // 10)
        if index % every == 0 or index == count - 1:
            self.progress(f"{what} of rank {self.info[index].rank}"
                          + ("" if every == 1 else f" ({index + 1:,} of {count:,} ranks)"))


def outlier_settings(config: dict[str, Any]) -> tuple[float, tuple[float, float]]:
    """(sigma, (ratio, seconds)) of the outlier steps, from a rank's recorded config (``manifest["config"]``)."""
    return (float(config.get("outlier_sigma", 3.0) or 3.0),
            (float(config.get("outlier_min_ratio", thresholds.OUTLIER_MIN_RATIO)),
             float(config.get("outlier_min_excess", thresholds.OUTLIER_MIN_EXCESS))))


def phase_durations(c: StepColumns) -> dict[str, list[float]]:
    """Step durations in seconds per phase of one rank's steps, in file order."""
    found = {}
    for name, steps in c.phase_steps().items():
        durations = c.duration_ns if len(c.phase_names) == 1 else map(c.duration_ns.__getitem__, steps)
        seconds = list(map(operator.truediv, durations, repeat(1e9)))
        if seconds:
            found[name] = seconds
    return found


def phase_totals(c: StepColumns) -> dict[str, tuple[int, float]]:
    """Per phase of one rank's steps: (steps, seconds in them, ``math.fsum`` of :func:`phase_durations`), kept
    with the columns (:func:`per_rank`)."""
    return per_rank(c, "phase totals", lambda: {name: (len(seconds), math.fsum(seconds))
                                                for name, seconds in phase_durations(c).items()})


def per_rank(columns: StepColumns | SampleColumns, key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()`` once per ``key`` for one rank's step or sample columns, kept with them: what a parsing process
    computes beside the parsing (:func:`otelprof.analysis.rank_figures.prepare_figures`) comes back with the
    columns, and the sections find it there. Computed again when the columns have grown since."""
    kept: dict[Hashable, tuple[int, Any]] = columns.__dict__.setdefault("_figures", {})
    found = kept.get(key)
    if found is None or found[0] != len(columns):
        found = kept[key] = (len(columns), compute())
    result: T = found[1]
    return result


def _info(rank: RankRecording) -> RankInfo:
    manifest = rank.manifest
    resource = manifest.get("resource") or {}
    node = str(resource.get(sc.K8S_NODE_NAME) or resource.get(sc.HOST_NAME) or f"node-of-rank-{rank.rank}")
    pid = resource.get(sc.PROCESS_PID)
    return RankInfo(rank.rank, int(manifest.get("local_rank", 0) or 0), node,
                    str(resource.get(sc.SERVICE_NAME) or (manifest.get("config") or {}).get("job_name") or ""),
                    int(pid) if isinstance(pid, int) else None, str(manifest.get("status", "")))


def gpu_memory_ratio(used: array[float], total: array[float]) -> list[float]:
    """Per sample: used / total (NaN where either is missing or the total is 0)."""
    if 0.0 not in total:
        return list(map(operator.truediv, used, total))  # NaN stays NaN
    return [u / t if t and t == t and u == u else math.nan for u, t in zip(used, total)]


def across(columns: Sequence[Sequence[float]], how: str) -> list[float]:
    """Per sample: ``mean``, ``min`` or ``max`` over several columns (one per GPU), leaving NaN entries
    out; NaN when every column lacks the sample."""
    if not columns:
        return []
    k = len(columns)
    if how != "mean" and all(math.isfinite(sum(column)) for column in columns):  # no NaN: no sums needed
        return list(map(min if how == "min" else max, *columns)) if k > 1 else list(columns[0])
    sums = list(map(sum, zip(*columns)))
    complete = math.isfinite(sum(sums))  # no column lacks a sample (NaN would carry into the sum)
    if how == "mean":
        out = [v / k for v in sums]
        if complete:
            return out
    else:
        out = list(map(min if how == "min" else max, *columns)) if k > 1 else list(columns[0])
        if complete:
            return out
    rows = list(zip(*columns))
    for i, total in enumerate(sums):
        if total != total:  # some column lacks this sample: judge the others
            present = [v for v in rows[i] if v == v]
            if not present:
                out[i] = math.nan
            elif how == "mean":
                out[i] = sum(present) / len(present)
            else:
                out[i] = min(present) if how == "min" else max(present)
    return out


def last_values(rank: RankRecording) -> dict[str, list[tuple[dict[str, Any], float]]]:
    """Gauge and sum points of the rank's newest metric snapshot: metric name -> [(attributes, value)]."""
    snapshot = rank.last_metric_snapshot()
    out: dict[str, list[tuple[dict[str, Any], float]]] = {}
    if snapshot is None:
        return out
    for resource_metrics in snapshot.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                if kind not in ("gauge", "sum"):
                    continue
                for point in getattr(metric, kind).data_points:
                    value = point.as_double if point.WhichOneof("value") == "as_double" else float(point.as_int)
                    attributes = {a.key: getattr(a.value, a.value.WhichOneof("value") or "string_value")
                                  for a in point.attributes}
                    out.setdefault(metric.name, []).append((attributes, value))
    return out


def mean_and_min(columns: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """``across(columns, "mean")`` and ``across(columns, "min")``: in one pass over the samples when no column
    lacks one (a node's GPUs)."""
    if len(columns) > 1 and all(math.isfinite(sum(column)) for column in columns):
        rows = list(zip(*columns))
        k = len(columns)
        return [v / k for v in map(sum, rows)], list(map(min, rows))
    return across(columns, "mean"), across(columns, "min")


def gpu_utilization(columns: SampleColumns) -> tuple[list[float], list[float]]:
    """Per sample: the mean utilization over the GPUs that reported one (:func:`per_sample_gpu_mean`) and the
    least (:func:`gpu_min`); NaN where none did."""
    series = [g["u"] for g in columns.gpus.values() if "u" in g]
    return mean_and_min(series) if series else ([math.nan] * len(columns), [])


def gpu_min(columns: SampleColumns) -> list[float]:
    """Per sample: the least utilized GPU's utilization."""
    return across([g["u"] for g in columns.gpus.values() if "u" in g], "min")
