"""samples.jsonl in blocks: the samples of a few seconds in one line.

The writer writes schema 1.3's blocks (:mod:`otelprof.recording.sample_packing`: per-CPU values reduced to what
the reader keeps, numeric columns as base64 of little-endian doubles; a 64-core, 8-GPU node's samples read
about 10 times faster than 1.2's blocks and take a third less room, a process's 3 times faster and a quarter
less room). Schema 1.2's blocks are still read: ``{"k":"b","t":[time,...],"pcpu":[...],...,
"cpu":[[busy per CPU],...],"gpu":{index:{key:[...]}}}``, the keys of a sample line
(:mod:`otelprof.recording.schema`), each a list with one entry per sample (``null`` where that sample lacks the
key; a key no sample of the block has is left out); :func:`encode` writes them (for tests of old recordings).

The writer fills a :class:`SampleBlock` and writes it when it holds :data:`BLOCK_SAMPLES` samples or
:data:`BLOCK_VALUES` values, when its first sample is :data:`BLOCK_SECONDS` old, and at every flush but the
periodic one (shutdown, SIGTERM, ``otelprof.flush()``): a process killed outright loses at most the samples of
the last :data:`BLOCK_SECONDS`. :func:`add_block` is the reader's side: a block is checked whole and then added
as its samples would be added one line each (1.3: the per-CPU sums a block at a time), or skipped whole (one
skipped line)."""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Iterable, Sequence
from functools import reduce
from itertools import chain
from typing import Any

from otelprof.recording.columns import SampleColumns
from otelprof.recording.limits import MAX_CORES, MAX_GPU_KEYS, MAX_GPUS, MAX_STRING_CHARS, MAX_TIME_NS, within
from otelprof.recording.sample_packing import COLUMNS, MAX_BLOCK_SAMPLES, Packer, samples_of, unpack

KIND = "b"
"""The ``k`` of a block line (sample lines have no ``k``)."""
BLOCK_SAMPLES = 20
"""Samples per block: 10 s at the default sample interval."""
BLOCK_SECONDS = 10.0
"""Oldest a block's first sample gets before the block is written."""
BLOCK_VALUES = 20_000
"""Values per block at most, per-CPU sums included (a node of thousands of CPUs writes smaller blocks; lines stay
far below the reader's 1 MiB)."""

_SCALARS = ("pcpu", "rss", "mem", "thr", "cws", "cml")
_NODE_KEYS = ("cpu", "iow", "mem", "thr", "cws", "cml", "disk", "net")
"""What only the node sampler writes."""
_NODE_FIELDS = ("mem", "throttled", "container_memory", "container_limit", "cpu_mean", "cpu_max", "iow_mean",
                "iow_max", "disk_read", "disk_write", "net_rx", "net_tx")
"""The node columns, in the order a block appends them."""


class SampleBlock:
    """The samples the writer holds until it writes them as one block line (schema 1.3)."""

    def __init__(self) -> None:
        self._packer = Packer()
        self._values = 0
        self._started = 0.0
        self._kept: dict[tuple[str, str], bytes] = {}
        """Per column, the value it has had in every sample so far (b"": it varied): written once a block."""

    def __len__(self) -> int:
        return len(self._packer.times)

    def add(self, sample: dict[str, Any], now: float) -> dict[str, Any] | None:
        """Hold ``sample`` (taken at monotonic time ``now``); the block to write when it is full, else None.
        TypeError, ValueError or OverflowError for a sample that is not numbers (nothing of it is held)."""
        packer = self._packer
        first = not packer.times
        self._values += packer.add(sample)
        if first:
            self._started = now
        if len(packer.times) >= BLOCK_SAMPLES or self._values + packer.cores >= BLOCK_VALUES:
            return self.take()
        return None

    def due(self, now: float) -> bool:
        """Whether the first sample held is :data:`BLOCK_SECONDS` old at monotonic time ``now``."""
        return bool(len(self)) and now - self._started >= BLOCK_SECONDS

    def take(self) -> dict[str, Any] | None:
        """The samples held as a block (None when there are none), and an empty block."""
        if not len(self):
            return None
        packer, self._packer, self._values = self._packer, Packer(), 0
        return {"k": KIND, **packer.pack(self._kept)}


def encode(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Sample records (as the sampler makes them, each with ``t``) as one schema 1.2 block record (the format
    of older recordings)."""
    n = len(samples)
    block: dict[str, Any] = {"k": KIND}
    for key in dict.fromkeys(key for sample in samples for key in sample):
        if key != "gpu":
            block[key] = [sample.get(key) for sample in samples]
    gpus: dict[str, dict[str, list[Any]]] = {}
    for i, sample in enumerate(samples):
        for index, entry in (sample.get("gpu") or {}).items():
            columns = gpus.setdefault(index, {})
            for name, value in entry.items():
                columns.setdefault(name, [None] * n)[i] = value
    if gpus:
        block["gpu"] = gpus
    return block


def decode(block: dict[str, Any]) -> list[dict[str, Any]]:
    """A block record's samples as sample records (for tools that read samples.jsonl's records). A 1.2 block's
    as written (unchecked); a 1.3 block's checked as the reader checks it, with the per-CPU values reduced
    (:func:`otelprof.recording.sample_packing.samples_of`)."""
    if type(block.get("t")) is str:
        return samples_of(block)
    samples: list[dict[str, Any]] = [{} for _ in block["t"]]
    for key, column in block.items():
        if key == "gpu":
            for index, entry in column.items():
                for name, values in entry.items():
                    for sample, value in zip(samples, values):
                        if value is not None:
                            sample.setdefault("gpu", {}).setdefault(index, {})[name] = value
        elif key != "k":
            for sample, value in zip(samples, column):
                if value is not None:
                    sample[key] = value
    return samples


def add_block(c: SampleColumns, block: dict[str, Any]) -> None:
    """Add a decoded block line to ``c`` as its samples, one line each, would be added (1.3: the per-CPU sums of
    the block at once). A block that is not what the writer writes (or past the reader's limits) raises
    ValueError, TypeError, KeyError or OverflowError before anything is added."""
    times = block.get("t")
    if type(times) is str:  # schema 1.3
        found = unpack(block, c.gpus)
        columns = {COLUMNS[name]: column for name, column in found.columns.items()}
        node = bool(found.ncpu or found.niow) or (not len(c.cpu_mean) and any(
            any(map(operator.eq, column, column)) for name, column in columns.items() if name in _NODE_FIELDS))
        append_block(c, found.t_ns, columns, found.gpus, node, (found.busy,) if found.ncpu else (), found.ncpu)
        return
    if type(times) is not list or not 0 < len(times) <= MAX_BLOCK_SAMPLES or set(map(type, times)) != {int}:
        raise ValueError("not a block's sample times")
    t_ns = array("q", times)
    if not within(t_ns, 0, MAX_TIME_NS):
        raise ValueError("a sample time out of range")
    n = len(times)
    get = block.get
    if all(get(key) is None for key in _NODE_KEYS):  # a process's samples (most ranks of a large job)
        pcpu, rss = _many_doubles([get("pcpu"), get("rss")], n)
        append_block(c, t_ns, {"pcpu": pcpu, "rss": rss}, _gpus(c, get("gpu"), n), False)
        return
    pcpu, rss, mem, throttled, container_memory, container_limit, *pairs = _many_doubles(
        [*(get(key) for key in _SCALARS), *_pairs(get("disk"), n), *_pairs(get("net"), n)], n)
    disk, net = pairs[:2], pairs[2:]
    cpu, iow = _per_cpu(get("cpu"), n), _per_cpu(get("iow"), n)
    gpus = _gpus(c, get("gpu"), n)
    if False in cpu[3]:  # some sample without per-CPU values: which have other node values?
        node_rows = list(map(operator.or_, cpu[3], iow[3]))
        for column in (mem, throttled, container_memory, container_limit, *disk, *net):
            if any(map(operator.eq, column, column)):  # a value (not NaN) in some sample
                node_rows = [has or value == value for has, value in zip(node_rows, column)]
    else:
        node_rows = cpu[3]
    append_block(c, t_ns, dict(zip(("pcpu", "rss", *_NODE_FIELDS), (
        pcpu, rss, mem, throttled, container_memory, container_limit, cpu[0], cpu[1], iow[0], iow[1], *disk, *net))),
        gpus, any(node_rows), cpu[2], len(cpu[2]))


def append_block(c: SampleColumns, t_ns: array[int], columns: dict[str, array[float]],
            gpus: dict[str, dict[str, array[float]]], node: bool, core_lines: Iterable[Sequence[float]] = (),
            node_samples: int = 0) -> None:
    """A checked block appended to ``c``: its columns (``SampleColumns`` field names; NaN for one it lacks), its
    GPUs' columns, the node columns when it has a node value (or earlier samples had), and per CPU the busy
    ratios of ``core_lines`` (each a sample's, or a 1.3 block's sums of ``node_samples`` samples) in order."""
    n, start = len(t_ns), len(c.t_ns)
    nan = array("d", [math.nan]) * n
    get = columns.get
    c.t_ns.extend(t_ns)
    c.pcpu.extend(get("pcpu", nan))
    c.rss.extend(get("rss", nan))
    if len(c.cpu_mean) or node:  # as for lines: node columns once a sample had a node value
        if not len(c.cpu_mean):
            for column in c.node_columns():
                column.extend(array("d", [math.nan]) * start)
        for name in _NODE_FIELDS:
            getattr(c, name).extend(get(name, nan))
        c.node_samples += node_samples
        busy = c.core_busy_sum
        for line in core_lines:  # in sample order, as for lines
            if len(line) > c.cores:
                busy.extend([0.0] * (len(line) - c.cores))
                c.cores = len(line)
            busy[:len(line)] = map(operator.add, busy, line)
    add_gpus(c, gpus, start)


def add_core_sums(c: SampleColumns, lines: array[float], width: int) -> None:
    """Per CPU, the busy ratios of ``lines`` (one after the other, ``width`` CPUs each) added to the rank's sums in
    order: what adding them a line at a time gives, a CPU at a time."""
    busy = c.core_busy_sum
    if width > c.cores:
        busy.extend([0.0] * (width - c.cores))
        c.cores = width
    busy[:width] = [reduce(operator.add, lines[k::width], busy[k]) for k in range(width)]


def add_gpus(c: SampleColumns, gpus: dict[str, dict[str, array[float]]], start: int) -> None:
    """GPU columns appended from row ``start`` (earlier rows without the value: NaN)."""
    nan = array("d", [math.nan])
    for index, values in gpus.items():
        columns = c.gpus.setdefault(index, {})
        for name, doubles in values.items():
            found = columns.get(name)
            if found is None:
                found = columns[name] = nan * start
            elif len(found) < start:
                found.extend(nan * (start - len(found)))
            found.extend(doubles)


def _column(value: Any, n: int) -> list[Any]:
    if type(value) is not list or len(value) != n:
        raise ValueError(f"not a column of {n} values")
    return value


def _many_doubles(values: list[Any], n: int, kinds: frozenset[type] = frozenset({int, float, type(None)})) \
        -> list[array[float]]:
    """:func:`_doubles` of several columns, checked together (a few calls in C for all of them)."""
    columns = [value for value in values if value is not None]
    if set(map(type, columns)) - {list} or set(map(len, columns)) - {n}:
        raise ValueError(f"not columns of {n} values")
    flat = list(chain.from_iterable(columns))
    try:
        if bool in kinds:  # array() takes every number (and bool) and refuses the rest: one pass
            doubles = array("d", flat)
        else:
            raise TypeError
    except TypeError:
        found = set(map(type, flat))
        if not found <= kinds:
            raise ValueError("not a number") from None
        if type(None) in found:
            flat = [math.nan if v is None else v for v in flat]
        doubles = array("d", flat)
    if not math.isfinite(sum(doubles, 0.0)) and (math.inf in doubles or -math.inf in doubles):
        raise ValueError("an infinite value")
    nan = array("d", [math.nan]) * n
    out, at = [], 0
    for value in values:
        if value is None:
            out.append(nan[:])
        else:
            out.append(doubles[at:at + n])
            at += n
    return out


_GPU_VALUE: frozenset[type] = frozenset({int, float, bool, type(None)})
"""What a sample line's GPU values may be (as ``sum`` takes them), and null."""


def _per_cpu(value: Any, n: int) -> tuple[array[float], array[float], list[list[float]], list[bool]]:
    """Per sample the mean and the maximum of its per-CPU values (NaN without any), the samples' lists that have
    values, and which samples have them."""
    nan = array("d", [math.nan]) * n
    if value is None:
        return nan, nan[:], [], [False] * n
    rows = _column(value, n)
    if not set(map(type, rows)) <= {list, type(None)}:
        raise ValueError("not lists of per-CPU values")
    has = list(map(bool, rows))
    lines = rows if False not in has else [row for row in rows if row]
    if max(map(len, lines), default=0) > MAX_CORES:
        raise ValueError(f"more than {MAX_CORES} per-CPU values")
    sums = list(map(sum, lines, [0.0] * len(lines)))  # TypeError for a value that is not a number
    if not math.isfinite(sum(sums, 0.0)) and any(v in (math.inf, -math.inf) for line in lines for v in line):
        raise ValueError("an infinite value")
    means, maxima = map(operator.truediv, sums, map(len, lines)), map(max, lines)
    if lines is rows:
        return array("d", means), array("d", maxima), lines, has
    mean = array("d", [next(means) if h else math.nan for h in has])
    peak = array("d", [next(maxima) if h else math.nan for h in has])
    return mean, peak, lines, has


def _pairs(value: Any, n: int) -> tuple[list[Any] | None, list[Any] | None]:
    """Per sample two values (a sample without them: null, null), as two columns; None, None when absent."""
    if value is None:
        return None, None
    rows = _column(value, n)
    if not set(map(type, rows)) <= {list, type(None)}:
        raise ValueError("not pairs of numbers")
    rows = [row or [None, None] for row in rows]
    if set(map(len, rows)) != {2}:
        raise ValueError("not pairs of numbers")
    return list(map(operator.itemgetter(0), rows)), list(map(operator.itemgetter(1), rows))


def _gpus(c: SampleColumns, value: Any, n: int) -> dict[str, dict[str, array[float]]]:
    """Per GPU index, per key, a value per sample, within the rank's MAX_GPUS and MAX_GPU_KEYS."""
    if value is None:
        return {}
    if type(value) is not dict or len(value) > MAX_GPUS or len(c.gpus.keys() | value.keys()) > MAX_GPUS:
        raise ValueError(f"not an object of at most {MAX_GPUS} GPUs")
    names = []
    for index, entry in value.items():
        if type(entry) is not dict or len(index) > 64 or sum(map(len, entry)) > MAX_STRING_CHARS \
                or len(entry) > MAX_GPU_KEYS or len(c.gpus.get(index, {}).keys() | entry.keys()) > MAX_GPU_KEYS:
            raise ValueError("not a GPU's values")
        names += [(index, name) for name in entry]
    out: dict[str, dict[str, array[float]]] = {index: {} for index in value}
    columns = _many_doubles([value[index][name] for index, name in names], n, _GPU_VALUE)
    for (index, name), column in zip(names, columns):
        out[index][name] = column
    return out
