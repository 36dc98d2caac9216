"""The only parser of run recordings. Tolerant of a killed writer: a truncated or corrupt
line is skipped and counted, never fatal; an unknown schema major version is an error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otelprof.recording import otlp_json, schema


class RecordingError(Exception):
    """The path is not a recording otelprof can read."""


@dataclass(frozen=True)
class Annotation:
    name: str
    start_ns: int
    duration_ns: int
    depth: int = 0
    phase: str | None = None


@dataclass(frozen=True)
class Step:
    phase: str
    number: int
    start_ns: int
    duration_ns: int
    annotations: tuple[Annotation, ...] = ()
    scalars: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def duration(self) -> float:
        """Seconds."""
        return self.duration_ns / 1e9

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]


@dataclass
class RankRecording:
    """One rank's files, parsed."""

    path: Path
    manifest: dict[str, Any]
    steps: list[Step] = field(default_factory=list)
    annotations: list[Annotation] = field(default_factory=list)
    scalars: list[tuple[int, str, str, float]] = field(default_factory=list)
    phases: list[tuple[int, str]] = field(default_factory=list)
    skipped_lines: int = 0

    @property
    def rank(self) -> int:
        return int(self.manifest.get("rank", 0))

    @property
    def lifecycle(self) -> dict[str, float | None]:
        """Lifecycle times (Unix seconds); first/last step derived from steps when the manifest lacks them."""
        life = dict.fromkeys(schema.LIFECYCLE_EVENTS)
        life.update(self.manifest.get("lifecycle") or {})
        if self.steps:
            if life.get("first_step_start") is None:
                life["first_step_start"] = min(s.start_ns for s in self.steps) / 1e9
            last = max(s.end_ns for s in self.steps) / 1e9
            if life.get("last_step_end") is None or last > (life["last_step_end"] or 0):
                life["last_step_end"] = last
        return life

    def spans(self) -> Iterator[Span]:
        """Spans of spans.jsonl (corrupt lines are skipped and counted in ``skipped_lines``)."""
        for line in _lines(self.path / schema.SPANS):
            try:
                request = otlp_json.parse_traces(line)
            except Exception:
                self.skipped_lines += 1
                continue
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        yield Span(
                            span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                            span.start_time_unix_nano, span.end_time_unix_nano,
                            {a.key: _any_value(a.value) for a in span.attributes},
                        )

    def samples(self) -> Iterator[dict[str, Any]]:
        """Raw telemetry samples of samples.jsonl (format in :mod:`otelprof.recording.schema`)."""
        for line in _lines(self.path / schema.SAMPLES):
            try:
                sample = json.loads(line)
                int(sample["t"])
            except (ValueError, KeyError, TypeError):
                self.skipped_lines += 1
                continue
            yield sample

    def profiles(self) -> Iterator[dict[str, Any]]:
        """Operator-profiling windows of profiles.jsonl (top operators, activity and precision mixes)."""
        for line in _lines(self.path / schema.PROFILES):
            try:
                yield dict(json.loads(line))
            except (ValueError, TypeError):
                self.skipped_lines += 1

    def metric_snapshots(self) -> Iterator[Any]:
        """ExportMetricsServiceRequest messages of metrics.jsonl, oldest first."""
        for line in _lines(self.path / schema.METRICS):
            try:
                yield otlp_json.parse_metrics(line)
            except Exception:
                self.skipped_lines += 1


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
    return getattr(value, kind) if kind else None


def _lines(path: Path) -> Iterator[str]:
    if not path.exists():
        return
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            line = line.strip()
            if line:
                yield line


def _check_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((path / schema.MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise RecordingError(f"{path} has no {schema.MANIFEST}: not an otelprof recording") from exc
    except (OSError, ValueError) as exc:
        raise RecordingError(f"cannot read {path / schema.MANIFEST}: {exc}") from exc
    version = str(manifest.get("schema_version", ""))
    try:
        major = int(version.split(".")[0])
    except ValueError as exc:
        raise RecordingError(f"{path / schema.MANIFEST} has no valid schema_version ({version!r})") from exc
    if major != schema.SCHEMA_MAJOR:
        raise RecordingError(
            f"{path} uses recording schema {version}; this otelprof reads {schema.SCHEMA_MAJOR}.x — "
            "use a matching otelprof version")
    return dict(manifest)


def read_rank(path: Path) -> RankRecording:
    """Parse one rank directory (``rank-<n>/``)."""
    rank = RankRecording(Path(path), _check_manifest(Path(path)))
    for line in _lines(rank.path / schema.STEPS):
        try:
            _parse_step_line(json.loads(line), rank)
        except (ValueError, KeyError, TypeError, IndexError):
            rank.skipped_lines += 1
    return rank


def _parse_step_line(data: dict[str, Any], rank: RankRecording) -> None:
    kind = data["k"]
    if kind == schema.KIND_STEP:
        start = int(data["t"])
        annotations = tuple(
            Annotation(str(name), start + int(offset), int(dur), int(depth), data["ph"])
            for name, offset, dur, depth in data.get("a", ())
        )
        rank.steps.append(Step(str(data["ph"]), int(data["n"]), start, int(data["d"]), annotations,
                               {str(k): float(v) for k, v in data.get("x", {}).items()}, data.get("err")))
    elif kind == schema.KIND_ANNOTATION:
        rank.annotations.append(Annotation(str(data["name"]), int(data["t"]), int(data["d"]), 0, data.get("ph")))
    elif kind == schema.KIND_SCALAR:
        rank.scalars.append((int(data["t"]), str(data["ph"]), str(data["name"]), float(data["v"])))
    elif kind == schema.KIND_PHASE:
        rank.phases.append((int(data["t"]), str(data["ph"])))
    else:
        raise ValueError(f"unknown record kind {kind!r}")


def read_recording(path: str | Path) -> Recording:
    """Parse a run directory (``<run-id>/`` with ``rank-*/``) or a single rank directory."""
    root = Path(path)
    if not root.is_dir():
        raise RecordingError(f"{root} is not a directory")
    if (root / schema.MANIFEST).exists():
        return Recording(root, [read_rank(root)])
    rank_dirs = sorted((p for p in root.glob("rank-*") if p.is_dir()), key=lambda p: _rank_number(p.name))
    if not rank_dirs:
        raise RecordingError(f"{root} holds no rank-*/ directories: not an otelprof recording")
    return Recording(root, [read_rank(p) for p in rank_dirs])


def _rank_number(name: str) -> int:
    try:
        return int(name.split("-", 1)[1])
    except (IndexError, ValueError):
        return 1 << 30


def latest_run(record_dir: str | Path) -> Path | None:
    """The most recently modified run directory under ``record_dir``."""
    root = Path(record_dir)
    if not root.is_dir():
        return None
    runs = [p for p in root.iterdir() if p.is_dir() and any(p.glob("rank-*/manifest.json"))]
    return max(runs, key=lambda p: p.stat().st_mtime, default=None)
