"""Schema 1.3's block lines many at a time: the lines of a part of samples.jsonl matched by one regular
expression, their packed fields decoded and checked together (a few calls in C per field for all the lines), and
the blocks that share a layout added as one (a column a call).

:func:`read_packed` takes the lines only when every one of them is a block exactly as the writer writes it
(:mod:`otelprof.recording.sample_packing`) and passes every check of the block-by-block reader; it adds exactly
what that reader would add, or nothing (then the caller reads the lines one by one, which skips and counts the
ones that fail)."""

from __future__ import annotations

import operator
import re
import sys
from array import array
from functools import partial
from itertools import accumulate, chain, groupby, repeat
from typing import Any

from otelprof.recording.columns import SampleColumns
from otelprof.recording.limits import MAX_CORES, loads
from otelprof.recording.sample_blocks import add_core_sums, append_block
from otelprof.recording.sample_packing import (
    COLUMNS,
    MAX_BLOCK_SAMPLES,
    _finite,
    b64decode,
    layout_width,
    same_positions,
    times_within,
)

_B64 = r'"([^"]*)"'
_COUNT = r"(0|[1-9]\d{0,8})"
_PACKED = re.compile(
    r'^\{"k":"b","t":' + _B64 + r'(?:,"pid":(?:0|[1-9]\d{0,17}))?(?:,"c":(\[[^\]\\\n]*\]))?'
    r'(?:,"gpu":(\{[^{}\\\n]*\}))?(?:,"same":(\[[0-9,]*\]),"sv":' + _B64 + r')?(?:,"v":' + _B64 + r')?'
    r'(?:,"ncpu":' + _COUNT + r',"busy":' + _B64 + r')?'
    r'(?:,"niow":' + _COUNT + r',"iowait":' + _B64 + r')?\}$|(.+)', re.M)
"""A block line as the writer writes it (groups: times, columns, GPUs, columns written once and their values,
values, per-CPU counts and sums), or any
other line. What it matches and the checks pass is the JSON the writer writes: the packed fields hold only base64
characters (strict decoding refuses any other, a backslash or a line end among them), the ``c`` and ``gpu`` texts no
backslash (no escaped quote that could end a string early) and are JSON of their own."""

_BIG = sys.byteorder == "big"


class _Refused(Exception):
    """The lines are read one by one."""


def read_packed(c: SampleColumns, text: str) -> bool:
    """Add the block lines of ``text`` (whole lines) to ``c``; False (``c`` unchanged) when they must be read one
    by one."""
    if _BIG:  # the values' bytes are read as they are: block by block there
        return False
    rows = _PACKED.findall(text)
    if not rows:
        return False
    times, names, gpus, same, kept, values, ncpu, busy, niow, iowait, other = zip(*rows)
    if any(other):
        return False
    try:
        checked = _check(c, times, names, gpus, same, kept, values, ncpu, busy, niow, iowait)
    except (_Refused, ValueError, TypeError, KeyError, OverflowError, RecursionError):
        return False
    _add(c, *checked)
    return True


def _check(c: SampleColumns, *fields: tuple[str, ...]) -> tuple[Any, ...]:
    """Every line's fields decoded and checked as :func:`~otelprof.recording.sample_packing.unpack` checks one
    block's; _Refused (or another exception) when one is not what the writer writes."""
    times, names, gpus, same, kept, values, ncpu, busy, niow, iowait = fields
    decode = b64decode
    t_raw = list(map(decode, times))  # binascii.Error: a ValueError
    t_bytes = list(map(len, t_raw))
    if any(map(operator.and_, t_bytes, repeat(7))):
        raise _Refused
    ns = list(map(operator.rshift, t_bytes, repeat(3)))
    if min(ns) < 1 or max(ns) > MAX_BLOCK_SAMPLES:
        raise _Refused
    t_ns = array("q")
    t_ns.frombytes(b"".join(t_raw))
    if not times_within(t_ns):
        raise _Refused
    layouts = list(zip(names, gpus, same))
    widths = _widths(c, layouts)
    raw = list(map(decode, values))
    per_sample = {layout: (found[0] - len(found[3])) * 8 for layout, found in widths.items()}
    lengths = list(map(len, raw))
    if lengths != list(map(operator.mul, ns, map(per_sample.__getitem__, layouts))):
        raise _Refused
    kept_raw = list(map(decode, kept))
    if list(map(len, kept_raw)) != [len(widths[layout][3]) * 8 for layout in layouts]:
        raise _Refused
    cpu_counts, cpu_sums = _sums(ncpu, busy, ns)
    iow_counts, iow_sums = _sums(niow, iowait, ns)
    joined = b"".join(raw)
    if not _finite(joined) or not _finite(b"".join([*kept_raw, *cpu_sums, *iow_sums])):  # whole doubles: aligned
        raise _Refused
    return (t_ns, ns, layouts, widths, (joined, [0, *accumulate(lengths)]), kept_raw, cpu_counts, cpu_sums,
            iow_counts)


def _widths(c: SampleColumns, layouts: list[tuple[str, str, str]]) \
        -> dict[tuple[str, str, str], tuple[int, Any, Any, list[int]]]:
    """Per distinct layout (``c``, ``gpu`` and ``same`` texts): values per sample, names, GPU keys, the columns
    written once; each checked against the rank's GPUs as they are when its first block is added."""
    known = {index: dict.fromkeys(keys) for index, keys in c.gpus.items()}
    out: dict[tuple[str, str, str], tuple[int, Any, Any, list[int]]] = {}
    for layout, _ in groupby(layouts):
        names = loads(layout[0]) if layout[0] else []
        gpus = loads(layout[1]) if layout[1] else {}
        width = layout_width(names, gpus, known)  # type: ignore[arg-type]
        same = same_positions(loads(layout[2]) if layout[2] else [], width)
        out.setdefault(layout, (width, names, gpus, same))
        for index, keys in gpus.items():
            known.setdefault(index, {}).update(dict.fromkeys(keys))
    return out


def _sums(counts: tuple[str, ...], sums: tuple[str, ...], ns: list[int]) -> tuple[list[int], list[bytes]]:
    """Per line: how many samples had per-CPU values, and the bytes of their per-CPU sums."""
    if not any(counts):
        if any(sums):
            raise _Refused
        return [0] * len(ns), []
    found = [int(count) if count else 0 for count in counts]
    raw = list(map(b64decode, sums))
    lengths = list(map(len, raw))
    if any(map(operator.and_, lengths, repeat(7))) or max(lengths) > 8 * MAX_CORES \
            or any(map(operator.gt, found, ns)) or list(map(bool, found)) != list(map(bool, lengths)):
        raise _Refused
    return found, raw


def _add(c: SampleColumns, t_ns: array[int], ns: list[int], layouts: list[tuple[str, str, str]],
         widths: dict[tuple[str, str, str], tuple[int, Any, Any, list[int]]], raw: tuple[bytes, list[int]],
         kept: list[bytes], cpu_counts: list[int], cpu_sums: list[bytes], iow_counts: list[int]) -> None:
    """The checked lines added, the blocks of a layout (one after the other) as one."""
    line = sample = 0
    joined, offsets = memoryview(raw[0]), raw[1]
    for layout, group in groupby(layouts):
        blocks = len(list(group))
        width, names, gpus, same = widths[layout]
        samples = sum(ns[line:line + blocks])
        values = array("d")
        values.frombytes(joined[offsets[line]:offsets[line + blocks]])
        full = _columns(values, width, same, array("d", b"".join(kept[line:line + blocks])), ns[line:line + blocks],
                        samples)
        columns = {COLUMNS[name]: column for name, column in zip(names, full)}
        at = len(names)
        gpu_columns: dict[str, dict[str, array[float]]] = {}
        for index, keys in gpus.items():
            gpu_columns[index] = dict(zip(keys, full[at:at + len(keys)]))
            at += len(keys)
        counts = cpu_counts[line:line + blocks]
        sums = [found for found in cpu_sums[line:line + blocks] if found] if cpu_sums else []
        node = any(counts) or any(iow_counts[line:line + blocks]) or (not len(c.cpu_mean) and any(
            any(map(operator.eq, column, column)) for name, column in columns.items()
            if name not in ("pcpu", "rss")))
        alike = len(set(map(len, sums))) == 1
        append_block(c, t_ns[sample:sample + samples], columns, gpu_columns, node,
                     () if alike else list(map(partial(array, "d"), sums)), sum(counts))
        if alike:  # the blocks' per-CPU sums added in order, a CPU at a time
            add_core_sums(c, array("d", b"".join(sums)), len(sums[0]) // 8)
        line += blocks
        sample += samples


def _columns(values: array[float], width: int, same: list[int], kept: array[float], ns: list[int],
             samples: int) -> list[array[float]]:
    """Every column of blocks of one layout: ``values`` (their samples one after the other, the columns not in
    ``same``), ``kept`` (per block the values of the columns in ``same``), ``ns`` their samples."""
    varying = width - len(same)
    apart = {j: i for i, j in enumerate(same)}
    full = []
    at = 0
    for j in range(width):
        i = apart.get(j)
        if i is None:
            full.append(values[at::varying])
            at += 1
            continue
        per_block = kept[i::len(same)]
        if per_block.tobytes() == per_block[:1].tobytes() * len(per_block):  # one value in every block
            full.append(per_block[:1] * samples)
        else:
            full.append(array("d", chain.from_iterable(map(repeat, per_block, ns))))
    return full
