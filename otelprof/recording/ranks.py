"""A parsed recording: :class:`RankRecording`, one rank's files (steps parsed, the other files read on
demand), and :class:`Recording`, a run's ranks."""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otelprof.recording import otlp_json, schema
from otelprof.recording.columns import SampleColumns, StepColumns, StepList
from otelprof.recording.files import lines, lines_backwards, open_regular
from otelprof.recording.limits import MAX_LINE_BYTES, MAX_TIME_NS, check_int, loads
from otelprof.recording.profiles import check_profile
from otelprof.recording.records import Annotation, DeviceTime, Span
from otelprof.recording.sample_blocks import KIND, decode
from otelprof.recording.samples import parse_samples


@dataclass
class RankRecording:
    """One rank's files, parsed. ``steps`` is a sequence made on access from ``step_columns``."""

    path: Path
    manifest: dict[str, Any]
    step_columns: StepColumns = field(default_factory=StepColumns)
    annotations: list[Annotation] = field(default_factory=list)
    scalars: list[tuple[int, str, str, float]] = field(default_factory=list)
    phases: list[tuple[int, str]] = field(default_factory=list)
    device_times: list[DeviceTime] = field(default_factory=list)
    """Device times of regions on CUDA, in the order the GPU finished them."""
    skipped_lines: int = 0
    """Truncated or corrupt lines skipped, each counted once however often its file is read."""
    _sample_columns: SampleColumns | None = field(default=None, repr=False)
    _skips: dict[str, int] = field(default_factory=dict, repr=False)

    def _skipped(self, file: str, count: int) -> None:
        """A pass over ``file`` skipped ``count`` lines: count those no earlier pass counted."""
        extra = count - self._skips.get(file, 0)
        if extra > 0:
            self._skips[file] = count
            self.skipped_lines += extra

    @property
    def steps(self) -> StepList:
        return StepList(self.step_columns)

    @property
    def rank(self) -> int:
        return int(self.manifest.get("rank", 0))

    @property
    def lifecycle(self) -> dict[str, float | None]:
        """Lifecycle times (Unix seconds); first/last step derived from steps when the manifest lacks them."""
        life = dict.fromkeys(schema.LIFECYCLE_EVENTS)
        life.update(self.manifest.get("lifecycle") or {})
        columns = self.step_columns
        if len(columns):
            if life.get("first_step_start") is None:
                life["first_step_start"] = min(columns.start_ns) / 1e9
            last = max(map(operator.add, columns.start_ns, columns.duration_ns)) / 1e9
            if life.get("last_step_end") is None or last > (life["last_step_end"] or 0):
                life["last_step_end"] = last
        return life

    def sample_columns(self) -> SampleColumns:
        """samples.jsonl as columns, parsed once (corrupt lines are skipped and counted)."""
        columns = self._sample_columns
        if columns is None:
            columns = parse_samples(self.path / schema.SAMPLES)
            self.add_sample_columns(columns)
        return columns

    def add_sample_columns(self, columns: SampleColumns) -> None:
        """Keep samples.jsonl parsed elsewhere (by a parsing process) and count the lines it skipped."""
        self._sample_columns = columns
        self._skipped(schema.SAMPLES, columns.skipped_lines)

    def spans(self) -> Iterator[Span]:
        """Spans of spans.jsonl (corrupt lines are skipped and counted in ``skipped_lines``)."""
        bad = 0
        try:
            for line in lines(self.path / schema.SPANS):
                try:
                    if line is None:
                        raise ValueError("line too long")
                    request = otlp_json.parse_traces(line)
                except Exception:
                    bad += 1
                    continue
                for resource_spans in request.resource_spans:
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            yield Span(
                                span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                                span.start_time_unix_nano, span.end_time_unix_nano,
                                {a.key: _any_value(a.value) for a in span.attributes},
                            )
        finally:
            self._skipped(schema.SPANS, bad)

    def samples(self) -> Iterator[dict[str, Any]]:
        """Raw telemetry samples of samples.jsonl (format in :mod:`otelprof.recording.schema`; a block line's
        samples one by one)."""
        bad = 0
        try:
            for line in lines(self.path / schema.SAMPLES):
                try:
                    if line is None:
                        raise ValueError("line too long")
                    record = loads(line)
                    found = decode(record) if type(record) is dict and record.get("k") == KIND else [record]
                    for sample in found:
                        check_int(sample["t"], 0, MAX_TIME_NS)
                except (ValueError, KeyError, TypeError, AttributeError):
                    bad += 1
                    continue
                yield from found
        finally:
            self._skipped(schema.SAMPLES, bad)

    def profiles(self) -> Iterator[dict[str, Any]]:
        """Operator-profiling windows of profiles.jsonl (top operators, activity and precision mixes), each
        checked against the format the writer uses (a record that is not is skipped and counted)."""
        bad = 0
        try:
            for line in lines(self.path / schema.PROFILES):
                try:
                    if line is None:
                        raise ValueError("line too long")
                    record = check_profile(loads(line))
                except (ValueError, KeyError, TypeError, AttributeError):
                    bad += 1
                    continue
                yield record
        finally:
            self._skipped(schema.PROFILES, bad)

    def last_metric_snapshot(self) -> Any | None:
        """The newest readable ExportMetricsServiceRequest of metrics.jsonl (each line is a full snapshot
        of the process's metrics), read from the end of the file; None when there is none. Unreadable
        lines on the way are skipped and counted."""
        bad = 0
        try:
            with open_regular(self.path / schema.METRICS) as handle:
                for raw in lines_backwards(handle, MAX_LINE_BYTES[schema.METRICS]):
                    try:
                        if raw is None:
                            raise ValueError("line too long")
                        return otlp_json.parse_metrics(raw.decode("utf-8", errors="replace"))
                    except Exception:
                        bad += 1
        except OSError:
            pass
        finally:
            self._skipped(schema.METRICS, bad)
        return None

    def metric_snapshots(self) -> Iterator[Any]:
        """ExportMetricsServiceRequest messages of metrics.jsonl, oldest first."""
        bad = 0
        try:
            for line in lines(self.path / schema.METRICS):
                try:
                    if line is None:
                        raise ValueError("line too long")
                    message = otlp_json.parse_metrics(line)
                except Exception:
                    bad += 1
                    continue
                yield message
        finally:
            self._skipped(schema.METRICS, bad)


@dataclass
class Recording:
    """A run: one or more ranks."""

    path: Path
    ranks: list[RankRecording]

    @property
    def run_id(self) -> str:
        return str(self.ranks[0].manifest.get("run_id", "")) if self.ranks else ""

    @property
    def skipped_lines(self) -> int:
        return sum(r.skipped_lines for r in self.ranks)


def _any_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None
