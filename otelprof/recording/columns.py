"""A rank's steps and samples held as columns (arrays in file order): what analyses of long runs
iterate over. :class:`StepList` shows the step columns as :class:`~otelprof.recording.records.Step` objects."""

from __future__ import annotations

import operator
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, repeat
from typing import overload

from otelprof.recording.limits import MAX_NAMES
from otelprof.recording.records import Annotation, Step

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

    def step_of_annotations(self) -> array[int]:
        """Each annotation's step index (computed once per read)."""
        return self._step_of(self.ann_index)

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
    memory used/total, ``p`` power, ...). Node-wide columns (:meth:`node_columns`) are NaN in process-only
    samples, and empty when none of the rank's samples has a node value (most ranks of a large job do not
    sample their node: 12 columns of NaN each would be most of their memory)."""

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

    def node_columns(self) -> tuple[array[float], ...]:
        """The node-wide columns: as long as :attr:`t_ns`, or all empty (no sample with a node value)."""
        return (self.cpu_mean, self.cpu_max, self.iow_mean, self.iow_max, self.mem, self.disk_read, self.disk_write,
                self.net_rx, self.net_tx, self.throttled, self.container_memory, self.container_limit)
