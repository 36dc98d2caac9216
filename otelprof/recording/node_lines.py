"""Node sample lines (one sample per line: recordings before schema 1.2) a few at a time: the lines of a
node-sampling rank decoded, checked and turned into columns value by value in C (``map`` over the decoded lines),
not line by line in Python.

:func:`read_node_block` takes some lines only when every line has the node sampler's shape (per-CPU values and the
same GPUs with the same keys in each line) and every value passes the checks the line-by-line reader makes; it
adds exactly what that reader would add, or nothing (then the caller reads the block line by line, which skips
and counts the lines that fail)."""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Callable, Sequence
from functools import partial
from itertools import repeat
from typing import Any

from otelprof.recording.columns import SampleColumns
from otelprof.recording.limits import MAX_CORES, MAX_GPU_KEYS, MAX_GPUS, MAX_STRING_CHARS, MAX_TIME_NS, loads, within
from otelprof.recording.sample_blocks import add_gpus

_NUMBERS = {int, float}
_OR_NONE = {int, float, type(None)}
_SCALARS = ("pcpu", "rss", "mem", "thr", "cws", "cml")


class _NotBulk(Exception):
    """The block is read line by line."""


def read_node_block(c: SampleColumns, lines: Sequence[str]) -> bool:
    """Add ``lines`` (node samples) to ``c`` together; False (``c`` unchanged) when they must be read line by line."""
    try:
        samples = list(map(partial(loads, exact=False), lines))
        if set(map(type, samples)) != {dict}:
            return False
        columns = _columns(c, samples)
    except (_NotBulk, ValueError, TypeError, KeyError, OverflowError, RecursionError):
        return False
    _add(c, *columns)
    return True


def _columns(c: SampleColumns, samples: list[dict[str, Any]]) -> tuple[Any, ...]:
    get: Callable[[str], list[Any]] = lambda key: list(map(operator.methodcaller("get", key), samples))  # noqa: E731
    times = get("t")
    if set(map(type, times)) != {int}:
        raise _NotBulk
    t_ns = array("q", times)
    if not within(t_ns, 0, MAX_TIME_NS):
        raise _NotBulk
    scalars = [_doubles(get(key)) for key in _SCALARS]
    cpu, iow = get("cpu"), get("iow")
    cpu_sum, cpu_max, lengths = _per_cpu(cpu)
    iow_sum, iow_max, iow_lengths = _per_cpu(iow)
    cpu_mean = array("d", map(operator.truediv, cpu_sum, lengths))
    iow_mean = array("d", map(operator.truediv, iow_sum, iow_lengths))
    disk, net = _pairs(get("disk")), _pairs(get("net"))
    gpus = _gpus(c, get("gpu"))
    return t_ns, scalars, cpu, cpu_mean, cpu_max, iow_mean, iow_max, disk, net, gpus


def _doubles(values: list[Any]) -> array[float]:
    """A value per line (null or absent: NaN), each a number but not an infinity."""
    kinds = set(map(type, values))
    if not kinds <= _OR_NONE:
        raise _NotBulk
    if type(None) in kinds:
        values = [math.nan if v is None else v for v in values]
    doubles = array("d", values)
    if math.inf in doubles or -math.inf in doubles:
        raise _NotBulk
    return doubles


def _per_cpu(values: list[Any]) -> tuple[list[float], array[float], list[int]]:
    """Per line: the sum, the maximum and the number of the per-CPU values (each line has some, at most
    MAX_CORES, each a number, none infinite)."""
    if set(map(type, values)) != {list}:
        raise _NotBulk
    lengths = list(map(len, values))
    if min(lengths) == 0 or max(lengths) > MAX_CORES:
        raise _NotBulk
    sums = list(map(sum, values, repeat(0.0)))  # TypeError for a value that is not a number
    if not math.isfinite(math.fsum(sums)) and any(v in (math.inf, -math.inf) for line in values for v in line):
        raise _NotBulk
    return sums, array("d", map(max, values)), lengths


def _pairs(values: list[Any]) -> tuple[array[float], array[float]]:
    """Per line two numbers (a line without them: NaN, NaN)."""
    kinds = set(map(type, values))
    if kinds == {type(None)}:
        nan = array("d", [math.nan]) * len(values)
        return nan, nan[:]
    if kinds != {list} or set(map(len, values)) != {2}:
        raise _NotBulk
    return _doubles(list(map(operator.itemgetter(0), values))), _doubles(list(map(operator.itemgetter(1), values)))


def _gpus(c: SampleColumns, values: list[Any]) -> dict[str, dict[str, array[float]]]:
    """Per GPU index, per key, a value per line: every line has the same GPUs with the same keys."""
    kinds = set(map(type, values))
    if kinds == {type(None)}:
        return {}
    if kinds != {dict}:
        raise _NotBulk
    layouts = set(map(tuple, values))
    if len(layouts) != 1:
        raise _NotBulk
    indexes = layouts.pop()
    if not indexes:
        return {}
    if len(indexes) > MAX_GPUS or len(c.gpus.keys() | set(indexes)) > MAX_GPUS:
        raise _NotBulk
    out: dict[str, dict[str, array[float]]] = {}
    for index in indexes:
        entries = list(map(operator.itemgetter(index), values))
        if set(map(type, entries)) != {dict}:
            raise _NotBulk
        keys = set(map(tuple, entries))
        if len(keys) != 1:
            raise _NotBulk
        names = keys.pop()
        known = c.gpus.get(index, {})
        if len(index) > 64 or sum(map(len, names)) > MAX_STRING_CHARS or len(names) > MAX_GPU_KEYS \
                or len(known.keys() | set(names)) > MAX_GPU_KEYS:
            raise _NotBulk
        # one value per line and key: array() refuses what is not a number, as the line's sum() does
        columns = dict(zip(names, map(_finite, zip(*map(dict.values, entries)))))
        out[index] = columns if names else {}
    return out


def _finite(values: tuple[Any, ...]) -> array[float]:
    doubles = array("d", values)
    if not math.isfinite(sum(doubles, 0.0)) and (math.inf in doubles or -math.inf in doubles):
        raise _NotBulk
    return doubles


def _add(c: SampleColumns, t_ns: array[int], scalars: list[array[float]], cpu: list[list[float]],
         cpu_mean: array[float], cpu_max: array[float], iow_mean: array[float], iow_max: array[float],
         disk: tuple[array[float], array[float]], net: tuple[array[float], array[float]],
         gpus: dict[str, dict[str, array[float]]]) -> None:
    """The checked columns appended to ``c``, as the line-by-line reader appends them."""
    n, added = len(c.t_ns), len(t_ns)
    nan = array("d", [math.nan])
    if not len(c.cpu_mean):  # the first node values: the node columns start, NaN for the lines before
        for column in c.node_columns():
            column.extend(nan * n)
    pcpu, rss, mem, throttled, container_memory, container_limit = scalars
    c.t_ns.extend(t_ns)
    c.pcpu.extend(pcpu)
    c.rss.extend(rss)
    c.mem.extend(mem)
    c.throttled.extend(throttled)
    c.container_memory.extend(container_memory)
    c.container_limit.extend(container_limit)
    c.cpu_mean.extend(cpu_mean)
    c.cpu_max.extend(cpu_max)
    c.iow_mean.extend(iow_mean)
    c.iow_max.extend(iow_max)
    c.disk_read.extend(disk[0])
    c.disk_write.extend(disk[1])
    c.net_rx.extend(net[0])
    c.net_tx.extend(net[1])
    c.node_samples += added
    busy = c.core_busy_sum
    for line in cpu:  # in line order, as the line-by-line reader adds them
        if len(line) > c.cores:
            busy.extend([0.0] * (len(line) - c.cores))
            c.cores = len(line)
        busy[:len(line)] = map(operator.add, busy, line)
    add_gpus(c, gpus, n)
