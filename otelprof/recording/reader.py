"""The only parser of run recordings. Tolerant of a killed writer and safe on hostile files: a
truncated, corrupt or oversized line is skipped and counted, never fatal; a manifest that is not what
the writer writes, an unknown schema major version, or a recording file that is not a regular file is
a :class:`RecordingError` (one line for the user).

Limits (a line or value past them is skipped and counted in ``skipped_lines``; time and memory of a
read stay proportional to the data kept, whatever the files hold):

* files are read in blocks of at most a line's limit, a line longer than :data:`MAX_LINE_BYTES` of
  its file is skipped without being held whole; manifest.json is at most :data:`MAX_MANIFEST_BYTES`;
* JSON nested deeper than the interpreter's recursion limit, integers outside 64 bits and numbers
  that overflow a double (``1e400``) make a line unreadable;
* strings (phase, region, scalar, error, operator names) hold at most :data:`MAX_STRING_CHARS`
  characters; a step at most :data:`MAX_STEP_REGIONS` regions and :data:`MAX_STEP_SCALARS` scalars;
  a rank at most :data:`MAX_NAMES` distinct phase, region and scalar names each (a line bringing one
  more is skipped); times lie in 0..:data:`MAX_TIME_NS`, durations in 0..:data:`MAX_DURATION_NS`;
* a sample at most :data:`MAX_CORES` per-CPU values and, per rank, :data:`MAX_GPUS` GPUs of at most
  :data:`MAX_GPU_KEYS` values; an operator-profiling window at most :data:`MAX_PROFILE_ENTRIES`
  operators and mix entries per list.
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
import stat
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain, compress, repeat
from pathlib import Path
from typing import IO, Any, overload

from otelprof.recording import otlp_json, schema


class RecordingError(Exception):
    """The path is not a recording otelprof can read (the message is one line, fit for the user)."""


MAX_LINE_BYTES = {schema.STEPS: 2**20, schema.SAMPLES: 2**20, schema.PROFILES: 4 * 2**20,
                  schema.SPANS: 16 * 2**20, schema.METRICS: 16 * 2**20}
"""Longest line read per file (bytes, without the newline): a step with the recorder's 4,096 regions
of 100-character names takes about 0.5 MiB; an OTLP metrics snapshot of a large job a few MiB."""
MAX_MANIFEST_BYTES = 2**20
"""Largest manifest.json (the writer's is a few KiB)."""
MAX_STRING_CHARS = 4096
"""Longest name or other string value (CUDA kernel names in profiles reach a few hundred)."""
MAX_NAMES = 10_000
"""Distinct phase, region and scalar names per rank (each)."""
MAX_STEP_REGIONS = 4096
"""Regions in one step record: what the recorder keeps (``otelprof.runtime.hotpath.MAX_STEP_ANNOTATIONS``)."""
MAX_STEP_SCALARS = 1024
"""Scalars in one step record."""
MAX_TIME_NS = 2**62
"""Latest Unix time in nanoseconds (year 2116)."""
MAX_DURATION_NS = 2**50
"""Longest duration in nanoseconds (13 days): sums of a step's regions stay within 64 bits."""
MAX_CORES = 4096
"""Per-CPU values in one sample."""
MAX_GPUS = 64
"""GPUs per rank (distinct indexes in its samples)."""
MAX_GPU_KEYS = 64
"""Values per GPU in a sample."""
MAX_PROFILE_ENTRIES = 1000
"""Operators (and activity or precision entries) per list of an operator-profiling window."""
INT64 = 2**63 - 1


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number out of range: {text[:40]}")
    return value


def _int64(text: str) -> int:
    if len(text) > 20:
        raise ValueError(f"integer out of range: {text[:40]}")
    value = int(text)
    if not -INT64 - 1 <= value <= INT64:
        raise ValueError(f"integer out of range: {text}")
    return value


_decoder = json.JSONDecoder(parse_float=_finite, parse_int=_int64)
_plain = json.JSONDecoder()


_LONE_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                             r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")
"""A \\u escape of half a surrogate pair: it would decode to a string that cannot be written as UTF-8."""


def loads(text: str, exact: bool = True) -> Any:
    """JSON as the reader accepts it: integers within 64 bits, numbers that fit a double (NaN and
    Infinity only spelled so), strings that are text (no lone surrogate), nesting within the
    recursion limit; ValueError otherwise. ``exact=False`` leaves the numbers to the caller's checks
    (the json module's own number parsing, several times faster on lines of many numbers)."""
    if "\\u" in text and _LONE_SURROGATE.search(text):
        raise ValueError("a string holds half a surrogate pair")
    try:
        return _decoder.decode(text) if exact else _plain.decode(text)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc


def _int(value: Any, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"not an integer from {low} to {high}: {value!r:.40}")
    return value


def _str(value: Any) -> str:
    if type(value) is not str or len(value) > MAX_STRING_CHARS:
        raise ValueError(f"not a string of at most {MAX_STRING_CHARS} characters: {value!r:.40}")
    return value


def _number(value: Any) -> float:
    """A scalar's value: a number, or one written as a string ("nan", "inf", as the recorder does)."""
    kind = type(value)
    if kind is float:
        return value  # type: ignore[no-any-return]
    if kind is int:
        return float(value)
    if kind is str and len(value) <= 64:
        return float(value)
    raise ValueError(f"not a number: {value!r:.40}")


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


def group_indexes(codes: Iterable[int]) -> dict[int, list[int]]:
    """Per code: the positions where it occurs in ``codes``, in order (one pass)."""
    groups: dict[int, list[int]] = {}
    for i, code in enumerate(codes):
        found = groups.get(code)
        if found is None:
            groups[code] = [i]
        else:
            found.append(i)
    return groups


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

    def code(self, names: list[str], name: str) -> int:
        """Code of ``name`` in ``names`` (one of the three name lists), added when new."""
        index = self._index(names)
        found = index.get(name)
        if found is None:
            found = index[name] = len(names)
            names.append(name)
        return found

    def _index(self, names: list[str]) -> dict[str, int]:
        """Name -> code of one of the name lists (rebuilt if the list was changed from outside)."""
        indexes: dict[int, tuple[list[str], dict[str, int]]] = self.__dict__.setdefault("_indexes", {})
        entry = indexes.get(id(names))
        if entry is None or entry[0] is not names or len(entry[1]) != len(names):
            entry = indexes[id(names)] = (names, {name: i for i, name in enumerate(names)})
        return entry[1]

    def room(self, names: list[str], new: Iterator[str] | Sequence[str]) -> bool:
        """Whether ``names`` can take the names of ``new`` it lacks and stay within :data:`MAX_NAMES`."""
        index = self._index(names)
        return len(names) + len(set(n for n in new if n not in index)) <= MAX_NAMES

    def append(self, phase: str, number: int, start_ns: int, duration_ns: int,
               annotations: Sequence[tuple[str, int, int, int]] = (), scalars: dict[str, float] | None = None,
               error: str | None = None) -> None:
        """Add one step; annotations as (name, offset from the step start, duration, depth).

        ValueError, before anything changes, when the step would bring a name list past MAX_NAMES."""
        scalars = scalars or {}
        if not (self.room(self.phase_names, (phase,)) and self.room(self.ann_names, [a[0] for a in annotations])
                and self.room(self.scalar_names, list(scalars))):
            raise ValueError(f"more than {MAX_NAMES} distinct names")
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
        for key, value in scalars.items():
            self.scalar_name.append(self.code(self.scalar_names, key))
            self.scalar_value.append(value)
        self.scalar_index.append(len(self.scalar_name))

    def extend(self, other: StepColumns) -> bool:
        """Append the steps of ``other`` (read from a later part of the file); False, changing nothing,
        when that would bring a name list past MAX_NAMES."""
        if not (self.room(self.phase_names, other.phase_names) and self.room(self.ann_names, other.ann_names)
                and self.room(self.scalar_names, other.scalar_names)):
            return False
        if not len(self) and not self.phase_names and not self.ann_names and not self.scalar_names:
            self.__dict__.clear()
            self.__dict__.update({k: v for k, v in other.__dict__.items() if not k.startswith("_")})
            return True

        def remap(names: list[str], other_names: list[str], codes: array[int]) -> array[int]:
            table = [self.code(names, name) for name in other_names]
            if table == list(range(len(table))):
                return codes
            return array("I", map(table.__getitem__, codes))

        base = len(self)
        self.phase.extend(remap(self.phase_names, other.phase_names, other.phase))
        self.number.extend(other.number)
        self.start_ns.extend(other.start_ns)
        self.duration_ns.extend(other.duration_ns)
        offset = self.ann_index[-1]
        self.ann_index.extend(array("q", map(offset.__add__, other.ann_index[1:])))
        self.ann_name.extend(remap(self.ann_names, other.ann_names, other.ann_name))
        self.ann_offset.extend(other.ann_offset)
        self.ann_duration.extend(other.ann_duration)
        self.ann_depth.extend(other.ann_depth)
        offset = self.scalar_index[-1]
        self.scalar_index.extend(array("q", map(offset.__add__, other.scalar_index[1:])))
        self.scalar_name.extend(remap(self.scalar_names, other.scalar_names, other.scalar_name))
        self.scalar_value.extend(other.scalar_value)
        self.errors.update({base + i: e for i, e in other.errors.items()})
        return True

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
        """Per step: is it of ``phase``. One pass over the steps per call: to go through every phase, use
        :meth:`phase_steps`."""
        code = self._index(self.phase_names).get(phase)
        if code is None:
            return [False] * len(self)
        return list(map(code.__eq__, self.phase))

    def phase_steps(self) -> dict[str, list[int]]:
        """Per phase, in the order of :attr:`phase_names`: the indexes of its steps in file order. One pass over
        the steps for all phases, kept: an analysis that goes through the phases costs steps + phases, not steps
        times phases (a run that names a phase per step)."""
        found: tuple[int, int, dict[str, list[int]]] | None = self.__dict__.get("_phase_steps")
        if found is None or found[0] != len(self) or found[1] != len(self.phase_names):
            groups = group_indexes(self.phase)
            found = self.__dict__["_phase_steps"] = (len(self), len(self.phase_names), {
                name: groups[code] for code, name in enumerate(self.phase_names) if code in groups})
        return found[2]

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

    def repeats(self) -> frozenset[int]:
        """Indexes of the annotations inside an annotation of the same name of their step (a user's
        ``annotate("backward")`` around the hooks' own ``backward``): the same time again, counted once, as the
        outer region (:mod:`otelprof.shared.nesting`). Empty unless a name occurs at two depths."""
        found: tuple[int, frozenset[int]] | None = self.__dict__.get("_repeats")
        if found is not None and found[0] == len(self.ann_name):
            return found[1]
        shallowest: dict[int, int] = {}
        deeper: set[int] = set()
        for code, level in zip(self.ann_name, self.ann_depth):
            first = shallowest.setdefault(code, level)
            if level != first:
                deeper.add(code)
                shallowest[code] = min(first, level)
        out = set()
        if deeper:
            steps, codes, offsets, durations, depths = (self._step_of(self.ann_index), self.ann_name,
                                                        self.ann_offset, self.ann_duration, self.ann_depth)
            for j, code in enumerate(codes):
                if code not in deeper or depths[j] == shallowest[code]:
                    continue
                start, end, level = offsets[j], offsets[j] + durations[j], depths[j]
                for i in range(self.ann_index[steps[j]], self.ann_index[steps[j] + 1]):
                    if (codes[i] == code and depths[i] < level and offsets[i] <= start
                            and end <= offsets[i] + durations[i]):
                        out.add(j)
                        break
        result = frozenset(out)
        self.__dict__["_repeats"] = (len(self.ann_name), result)
        return result

    def summarize_regions(self) -> None:
        """Total the regions by name and per step in one pass (cached for region_totals and annotation_sums);
        a region inside one of its own name is not counted again (:meth:`repeats`)."""
        k, n = len(self.ann_names), len(self)
        count, total, longest, depth = [0] * k, [0] * k, [0] * k, [1 << 30] * k
        sums = [array("q", bytes(8 * n)) for _ in range(k)]
        skip = self.repeats()
        for j, (step, code, duration, level) in enumerate(zip(self._step_of(self.ann_index), self.ann_name,
                                                              self.ann_duration, self.ann_depth)):
            if skip and j in skip:
                continue
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
        """Per step: nanoseconds in annotations called ``name`` (all depths, one inside another of the same name
        not counted again)."""
        cached = self.__dict__.get("_sums")
        if (cached is not None and name in cached and len(cached[name]) == len(self)) or self.repeats():
            if cached is None or name not in cached or len(cached[name]) != len(self):
                self.summarize_regions()
                cached = self.__dict__["_sums"]
            return array("q", cached[name]) if name in cached else array("q", bytes(8 * len(self)))
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
        """Raw telemetry samples of samples.jsonl (format in :mod:`otelprof.recording.schema`)."""
        bad = 0
        try:
            for line in _lines(self.path / schema.SAMPLES):
                try:
                    if line is None:
                        raise ValueError("line too long")
                    sample = loads(line)
                    _int(sample["t"], 0, MAX_TIME_NS)
                except (ValueError, KeyError, TypeError):
                    bad += 1
                    continue
                yield sample
        finally:
            self._skipped(schema.SAMPLES, bad)

    def profiles(self) -> Iterator[dict[str, Any]]:
        """Operator-profiling windows of profiles.jsonl (top operators, activity and precision mixes), each
        checked against the format the writer uses (a record that is not is skipped and counted)."""
        bad = 0
        try:
            for line in _lines(self.path / schema.PROFILES):
                try:
                    if line is None:
                        raise ValueError("line too long")
                    record = _profile(loads(line))
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
            with _open_regular(self.path / schema.METRICS) as handle:
                for raw in _lines_backwards(handle, MAX_LINE_BYTES[schema.METRICS]):
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
            for line in _lines(self.path / schema.METRICS):
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


def _seconds(value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r:.40}")
    return float(value)


def _entries(value: Any, kind: type) -> Any:
    if value is None:
        return kind()
    if type(value) is not kind or len(value) > MAX_PROFILE_ENTRIES:  # type: ignore[arg-type]
        raise ValueError(f"not a {kind.__name__} of at most {MAX_PROFILE_ENTRIES} entries")
    return value


def _profile(record: Any) -> dict[str, Any]:
    """An operator-profiling window record as the writer makes it (integrations/torch_profiler.py)."""
    if type(record) is not dict:
        raise ValueError("not an object")
    trace = record.get("trace_file")
    out: dict[str, Any] = {
        "start_step": _int(record.get("start_step", 0), -INT64 - 1, INT64),
        "num_steps": _int(record.get("num_steps", 0), 0, INT64),
        "t": _int(record.get("t", 0), 0, MAX_TIME_NS), "d": _int(record.get("d", 0), 0, MAX_DURATION_NS),
        "trace_file": _str(trace) if trace else None}
    for key in ("cpu_ops", "gpu_ops"):
        out[key] = [{"name": _str(op["name"]), "calls": _int(op.get("calls", 0), 0, INT64),
                     "self_s": _seconds(op.get("self_s", 0.0)), "total_s": _seconds(op.get("total_s", 0.0))}
                    for op in _entries(record.get(key), list)]
    for key in ("gpu_activity_s", "kernel_precision_s"):
        out[key] = {_str(name): _seconds(seconds) for name, seconds in _entries(record.get(key), dict).items()}
    for key in ("phase", "trigger"):
        if record.get(key) is not None:
            out[key] = _str(record[key])
    for key in ("operator_spans", "operator_spans_dropped"):
        if key in record:
            out[key] = _int(record[key], 0, INT64)
    if "overhead_s" in record:
        out["overhead_s"] = _seconds(record["overhead_s"])
    if record.get("truncated") is not None:
        out["truncated"] = _str(record["truncated"])
    if "segment" in record:
        out["segment"] = _int(record["segment"], 0, INT64)
    if record.get("events") is not None:  # the window's event cap and what it kept (torch_profiler.py)
        out["events"] = {key: _int(value, 0, INT64) if key != "per_step" else _seconds(value)
                         for key, value in _entries(record["events"], dict).items()
                         if key in ("kept", "dropped", "max", "heap_growth_bytes", "per_step")}
    if record.get("cost") is not None:  # the window's cost to training by part (sums to overhead_s)
        out["cost"] = {key: _seconds(value) for key, value in _entries(record["cost"], dict).items()
                       if key in ("steps_s", "flop_step_s", "processing_s")}
    if record.get("operators") is not None:
        out["operators"] = _operators(record["operators"])
    if record.get("flops") is not None:
        out["flops"] = _flops(record["flops"])
    return out


def _flops(figures: Any) -> dict[str, Any]:
    """A window's model FLOPs (integrations/flops.py ``figures``)."""
    if type(figures) is not dict:
        raise ValueError("flops: not an object")
    out: dict[str, Any] = {"per_step": _seconds(figures["per_step"])}
    for key in ("achieved", "peak", "utilization"):
        if figures.get(key) is not None:
            out[key] = _seconds(figures[key])
    for key in ("device", "dtype", "gpu_model"):
        if figures.get(key) is not None:
            out[key] = _str(figures[key])
    return out


def _operators(summary: Any) -> dict[str, Any]:
    """A window's operator and kernel statistics (integrations/operators.py ``window_summary``)."""
    if type(summary) is not dict:
        raise ValueError("operators: not an object")
    out: dict[str, Any] = {}
    for key in ("ops", "kernels"):
        out[key] = [{"name": _str(row["name"]), "self_s": _seconds(row.get("self_s", 0.0)),
                     "total_s": _seconds(row.get("total_s", 0.0)), "calls": _int(row.get("calls", 0), 0, INT64),
                     "launches": _int(row.get("launches", 0), 0, INT64)}
                    for row in _entries(summary.get(key), list)]
    for key in ("host_op_s", "device_op_s"):
        out[key] = _seconds(summary.get(key, 0.0))
    categories = _entries(summary.get("categories_s"), dict)
    out["categories_s"] = {_str(side): {_str(name): _seconds(seconds)
                                        for name, seconds in _entries(table, dict).items()}
                           for side, table in categories.items()}
    out["kernel_precision_s"] = {_str(name): _seconds(seconds)
                                 for name, seconds in _entries(summary.get("kernel_precision_s"), dict).items()}
    out["device_kinds_s"] = {_str(name): _seconds(seconds)
                             for name, seconds in _entries(summary.get("device_kinds_s"), dict).items()}
    for key in ("operators", "device_events"):
        out[key] = _int(summary.get(key, 0), 0, INT64)
    overlap = _entries(summary.get("overlap"), dict)
    if overlap:
        out["overlap"] = {key: _seconds(overlap[key]) for key in
                          ("communication_s", "overlapped_s", "exposed_s", "compute_s", "overlap_ratio")}
    memory = _entries(summary.get("memory"), dict)
    if memory:
        out["memory"] = {
            "top": [{"device": _str(row["device"]), "name": _str(row["name"]),
                     "bytes": _int(row.get("bytes", 0), 0, INT64), "allocations": _int(row.get("allocations", 0), 0,
                                                                                     INT64)}
                    for row in _entries(memory.get("top"), list)],
            "peak_bytes": {_str(d): _int(v, 0, INT64) for d, v in _entries(memory.get("peak_bytes"), dict).items()},
            "reserved_bytes": {_str(d): _int(v, 0, INT64)
                               for d, v in _entries(memory.get("reserved_bytes"), dict).items()},
            "curve": {_str(d): [(_int(t, 0, MAX_TIME_NS), _int(v, 0, INT64)) for t, v in _entries(points, list)]
                      for d, points in _entries(memory.get("curve"), dict).items()}}
    return out


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


def _open_regular(path: Path) -> IO[bytes]:
    """``path`` opened for reading; OSError when it is not a regular file (a directory, or a FIFO or
    device, which could block or never end)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
            raise OSError(f"not a regular file ({kind})")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) if exc.errno is not None else str(exc)


def _check_file(path: Path) -> None:
    """RecordingError when ``path`` is there but is not a readable regular file."""
    if not os.path.lexists(path):
        return
    try:
        with _open_regular(path):
            pass
    except OSError as exc:
        raise RecordingError(f"cannot read {path}: {_reason(exc)}") from exc


def _blocks(path: Path, max_line: int) -> Iterator[tuple[str, int]]:
    """The lines of ``path`` a block at a time: (text of whole lines, lines longer than ``max_line`` bytes
    skipped since the previous block). Reads at most ``max_line`` bytes at a time and never holds a
    longer line; stops at the size the file had when opened (a live recording keeps growing). The
    text's last line may lack its newline (the file ends inside a line: a killed writer)."""
    with _open_regular(path) as handle:
        remaining = os.fstat(handle.fileno()).st_size
        head = b""  # the start of a line that began in the previous block (at most max_line bytes)
        skipping = False  # inside a line already longer than max_line
        over = 0
        while remaining > 0:
            block = handle.read(min(max_line, remaining))
            if not block:
                break
            remaining -= len(block)
            first = b""
            start = 0
            if head or skipping:
                newline = block.find(b"\n")
                if newline < 0:
                    if not skipping and len(head) + len(block) > max_line:
                        head, skipping, over = b"", True, over + 1
                    elif not skipping:
                        head += block
                    continue
                if not skipping:
                    if len(head) + newline > max_line:
                        over += 1
                    else:
                        first = head + block[:newline + 1]
                head, skipping, start = b"", False, newline + 1
            cut = block.rfind(b"\n", start)
            body = block[start:cut + 1] if cut >= 0 else b""
            head = block[cut + 1:] if cut >= 0 else block[start:]
            text = first + body
            if text or over:
                yield text.decode("utf-8", errors="replace"), over
                over = 0
        if head and not skipping:
            yield head.decode("utf-8", errors="replace"), over
        elif over:
            yield "", over


def _lines_backwards(handle: IO[bytes], max_line: int, chunk: int = 2**20) -> Iterator[bytes | None]:
    """The non-blank lines of a file from its end, newest first; None for each line longer than
    ``max_line`` bytes (never held whole). Reads ``chunk`` bytes at a time."""
    position = os.fstat(handle.fileno()).st_size
    carry = b""  # the line that goes on after the block being read
    skipping = False  # that line is already longer than max_line
    while position > 0:
        start = max(position - chunk, 0)
        handle.seek(start)
        pieces = handle.read(position - start).split(b"\n")
        position = start
        if not skipping:
            carry = pieces[-1] + carry
            if len(carry) > max_line:
                carry, skipping = b"", True
                yield None
        if len(pieces) == 1:
            continue  # no newline here: the line goes on backwards
        if not skipping and carry.strip():
            yield carry
        for piece in reversed(pieces[1:-1]):
            if piece.strip():
                yield piece if len(piece) <= max_line else None
        carry, skipping = pieces[0], len(pieces[0]) > max_line
        if skipping:
            carry = b""
            yield None
    if not skipping and carry.strip():
        yield carry


def _lines(path: Path) -> Iterator[str | None]:
    """Non-blank lines of ``path``, stripped; None for each line longer than its file's limit. Nothing
    when the file is missing or cannot be read."""
    if not os.path.lexists(path):
        return
    try:
        for text, over in _blocks(path, MAX_LINE_BYTES.get(path.name, 2**20)):
            for _ in range(over):
                yield None
            for line in text.split("\n"):
                line = line.strip()
                if line:
                    yield line
    except OSError:
        return


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 2**31


def _is_seconds(value: Any) -> bool:
    return value is None or (type(value) in (int, float) and 0 <= value <= MAX_TIME_NS / 1e9)


def _is_string(value: Any) -> bool:
    return type(value) is str and len(value) <= MAX_STRING_CHARS


_MANIFEST_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "run_id": ("a string", _is_string),
    "status": ("a string", _is_string),
    "otelprof_version": ("a string", _is_string),
    "rank": ("an integer from 0 to 2^31 - 1", _is_count),
    "local_rank": ("an integer from 0 to 2^31 - 1", _is_count),
    "world_size": ("an integer from 0 to 2^31 - 1", _is_count),
    "resource": ("an object", lambda v: type(v) is dict),
    "dropped": ("an object", lambda v: type(v) is dict),
    "config": ("an object", lambda v: type(v) is dict),
    "lifecycle": ("an object", lambda v: type(v) is dict),
}
"""What the writer puts in the manifest and the tools read: a manifest with another type there is not
read (an absent field takes its default)."""
_CONFIG_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "job_name": ("a string", _is_string),
    "outlier_sigma": ("a number from 0 to 1000", lambda v: type(v) in (int, float) and 0 <= v <= 1000),
    "outlier_min_steps": ("an integer from 0 to 2^31 - 1", _is_count),
    "outlier_min_ratio": ("a number from 1 to 100", lambda v: type(v) in (int, float) and 1 <= v <= 100),
    "outlier_min_excess": ("a number from 0 to 3600", lambda v: type(v) in (int, float) and 0 <= v <= 3600),
}


def _check_manifest(path: Path) -> dict[str, Any]:
    """The rank's manifest, checked field by field (RecordingError: the rank cannot be read)."""
    file = path / schema.MANIFEST
    try:
        with _open_regular(file) as handle:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError as exc:
        raise RecordingError(f"{path} has no {schema.MANIFEST}: not an otelprof recording") from exc
    except OSError as exc:
        raise RecordingError(f"cannot read {file}: {_reason(exc)}") from exc
    if len(raw) > MAX_MANIFEST_BYTES:
        raise RecordingError(f"{file} is larger than {MAX_MANIFEST_BYTES // 1024} KiB: not an otelprof manifest")
    try:
        manifest = loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise RecordingError(f"cannot read {file}: {exc}") from exc
    if type(manifest) is not dict:
        raise RecordingError(f"{file} is not a JSON object: not an otelprof manifest")
    version = manifest.get("schema_version", "")
    try:
        major = int(version.split(".")[0]) if _is_string(version) else None
    except ValueError:
        major = None
    if major is None:
        raise RecordingError(f"{file} has no valid schema_version ({str(version)[:40]!r})")
    if major != schema.SCHEMA_MAJOR:
        raise RecordingError(
            f"{path} uses recording schema {version[:40]}; this otelprof reads {schema.SCHEMA_MAJOR}.x — "
            "use a matching otelprof version")
    config, lifecycle = manifest.get("config"), manifest.get("lifecycle")
    checks = [(key, manifest.get(key), what, valid) for key, (what, valid) in _MANIFEST_FIELDS.items()]
    checks += [(f"config.{key}", config.get(key) if type(config) is dict else None, what, valid)
               for key, (what, valid) in _CONFIG_FIELDS.items()]
    checks += [(f"lifecycle.{key}", lifecycle.get(key) if type(lifecycle) is dict else None,
                "a Unix time in seconds", _is_seconds) for key in schema.LIFECYCLE_EVENTS]
    for name, value, what, valid in checks:
        if value is not None and not valid(value):
            raise RecordingError(f"{file}: {name} is not {what} ({_preview(value)})")
    for fields, where in ((_MANIFEST_FIELDS, manifest), (_CONFIG_FIELDS, config if type(config) is dict else {})):
        for key in fields:
            if key in where and where[key] is None:  # null: as if absent (readers take their default)
                del where[key]
    if "lifecycle" in manifest:  # the events the writer records; nothing else is read
        manifest["lifecycle"] = {k: v for k, v in manifest["lifecycle"].items() if k in schema.LIFECYCLE_EVENTS}
    return manifest


def _preview(value: Any) -> str:
    """A short, one-line description of a JSON value for an error message."""
    if isinstance(value, (dict, list)):
        return f"{'an object' if isinstance(value, dict) else 'a list'} of {len(value)}"
    return repr(value)[:40]


_STR = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
_INT = r"-?(?:0|[1-9]\d*)"
_NUM = _INT + r"(?:\.\d+)?(?:[eE][-+]?\d+)?"
_REGION = r"\[" + _STR + "," + _INT + "," + _INT + "," + _INT + r"\]"
_SCALAR = _STR + ":(?:" + _NUM + "|" + _STR + ")"
_STEP_LINE = re.compile(
    r'^(?:\{"k":"s","ph":(' + _STR + r'),"n":(' + _INT + r'),"t":(' + _INT + r'),"d":(' + _INT + ')'
    r'(?:,"a":\[(' + _REGION + "(?:," + _REGION + r')*)\])?(?:,"x":\{(' + _SCALAR + "(?:," + _SCALAR + r')*)\})?'
    r'(?:,"err":(' + _STR + r'))?\}|(.+))$', re.M)
"""A step line exactly as the recorder writes it (groups: phase, number, start, duration, annotations,
scalars, error), or any other line (last group). Every part is unambiguous, so that matching a line
takes time linear in its length whatever it holds."""


def read_rank(path: Path) -> RankRecording:
    """Parse one rank directory (``rank-<n>/``)."""
    path = Path(path)
    rank = RankRecording(path, _check_manifest(path))
    for name in (schema.STEPS, schema.SPANS, schema.METRICS, schema.SAMPLES, schema.PROFILES):
        _check_file(path / name)
    steps = path / schema.STEPS
    if not os.path.lexists(steps):
        return rank
    try:
        for text, over in _blocks(steps, MAX_LINE_BYTES[schema.STEPS]):
            rank.skipped_lines += over
            _read_steps(rank, text)
    except OSError as exc:
        raise RecordingError(f"cannot read {steps}: {_reason(exc)}") from exc
    return rank


_LINE_ERRORS = (ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError)


def _parse_line(line: str, rank: RankRecording) -> None:
    try:
        _parse_step_line(loads(line), rank)
    except _LINE_ERRORS:
        rank.skipped_lines += 1


def _read_steps(rank: RankRecording, text: str) -> None:
    """One block of steps.jsonl: step columns in bulk straight from the recorder's own line format, or,
    when a line needs it, every line of the block as JSON in file order."""
    rows = _STEP_LINE.findall(text)
    fast = []
    other = []
    bad = 0
    for row in rows:
        if not row[7]:
            fast.append(row)
            continue
        line = row[7].strip()
        if not line:
            continue
        if line.startswith('{"k":"s"') or line.startswith('{"k": "s"'):
            if _is_json(line):
                _read_steps_slowly(rank, text)  # a step in another layout: keep file order
                return
            bad += 1
            continue
        other.append(line)
    if fast:
        columns = StepColumns()
        try:
            done = _fill_columns(columns, fast) and rank.step_columns.extend(columns)
        except _LINE_ERRORS:
            done = False
        if not done:
            _read_steps_slowly(rank, text)
            return
    rank.skipped_lines += bad
    for line in other:
        _parse_line(line, rank)


def _read_steps_slowly(rank: RankRecording, text: str) -> None:
    for line in text.split("\n"):
        line = line.strip()
        if line:
            _parse_line(line, rank)


def _is_json(line: str) -> bool:
    try:
        loads(line)
    except ValueError:
        return False
    return True


def _within(values: array[int], low: int, high: int) -> bool:
    return not values or (low <= min(values) and max(values) <= high)


def _fill_columns(c: StepColumns, rows: list[tuple[str, ...]]) -> bool:
    """Columns of the recorder's step lines (into an empty ``c``); False when a value is past the reader's
    limits or the bulk parse cannot be sure of the names (the caller then parses the lines as JSON)."""
    phases, numbers, starts, durations, annotations, scalars, errors, _ = zip(*rows)
    phase_names = {token: _str(loads(token)) for token in dict.fromkeys(phases)}
    if len(phase_names) > MAX_NAMES:
        return False
    phase_codes = {token: c.code(c.phase_names, name) for token, name in phase_names.items()}
    c.phase = array("I", map(phase_codes.__getitem__, phases))
    c.number = array("q", map(int, numbers))
    c.start_ns = array("q", map(int, starts))
    c.duration_ns = array("q", map(int, durations))
    if not (_within(c.start_ns, 0, MAX_TIME_NS) and _within(c.duration_ns, 0, MAX_DURATION_NS)):
        return False
    # Annotations "[name,offset,duration,depth],...": without backslashes every quote delimits a name,
    # so quotes / 2 counts them; names holding "," or "],[" change the token count and fail the check.
    joined = ",".join(filter(None, annotations))
    if "\\" in joined:
        return False
    counts = [body.count('"') >> 1 for body in annotations]
    total = sum(counts)
    if total:
        if max(counts) > MAX_STEP_REGIONS:
            return False
        tokens = joined[1:-1].replace("],[", ",").split(",")
        if len(tokens) != 4 * total:
            return False
        names = tokens[0::4]
        codes = {}
        for token in dict.fromkeys(names):  # codes in order of first appearance
            if not 2 <= len(token) <= MAX_STRING_CHARS + 2 or token[0] != '"' or token[-1] != '"' \
                    or len(c.ann_names) >= MAX_NAMES:
                return False
            codes[token] = c.code(c.ann_names, str(json.loads(token)))
        c.ann_name = array("I", map(codes.__getitem__, names))
        c.ann_offset = array("q", map(int, tokens[1::4]))
        c.ann_duration = array("q", map(int, tokens[2::4]))
        c.ann_depth = array("i", map(int, tokens[3::4]))
        if not (_within(c.ann_offset, -MAX_DURATION_NS, MAX_DURATION_NS)
                and _within(c.ann_duration, 0, MAX_DURATION_NS) and _within(c.ann_depth, 0, MAX_STEP_REGIONS)):
            return False
    c.ann_index = array("q", [0])
    c.ann_index.extend(accumulate(counts))
    # Scalars '"name":value,...' (non-finite values as strings "nan", "inf").
    joined = ",".join(filter(None, scalars))
    if "\\" in joined:
        return False
    counts = [body.count('":') for body in scalars]
    total = sum(counts)
    if total:
        if max(counts) > MAX_STEP_SCALARS:
            return False
        tokens = joined.replace('":', '",').split(",")
        if len(tokens) != 2 * total:
            return False
        names = tokens[0::2]
        codes = {}
        for token in dict.fromkeys(names):  # codes in order of first appearance
            if not 2 <= len(token) <= MAX_STRING_CHARS + 2 or token[0] != '"' or token[-1] != '"' \
                    or len(c.scalar_names) >= MAX_NAMES:
                return False
            codes[token] = c.code(c.scalar_names, str(json.loads(token)))
        values = tokens[1::2]
        c.scalar_name = array("I", map(codes.__getitem__, names))
        c.scalar_value = array("d", map(float, (v.strip('"') for v in values) if '"' in ",".join(values) else values))
        if (math.inf in c.scalar_value or -math.inf in c.scalar_value) and any(
                v[:1] != '"' and math.isinf(float(v)) for v in values):
            return False  # a number too large for a double (the recorder writes infinities as "inf")
    c.scalar_index = array("q", [0])
    c.scalar_index.extend(accumulate(counts))
    if any(errors):
        c.errors = {i: _str(loads(e)) for i, e in enumerate(errors) if e and e != '""'}
    return True


def _parse_step_line(data: Any, rank: RankRecording) -> None:
    """One steps.jsonl record (format in :mod:`otelprof.recording.schema`), checked before anything of it
    is kept: ValueError (or another of _LINE_ERRORS) when it is not what the recorder writes."""
    if type(data) is not dict:
        raise ValueError("not an object")
    kind = data["k"]
    if kind == schema.KIND_STEP:
        regions = data.get("a") or ()
        scalars = data.get("x") or {}
        if len(regions) > MAX_STEP_REGIONS or type(scalars) is not dict or len(scalars) > MAX_STEP_SCALARS:
            raise ValueError("too many regions or scalars")
        annotations = [(_str(name), _int(offset, -MAX_DURATION_NS, MAX_DURATION_NS), _int(dur, 0, MAX_DURATION_NS),
                        _int(depth, 0, MAX_STEP_REGIONS)) for name, offset, dur, depth in regions]
        values = {_str(k): _number(v) for k, v in scalars.items()}
        error = data.get("err")
        rank.step_columns.append(_str(data["ph"]), _int(data["n"], -INT64 - 1, INT64),
                                 _int(data["t"], 0, MAX_TIME_NS), _int(data["d"], 0, MAX_DURATION_NS), annotations,
                                 values, _str(error) if error is not None else None)
    elif kind == schema.KIND_ANNOTATION:
        phase = data.get("ph")
        rank.annotations.append(Annotation(_str(data["name"]), _int(data["t"], 0, MAX_TIME_NS),
                                           _int(data["d"], 0, MAX_DURATION_NS), 0,
                                           _str(phase) if phase is not None else None))
    elif kind == schema.KIND_SCALAR:
        phase = data.get("ph")
        rank.scalars.append((_int(data["t"], 0, MAX_TIME_NS), _str(phase) if phase is not None else "None",
                             _str(data["name"]), _number(data["v"])))
    elif kind == schema.KIND_PHASE:
        rank.phases.append((_int(data["t"], 0, MAX_TIME_NS), _str(data["ph"])))
    elif kind == schema.KIND_DEVICE:
        number = _int(data["n"], -INT64 - 1, INT64) if data.get("n") is not None else None
        phase = _str(data["ph"])
        regions = data["a"]
        if type(regions) is not list or len(regions) > MAX_STEP_REGIONS:
            raise ValueError("not a list of regions")
        rank.device_times.extend([DeviceTime(phase, number, name, duration) for name, duration in
                                  [(_str(n), _int(d, 0, MAX_DURATION_NS)) for n, d in regions]])
    else:
        raise ValueError(f"unknown record kind {kind!r:.40}")


_PROCESS_SAMPLE = re.compile(r'^(?:\{"t":(\d+),"pid":\d+(?:,"pcpu":([-+0-9.eE]+))?(?:,"rss":(\d+))?\}|(.+))$', re.M)
"""A sample line of a rank that does not sample the node (groups: time, process CPU, RSS), or any other line."""


def _parse_samples(path: Path) -> SampleColumns:
    c = SampleColumns()
    if not os.path.lexists(path):
        return c
    try:
        for text, over in _blocks(path, MAX_LINE_BYTES[schema.SAMPLES]):
            c.skipped_lines += over
            _read_samples(c, text)
    except OSError:
        pass  # checked when the rank was read: a file gone since is a file that ended
    n = len(c.t_ns)
    for columns in c.gpus.values():
        for column in columns.values():
            if len(column) < n:
                column.extend(array("d", [math.nan]) * (n - len(column)))
    return c


def _read_samples(c: SampleColumns, text: str) -> None:
    """One block of samples.jsonl: in bulk when it holds only process samples, else line by line."""
    rows = _PROCESS_SAMPLE.findall(text)
    if rows and not any(row[3] for row in rows):
        times, pcpu, rss, _ = zip(*rows)
        try:
            t_ns = array("q", map(int, times))
            pcpu_values = array("d", (float(v) if v else math.nan for v in pcpu))
            rss_values = array("d", (float(v) if v else math.nan for v in rss))
            fits = _within(t_ns, 0, MAX_TIME_NS) and not any(map(math.isinf, pcpu_values)) \
                and not any(map(math.isinf, rss_values))
        except (ValueError, OverflowError):
            fits = False
        if fits:
            n = len(rows)
            c.t_ns.extend(t_ns)
            c.pcpu.extend(pcpu_values)
            c.rss.extend(rss_values)
            for column in (c.cpu_mean, c.cpu_max, c.iow_mean, c.iow_max, c.mem, c.disk_read, c.disk_write, c.net_rx,
                           c.net_tx, c.throttled, c.container_memory, c.container_limit):
                column.extend(array("d", [math.nan]) * n)
            return
    for line in text.split("\n"):
        line = line.strip()
        if line:
            _add_sample(c, line)


def _value(value: Any) -> float:
    """A sample's number (null or NaN: missing; no sampler writes an infinity)."""
    if value is None:
        return math.nan
    if type(value) not in (int, float) or value in (math.inf, -math.inf):
        raise ValueError(f"not a number: {value!r:.40}")
    return float(value)


def _numbers(values: Any, limit: int) -> None:
    """Check in C that ``values`` (a list, or a dict's values) holds at most ``limit`` numbers, none of them
    infinite (NaN: a missing value): TypeError or ValueError otherwise."""
    if len(values) > limit:
        raise ValueError(f"more than {limit} values")
    total = sum(values, 0.0)  # TypeError for a value that is not a number
    if (total != total or total in (math.inf, -math.inf)) and any(v in (math.inf, -math.inf) for v in values):
        raise ValueError("an infinite value")


def _per_cpu(value: Any) -> list[float] | None:
    if not value:
        return None
    if type(value) is not list:
        raise ValueError("not a list of numbers")
    _numbers(value, MAX_CORES)
    return value  # type: ignore[no-any-return]


def _pair(value: Any) -> tuple[float, float]:
    if not value:
        return math.nan, math.nan
    if type(value) is not list or len(value) != 2:
        raise ValueError("not a pair of numbers")
    return _value(value[0]), _value(value[1])


def _gpu_values(c: SampleColumns, value: Any) -> dict[str, dict[str, float]]:
    """A sample's GPUs: index -> key -> value, within the rank's MAX_GPUS and MAX_GPU_KEYS."""
    if not value:
        return {}
    if type(value) is not dict or len(value) > MAX_GPUS:
        raise ValueError(f"not an object of at most {MAX_GPUS} GPUs")
    known = c.gpus
    if len(known) + len([i for i in value if i not in known]) > MAX_GPUS:
        raise ValueError(f"more than {MAX_GPUS} GPUs")
    for index, entry in value.items():
        if type(entry) is not dict or len(index) > 64 or sum(map(len, entry)) > MAX_STRING_CHARS:
            raise ValueError("not a GPU's values")
        _numbers(entry.values(), MAX_GPU_KEYS)
        columns = known.get(index)
        if columns is not None and len(columns) + len(entry) > MAX_GPU_KEYS \
                and len(columns.keys() | entry.keys()) > MAX_GPU_KEYS:
            raise ValueError(f"more than {MAX_GPU_KEYS} values of a GPU")
    return value  # type: ignore[no-any-return]


def _add_sample(c: SampleColumns, line: str) -> None:
    try:
        sample = loads(line, exact=False)
        if type(sample) is not dict:
            raise ValueError("not an object")
        get = sample.get
        t = _int(sample["t"], 0, MAX_TIME_NS)
        pcpu, rss, mem, throttled = _value(get("pcpu")), _value(get("rss")), _value(get("mem")), _value(get("thr"))
        container_memory, container_limit = _value(get("cws")), _value(get("cml"))
        cpu, iow = _per_cpu(get("cpu")), _per_cpu(get("iow"))
        disk, net = _pair(get("disk")), _pair(get("net"))
        gpus = _gpu_values(c, get("gpu"))
    except _LINE_ERRORS:
        c.skipped_lines += 1
        return
    nan = math.nan
    n = len(c.t_ns)
    c.t_ns.append(t)
    c.pcpu.append(pcpu)
    c.rss.append(rss)
    c.mem.append(mem)
    c.throttled.append(throttled)
    c.container_memory.append(container_memory)
    c.container_limit.append(container_limit)
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
    c.iow_mean.append(sum(iow) / len(iow) if iow else nan)
    c.iow_max.append(max(iow) if iow else nan)
    c.disk_read.append(disk[0])
    c.disk_write.append(disk[1])
    c.net_rx.append(net[0])
    c.net_tx.append(net[1])
    layouts = c._layouts
    for index, entry in gpus.items():
        layout = layouts.get(index)
        if layout is not None and layout[0] == tuple(entry) and len(layout[1][0]) == n:
            for column, value in zip(layout[1], entry.values()):  # same keys as last time: no lookups
                column.append(value)
            continue
        columns = c.gpus.get(index)
        if columns is None:
            columns = c.gpus[index] = {}
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
    seen: dict[int, Path] = {}
    for p in rank_dirs:
        rank: RankRecording = results[(p, steps_job)]
        if rank.rank in seen:
            raise RecordingError(f"{seen[rank.rank]} and {p} both hold rank {rank.rank}: not one run's recording")
        seen[rank.rank] = p
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
