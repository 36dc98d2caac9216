"""The only parser of run recordings. Tolerant of a killed writer: a truncated or corrupt
line is skipped and counted, never fatal; an unknown schema major version is an error."""

from __future__ import annotations

import json
import math
import operator
import os
import re
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain, compress, repeat
from pathlib import Path
from typing import Any, overload

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
class DeviceTime:
    """Device (CUDA event) time of one region of the step ``phase``/``number`` (None: outside steps)."""

    phase: str
    number: int | None
    name: str
    duration_ns: int


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]


_new = object.__new__
_set = object.__setattr__


def _annotation(name: str, start_ns: int, duration_ns: int, depth: int, phase: str | None) -> Annotation:
    """``Annotation(...)`` without the frozen dataclass's per-field setattr calls (twice as fast; steps of long
    runs are made by the million)."""
    annotation = _new(Annotation)
    _set(annotation, "__dict__", {"name": name, "start_ns": start_ns, "duration_ns": duration_ns, "depth": depth,
                                  "phase": phase})
    return annotation


class StepColumns:
    """One rank's step records as columns, in file order: what analyses of long runs iterate over.

    Step ``i`` has its annotations at ``ann_index[i]:ann_index[i + 1]`` (offsets from the step start)
    and its scalars at ``scalar_index[i]:scalar_index[i + 1]``; names are codes into the name lists.
    :meth:`step` makes the :class:`Step` object of one row."""

    def __init__(self) -> None:
        self.phase_names: list[str] = []
        self.phase = array("I")
        self.number = array("q")
        self.start_ns = array("q")
        self.duration_ns = array("q")
        self.ann_index = array("q", [0])
        self.ann_names: list[str] = []
        self.ann_name = array("I")
        self.ann_offset = array("q")
        self.ann_duration = array("q")
        self.ann_depth = array("i")
        self.scalar_index = array("q", [0])
        self.scalar_names: list[str] = []
        self.scalar_name = array("I")
        self.scalar_value = array("d")
        self.errors: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self.start_ns)

    @staticmethod
    def code(names: list[str], name: str) -> int:
        """Code of ``name`` in ``names`` (one of the three name lists), added when new."""
        try:
            return names.index(name)
        except ValueError:
            names.append(name)
            return len(names) - 1

    def append(self, phase: str, number: int, start_ns: int, duration_ns: int,
               annotations: Sequence[tuple[str, int, int, int]] = (), scalars: dict[str, float] | None = None,
               error: str | None = None) -> None:
        """Add one step; annotations as (name, offset from the step start, duration, depth)."""
        if error:
            self.errors[len(self.start_ns)] = error
        self.phase.append(self.code(self.phase_names, phase))
        self.number.append(number)
        self.start_ns.append(start_ns)
        self.duration_ns.append(duration_ns)
        for name, offset, duration, depth in annotations:
            self.ann_name.append(self.code(self.ann_names, name))
            self.ann_offset.append(offset)
            self.ann_duration.append(duration)
            self.ann_depth.append(depth)
        self.ann_index.append(len(self.ann_name))
        for key, value in (scalars or {}).items():
            self.scalar_name.append(self.code(self.scalar_names, key))
            self.scalar_value.append(value)
        self.scalar_index.append(len(self.scalar_name))

    def step(self, i: int) -> Step:
        phase = self.phase_names[self.phase[i]]
        start = self.start_ns[i]
        names, codes, offsets, durations, depths = (self.ann_names, self.ann_name, self.ann_offset,
                                                    self.ann_duration, self.ann_depth)
        annotations = tuple(_annotation(names[codes[j]], start + offsets[j], durations[j], depths[j], phase)
                            for j in range(self.ann_index[i], self.ann_index[i + 1]))
        scalars = {self.scalar_names[self.scalar_name[j]]: self.scalar_value[j]
                   for j in range(self.scalar_index[i], self.scalar_index[i + 1])}
        step = _new(Step)
        _set(step, "__dict__", {"phase": phase, "number": self.number[i], "start_ns": start,
                                "duration_ns": self.duration_ns[i], "annotations": annotations, "scalars": scalars,
                                "error": self.errors.get(i)})
        return step

    def _step_of(self, bounds: array[int]) -> array[int]:
        """Step index of every entry of a CSR index (annotations or scalars), computed once per index."""
        key = "_ann_step" if bounds is self.ann_index else "_scalar_step"
        found: array[int] | None = self.__dict__.get(key)
        if found is None or len(found) != bounds[-1]:
            found = self.__dict__[key] = array("q", chain.from_iterable(
                map(repeat, range(len(bounds) - 1), map(operator.sub, bounds[1:], bounds[:-1]))))
        return found

    def phase_mask(self, phase: str) -> list[bool]:
        """Per step: is it of ``phase``."""
        if phase not in self.phase_names:
            return [False] * len(self)
        return list(map(self.phase_names.index(phase).__eq__, self.phase))

    def scalar(self, name: str) -> tuple[array[int], array[float]]:
        """(step indexes, values) of one scalar recorded inside steps."""
        if name not in self.scalar_names:
            return array("q"), array("d")
        mask = list(map(self.scalar_names.index(name).__eq__, self.scalar_name))
        return (array("q", list(compress(self._step_of(self.scalar_index), mask))),
                array("d", list(compress(self.scalar_value, mask))))

    def region(self, name: str) -> tuple[list[int], list[int], list[int]]:
        """(step indexes, durations in ns, depths) of every annotation called ``name``, in file order."""
        if name not in self.ann_names:
            return [], [], []
        if len(self.ann_names) == 1:
            return list(self._step_of(self.ann_index)), list(self.ann_duration), list(self.ann_depth)
        mask = list(map(self.ann_names.index(name).__eq__, self.ann_name))
        return (list(compress(self._step_of(self.ann_index), mask)), list(compress(self.ann_duration, mask)),
                list(compress(self.ann_depth, mask)))

    def region_totals(self) -> dict[str, tuple[int, int, int, int]]:
        """Per annotation name: (count, total ns, longest ns, smallest depth)."""
        if "_totals" not in self.__dict__:
            self.summarize_regions()
        totals: dict[str, tuple[int, int, int, int]] = self.__dict__["_totals"]
        return totals

    def summarize_regions(self) -> None:
        """Total the regions by name and per step in one pass (cached for region_totals and annotation_sums)."""
        k, n = len(self.ann_names), len(self)
        count, total, longest, depth = [0] * k, [0] * k, [0] * k, [1 << 30] * k
        sums = [array("q", bytes(8 * n)) for _ in range(k)]
        for step, code, duration, level in zip(self._step_of(self.ann_index), self.ann_name, self.ann_duration,
                                               self.ann_depth):
            count[code] += 1
            total[code] += duration
            sums[code][step] += duration
            if duration > longest[code]:
                longest[code] = duration
            if level < depth[code]:
                depth[code] = level
        self.__dict__["_totals"] = {name: (count[i], total[i], longest[i], depth[i])
                                    for i, name in enumerate(self.ann_names) if count[i]}
        self.__dict__["_sums"] = dict(zip(self.ann_names, sums))

    def annotation_sums(self, name: str) -> array[int]:
        """Per step: nanoseconds in annotations called ``name`` (all depths)."""
        cached = self.__dict__.get("_sums")
        if cached is not None and len(cached.get(name, ())) == len(self):
            return array("q", cached[name])
        steps, durations, _ = self.region(name)
        by_step = dict(zip(steps, durations))
        if len(by_step) == len(steps):  # at most one such region per step: no adding up needed
            return array("q", map(by_step.get, range(len(self)), repeat(0)))
        sums = array("q", bytes(8 * len(self)))
        for step, duration in zip(steps, durations):
            sums[step] += duration
        return sums


class StepList(Sequence[Step]):
    """A rank's steps as a read-only sequence of :class:`Step`, made from :class:`StepColumns` on access."""

    def __init__(self, columns: StepColumns) -> None:
        self._columns = columns

    def __len__(self) -> int:
        return len(self._columns)

    @overload
    def __getitem__(self, index: int) -> Step: ...

    @overload
    def __getitem__(self, index: slice) -> list[Step]: ...

    def __getitem__(self, index: int | slice) -> Step | list[Step]:
        if isinstance(index, slice):
            return [self._columns.step(i) for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("step index out of range")
        return self._columns.step(index)

    def __iter__(self) -> Iterator[Step]:
        step = self._columns.step
        for i in range(len(self)):
            yield step(i)

    def __repr__(self) -> str:
        return f"StepList({len(self)} steps)"


@dataclass
class SampleColumns:
    """One rank's samples.jsonl as columns (NaN where a sample lacks the value), in file order.

    ``cpu_*``/``iow_*`` are the mean and the maximum over the logical CPUs of each node sample;
    ``gpus[index][key]`` holds the raw GPU keys of the sampler (``u`` utilization, ``mu``/``mt``
    memory used/total, ``p`` power, ...). Node-wide columns are NaN in process-only samples."""

    t_ns: array[int] = field(default_factory=lambda: array("q"))
    pcpu: array[float] = field(default_factory=lambda: array("d"))
    rss: array[float] = field(default_factory=lambda: array("d"))
    cpu_mean: array[float] = field(default_factory=lambda: array("d"))
    cpu_max: array[float] = field(default_factory=lambda: array("d"))
    iow_mean: array[float] = field(default_factory=lambda: array("d"))
    iow_max: array[float] = field(default_factory=lambda: array("d"))
    mem: array[float] = field(default_factory=lambda: array("d"))
    disk_read: array[float] = field(default_factory=lambda: array("d"))
    disk_write: array[float] = field(default_factory=lambda: array("d"))
    net_rx: array[float] = field(default_factory=lambda: array("d"))
    net_tx: array[float] = field(default_factory=lambda: array("d"))
    throttled: array[float] = field(default_factory=lambda: array("d"))
    container_memory: array[float] = field(default_factory=lambda: array("d"))
    """The container's working set (bytes)."""
    container_limit: array[float] = field(default_factory=lambda: array("d"))
    """The container's memory limit (bytes; NaN: none)."""
    cores: int = 0
    """Most logical CPUs seen in a node sample."""
    core_busy_sum: list[float] = field(default_factory=list)
    """Per logical CPU: busy ratio summed over the node samples (divide by ``node_samples``)."""
    node_samples: int = 0
    gpus: dict[str, dict[str, array[float]]] = field(default_factory=dict)
    skipped_lines: int = 0
    _layouts: dict[str, tuple[tuple[str, ...], list[array[float]]]] = field(default_factory=dict, repr=False)
    """Per GPU: its last sample's keys and their columns (parsing shortcut)."""

    def __len__(self) -> int:
        return len(self.t_ns)


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
        if self._sample_columns is None:
            self._sample_columns = _parse_samples(self.path / schema.SAMPLES)
            self._skipped(schema.SAMPLES, self._sample_columns.skipped_lines)
        return self._sample_columns

    def spans(self) -> Iterator[Span]:
        """Spans of spans.jsonl (corrupt lines are skipped and counted in ``skipped_lines``)."""
        bad = 0
        try:
            for line in _lines(self.path / schema.SPANS):
                try:
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
        """Raw telemetry samples of samples.jsonl (format in :mod:`otelprof.recording.schema`)."""
        bad = 0
        try:
            for line in _lines(self.path / schema.SAMPLES):
                try:
                    sample = json.loads(line)
                    int(sample["t"])
                except (ValueError, KeyError, TypeError):
                    bad += 1
                    continue
                yield sample
        finally:
            self._skipped(schema.SAMPLES, bad)

    def profiles(self) -> Iterator[dict[str, Any]]:
        """Operator-profiling windows of profiles.jsonl (top operators, activity and precision mixes)."""
        bad = 0
        try:
            for line in _lines(self.path / schema.PROFILES):
                try:
                    record = dict(json.loads(line))
                except (ValueError, TypeError):
                    bad += 1
                    continue
                yield record
        finally:
            self._skipped(schema.PROFILES, bad)

    def last_metric_snapshot(self, max_bytes: int = 64 * 2**20) -> Any | None:
        """The newest readable ExportMetricsServiceRequest of metrics.jsonl (each line is a full snapshot
        of the process's metrics), read from the end of the file; None when there is none."""
        try:
            with open(self.path / schema.METRICS, "rb") as handle:
                end = handle.seek(0, os.SEEK_END)
                chunk, tried, bad = 1 << 20, 0, 0
                while True:
                    start = max(end - chunk, 0)
                    handle.seek(start)
                    lines = [raw for raw in handle.read(end - start).split(b"\n") if raw.strip()]
                    if start > 0:
                        lines = lines[1:]  # may be the tail of a longer line
                    for raw in reversed(lines[:len(lines) - tried]):
                        tried += 1
                        try:
                            return otlp_json.parse_metrics(raw.decode("utf-8", errors="replace"))
                        except Exception:
                            bad += 1
                            self._skipped(schema.METRICS, bad)
                    if start == 0 or chunk >= max_bytes:
                        return None
                    chunk *= 4
        except OSError:
            return None

    def metric_snapshots(self) -> Iterator[Any]:
        """ExportMetricsServiceRequest messages of metrics.jsonl, oldest first."""
        bad = 0
        try:
            for line in _lines(self.path / schema.METRICS):
                try:
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


_STR = r'"(?:[^"\\\n]|\\.)*"'
_STEP_LINE = re.compile(
    r'^(?:\{"k":"s","ph":(' + _STR + r'),"n":(-?\d+),"t":(-?\d+),"d":(-?\d+)'
    r'(?:,"a":\[([^\n]*)\])?(?:,"x":\{([^\n]*)\})?'
    r'(?:,"err":(' + _STR + r'))?\}|(.+))$', re.M)
"""A step line exactly as the recorder writes it (groups: phase, number, start, duration, annotations,
scalars, error), or any other line (last group)."""


def read_rank(path: Path) -> RankRecording:
    """Parse one rank directory (``rank-<n>/``)."""
    rank = RankRecording(Path(path), _check_manifest(Path(path)))
    steps = rank.path / schema.STEPS
    if not steps.exists():
        return rank
    text = steps.read_text(encoding="utf-8", errors="replace")
    if not _read_steps_fast(rank, text):
        rank.step_columns = StepColumns()
        rank.annotations.clear()
        rank.scalars.clear()
        rank.phases.clear()
        rank.device_times.clear()
        rank.skipped_lines = 0
        for line in text.splitlines():
            line = line.strip()
            if line:
                _parse_line(line, rank)
    return rank


def _parse_line(line: str, rank: RankRecording) -> None:
    try:
        _parse_step_line(json.loads(line), rank)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        rank.skipped_lines += 1


def _read_steps_fast(rank: RankRecording, text: str) -> bool:
    """Columns straight from the recorder's own line format, in bulk; False when a line needs the slow path."""
    rows = _STEP_LINE.findall(text)
    fast = []
    for row in rows:
        if not row[7]:
            fast.append(row)
            continue
        line = row[7].strip()
        if not line:
            continue
        if line.startswith('{"k":"s"') or line.startswith('{"k": "s"'):
            if _is_json(line):
                return False  # a step in another layout: keep file order, parse every line as JSON
            rank.skipped_lines += 1
            continue
        _parse_line(line, rank)
    if not fast:
        return True
    try:
        return _fill_columns(rank.step_columns, fast)
    except (ValueError, KeyError, TypeError, IndexError):
        return False


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _fill_columns(c: StepColumns, rows: list[tuple[str, ...]]) -> bool:
    phases, numbers, starts, durations, annotations, scalars, errors, _ = zip(*rows)
    phase_codes = {token: c.code(c.phase_names, str(json.loads(token))) for token in dict.fromkeys(phases)}
    c.phase = array("I", map(phase_codes.__getitem__, phases))
    c.number = array("q", map(int, numbers))
    c.start_ns = array("q", map(int, starts))
    c.duration_ns = array("q", map(int, durations))
    # Annotations "[name,offset,duration,depth],...": without backslashes every quote delimits a name,
    # so quotes / 2 counts them; names holding "," or "],[" change the token count and fail the check.
    joined = ",".join(filter(None, annotations))
    if "\\" in joined:
        return False
    counts = [body.count('"') >> 1 for body in annotations]
    total = sum(counts)
    if total:
        tokens = joined[1:-1].replace("],[", ",").split(",")
        if len(tokens) != 4 * total:
            return False
        names = tokens[0::4]
        codes = {}
        for token in dict.fromkeys(names):  # codes in order of first appearance
            if len(token) < 2 or token[0] != '"' or token[-1] != '"':
                return False
            codes[token] = c.code(c.ann_names, str(json.loads(token)))
        c.ann_name = array("I", map(codes.__getitem__, names))
        c.ann_offset = array("q", map(int, tokens[1::4]))
        c.ann_duration = array("q", map(int, tokens[2::4]))
        c.ann_depth = array("i", map(int, tokens[3::4]))
    c.ann_index = array("q", [0])
    c.ann_index.extend(accumulate(counts))
    # Scalars '"name":value,...' (non-finite values as strings "nan", "inf").
    joined = ",".join(filter(None, scalars))
    if "\\" in joined:
        return False
    counts = [body.count('":') for body in scalars]
    total = sum(counts)
    if total:
        tokens = joined.replace('":', '",').split(",")
        if len(tokens) != 2 * total:
            return False
        names = tokens[0::2]
        codes = {}
        for token in dict.fromkeys(names):  # codes in order of first appearance
            if len(token) < 2 or token[0] != '"' or token[-1] != '"':
                return False
            codes[token] = c.code(c.scalar_names, str(json.loads(token)))
        values = tokens[1::2]
        c.scalar_name = array("I", map(codes.__getitem__, names))
        c.scalar_value = array("d", map(float, (v.strip('"') for v in values) if '"' in ",".join(values) else values))
    c.scalar_index = array("q", [0])
    c.scalar_index.extend(accumulate(counts))
    if any(errors):
        c.errors = {i: str(json.loads(e)) for i, e in enumerate(errors) if e}
    return True


def _parse_step_line(data: dict[str, Any], rank: RankRecording) -> None:
    kind = data["k"]
    if kind == schema.KIND_STEP:
        annotations = [(str(name), int(offset), int(dur), int(depth)) for name, offset, dur, depth in data.get("a", ())]
        scalars = {str(k): float(v) for k, v in data.get("x", {}).items()}
        rank.step_columns.append(str(data["ph"]), int(data["n"]), int(data["t"]), int(data["d"]), annotations,
                                 scalars, data.get("err"))
    elif kind == schema.KIND_ANNOTATION:
        rank.annotations.append(Annotation(str(data["name"]), int(data["t"]), int(data["d"]), 0, data.get("ph")))
    elif kind == schema.KIND_SCALAR:
        rank.scalars.append((int(data["t"]), str(data["ph"]), str(data["name"]), float(data["v"])))
    elif kind == schema.KIND_PHASE:
        rank.phases.append((int(data["t"]), str(data["ph"])))
    elif kind == schema.KIND_DEVICE:
        number = int(data["n"]) if data.get("n") is not None else None
        rank.device_times.extend([DeviceTime(str(data["ph"]), number, str(name), int(duration))
                                  for name, duration in data["a"]])
    else:
        raise ValueError(f"unknown record kind {kind!r}")


_PROCESS_SAMPLE = re.compile(r'^(?:\{"t":(\d+),"pid":\d+(?:,"pcpu":([-+0-9.eE]+))?(?:,"rss":(\d+))?\}|(.+))$', re.M)
"""A sample line of a rank that does not sample the node (groups: time, process CPU, RSS), or any other line."""


def _parse_samples(path: Path) -> SampleColumns:
    c = SampleColumns()
    if not path.exists():
        return c
    text = path.read_text(encoding="utf-8", errors="replace")
    rows = _PROCESS_SAMPLE.findall(text)
    if rows and not any(row[3] for row in rows):  # only process samples: in bulk
        times, pcpu, rss, _ = zip(*rows)
        n = len(rows)
        c.t_ns = array("q", map(int, times))
        c.pcpu = array("d", (float(v) if v else math.nan for v in pcpu))
        c.rss = array("d", (float(v) if v else math.nan for v in rss))
        for column in (c.cpu_mean, c.cpu_max, c.iow_mean, c.iow_max, c.mem, c.disk_read, c.disk_write, c.net_rx,
                       c.net_tx, c.throttled, c.container_memory, c.container_limit):
            column.extend(array("d", [math.nan]) * n)
        return c
    for line in text.splitlines():
        line = line.strip()
        if line:
            _add_sample(c, line)
    n = len(c.t_ns)
    for columns in c.gpus.values():
        for column in columns.values():
            if len(column) < n:
                column.extend(array("d", [math.nan]) * (n - len(column)))
    return c


def _add_sample(c: SampleColumns, line: str) -> None:
    try:
        sample = json.loads(line)
        t = int(sample["t"])
    except (ValueError, KeyError, TypeError):
        c.skipped_lines += 1
        return
    nan = math.nan
    n = len(c.t_ns)
    try:
        get = sample.get
        c.t_ns.append(t)
        c.pcpu.append(get("pcpu", nan))
        c.rss.append(get("rss", nan))
        c.mem.append(get("mem", nan))
        c.throttled.append(get("thr", nan))
        c.container_memory.append(get("cws", nan))
        c.container_limit.append(get("cml", nan))
        cpu = get("cpu")
        if cpu:
            c.cpu_mean.append(sum(cpu) / len(cpu))
            c.cpu_max.append(max(cpu))
            c.node_samples += 1
            if len(cpu) > c.cores:
                c.core_busy_sum.extend([0.0] * (len(cpu) - c.cores))
                c.cores = len(cpu)
            c.core_busy_sum[:len(cpu)] = map(operator.add, c.core_busy_sum, cpu)
        else:
            c.cpu_mean.append(nan)
            c.cpu_max.append(nan)
        iow = get("iow")
        c.iow_mean.append(sum(iow) / len(iow) if iow else nan)
        c.iow_max.append(max(iow) if iow else nan)
        disk = get("disk") or (nan, nan)
        c.disk_read.append(disk[0])
        c.disk_write.append(disk[1])
        net = get("net") or (nan, nan)
        c.net_rx.append(net[0])
        c.net_tx.append(net[1])
        layouts = c._layouts
        for index, entry in (get("gpu") or {}).items():
            layout = layouts.get(index)
            if layout is not None and layout[0] == tuple(entry) and len(layout[1][0]) == n:
                for column, value in zip(layout[1], entry.values()):  # same keys as last time: no lookups
                    column.append(value)
                continue
            columns = c.gpus.get(index)
            if columns is None:
                columns = c.gpus[str(index)] = {}
            if entry:
                layouts[index] = (tuple(entry), [columns.setdefault(key, array("d", [nan]) * n) for key in entry])
            for key, value in entry.items():
                found = columns.get(key)
                if found is None:
                    column = columns[key] = array("d", [nan]) * n
                else:
                    column = found
                    if len(column) < n:
                        column.extend(array("d", [nan]) * (n - len(column)))
                column.append(value)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, ZeroDivisionError, OverflowError):
        c.skipped_lines += 1
        del c.t_ns[n:]
        for values in (c.pcpu, c.rss, c.mem, c.throttled, c.container_memory, c.container_limit, c.cpu_mean,
                       c.cpu_max, c.iow_mean, c.iow_max, c.disk_read, c.disk_write, c.net_rx, c.net_tx,
                       *(col for cols in c.gpus.values() for col in cols.values())):
            del values[n:]


def read_recording(path: str | Path, *, samples: bool = False, workers: int | None = None,
                   progress: Callable[[int, int], None] | None = None, regions: bool = False) -> Recording:
    """Parse a run directory (``<run-id>/`` with ``rank-*/``) or a single rank directory.

    ``samples`` also parses every rank's samples.jsonl into :meth:`RankRecording.sample_columns`;
    ``regions`` also totals each rank's regions (:meth:`StepColumns.summarize_regions`) while parsing.
    Large recordings are parsed by ``workers`` processes (default: one per CPU when the files add up
    to more than 64 MiB); ``progress(done_bytes, total_bytes)`` is called as files are done."""
    root = Path(path)
    if not root.is_dir():
        raise RecordingError(f"{root} is not a directory")
    if (root / schema.MANIFEST).exists():
        rank_dirs = [root]
    else:
        rank_dirs = sorted((p for p in root.glob("rank-*") if p.is_dir()), key=lambda p: _rank_number(p.name))
        if not rank_dirs:
            raise RecordingError(f"{root} holds no rank-*/ directories: not an otelprof recording")
    steps_job = "steps+regions" if regions else "steps"
    jobs = [(p, kind) for p in rank_dirs for kind in ((steps_job, "samples") if samples else (steps_job,))]
    sizes = {job: _size(job[0] / (schema.SAMPLES if job[1] == "samples" else schema.STEPS)) for job in jobs}
    total = sum(sizes.values())
    if workers is None:
        workers = min(os.cpu_count() or 1, len(jobs)) if total > PARALLEL_BYTES else 1
    if "fork" not in _start_methods():
        workers = 1
    results: dict[tuple[Path, str], Any] = {}
    done = 0
    if workers <= 1:
        for job in jobs:
            results[job] = _job(job)
            done += sizes[job]
            if progress is not None:
                progress(done, total)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = {pool.submit(_job, job): job for job in sorted(jobs, key=lambda j: -sizes[j])}
            for future in as_completed(futures):
                job = futures[future]
                results[job] = future.result()
                done += sizes[job]
                if progress is not None:
                    progress(done, total)
    ranks = []
    for p in rank_dirs:
        rank: RankRecording = results[(p, steps_job)]
        if samples:
            rank._sample_columns = results[(p, "samples")]
            rank._skipped(schema.SAMPLES, rank._sample_columns.skipped_lines)
        ranks.append(rank)
    return Recording(root, ranks)


PARALLEL_BYTES = 64 * 2**20
"""Recordings larger than this are parsed by several processes."""


def _job(job: tuple[Path, str]) -> Any:
    path, kind = job
    if kind == "samples":
        return _parse_samples(path / schema.SAMPLES)
    rank = read_rank(path)
    if kind == "steps+regions":
        rank.step_columns.summarize_regions()
    return rank


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _start_methods() -> list[str]:
    import multiprocessing

    return list(multiprocessing.get_all_start_methods())


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
