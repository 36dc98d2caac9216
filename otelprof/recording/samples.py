"""Parsing samples.jsonl into :class:`~otelprof.recording.columns.SampleColumns` (process samples in
bulk, node and GPU samples line by line, each checked before it is kept). The node columns of a rank
whose samples have no node value stay empty (:meth:`~otelprof.recording.columns.SampleColumns.node_columns`)."""

from __future__ import annotations

import math
import operator
import os
import re
from array import array
from pathlib import Path
from typing import Any

from otelprof.recording import schema
from otelprof.recording.columns import SampleColumns
from otelprof.recording.files import blocks
from otelprof.recording.limits import (
    LINE_ERRORS,
    MAX_CORES,
    MAX_GPU_KEYS,
    MAX_GPUS,
    MAX_LINE_BYTES,
    MAX_STRING_CHARS,
    MAX_TIME_NS,
    check_int,
    loads,
    within,
)
from otelprof.recording.node_lines import read_node_block
from otelprof.recording.packed_lines import read_packed
from otelprof.recording.sample_blocks import KIND, add_block

_PROCESS_SAMPLE = re.compile(r'^(?:\{"t":(\d+),"pid":\d+(?:,"pcpu":([-+0-9.eE]+))?(?:,"rss":(\d+))?\}|(.+))$', re.M)
"""A sample line of a rank that does not sample the node (groups: time, process CPU, RSS), or any other line."""


def parse_samples(path: Path) -> SampleColumns:
    """A rank's samples.jsonl as columns (unusable lines skipped and counted; nothing when it is missing)."""
    c = SampleColumns()
    if not os.path.lexists(path):
        return c
    try:
        for text, over in blocks(path, MAX_LINE_BYTES[schema.SAMPLES]):
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
    """One block of samples.jsonl (text of whole lines): block lines each at once (schema 1.2); sample lines in
    bulk when they are only process samples, a few at a time when they are node samples, else line by line."""
    if _BLOCK_LINE in text:  # schema 1.2 and 1.3: a block of samples per line
        if read_packed(c, text):  # 1.3's lines as the writer writes them, all at once
            return
        for line in text.split("\n"):
            line = line.strip()
            if line:
                _add_sample(c, line)
        return
    rows = _PROCESS_SAMPLE.findall(text)
    if rows and not any(row[3] for row in rows):
        times, pcpu, rss, _ = zip(*rows)
        try:
            t_ns = array("q", map(int, times))
            pcpu_values = array("d", (float(v) if v else math.nan for v in pcpu))
            rss_values = array("d", (float(v) if v else math.nan for v in rss))
            fits = within(t_ns, 0, MAX_TIME_NS) and not any(map(math.isinf, pcpu_values)) \
                and not any(map(math.isinf, rss_values))
        except (ValueError, OverflowError):
            fits = False
        if fits:
            n = len(rows)
            c.t_ns.extend(t_ns)
            c.pcpu.extend(pcpu_values)
            c.rss.extend(rss_values)
            if len(c.cpu_mean):  # the node columns are kept once a line had a node value: NaN for these
                for column in c.node_columns():
                    column.extend(array("d", [math.nan]) * n)
            return
    lines = [line for line in map(str.strip, text.split("\n")) if line]
    for start in range(0, len(lines), NODE_CHUNK):
        chunk = lines[start:start + NODE_CHUNK]
        if len(chunk) > 1 and read_node_block(c, chunk):
            continue
        for line in chunk:
            _add_sample(c, line)


NODE_CHUNK = 32
"""Node lines read in bulk together: few enough that their decoded values stay in the CPU's caches (a whole
block of them at once is slower than line by line)."""


_BLOCK_LINE = f'{{"k":"{KIND}",'
"""How the writer starts a block line."""


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
        if sample.get("k") == KIND:
            add_block(c, sample)
            return
        get = sample.get
        t = check_int(sample["t"], 0, MAX_TIME_NS)
        pcpu, rss, mem, throttled = _value(get("pcpu")), _value(get("rss")), _value(get("mem")), _value(get("thr"))
        container_memory, container_limit = _value(get("cws")), _value(get("cml"))
        cpu, iow = _per_cpu(get("cpu")), _per_cpu(get("iow"))
        disk, net = _pair(get("disk")), _pair(get("net"))
        gpus = _gpu_values(c, get("gpu"))
    except LINE_ERRORS:
        c.skipped_lines += 1
        return
    nan = math.nan
    n = len(c.t_ns)
    c.t_ns.append(t)
    c.pcpu.append(pcpu)
    c.rss.append(rss)
    if not len(c.cpu_mean):  # no node value yet: the node columns stay empty while the lines have none
        if not cpu and not iow and mem != mem and throttled != throttled and container_memory != container_memory \
                and container_limit != container_limit and disk[0] != disk[0] and disk[1] != disk[1] \
                and net[0] != net[0] and net[1] != net[1]:
            _add_gpus(c, gpus, n)
            return
        for column in c.node_columns():
            column.extend(array("d", [nan]) * n)
    c.mem.append(mem)
    c.throttled.append(throttled)
    c.container_memory.append(container_memory)
    c.container_limit.append(container_limit)
    if cpu:
        c.cpu_mean.append(sum(cpu, 0.0) / len(cpu))  # doubles added, whichever parser read them
        c.cpu_max.append(max(cpu))
        c.node_samples += 1
        if len(cpu) > c.cores:
            c.core_busy_sum.extend([0.0] * (len(cpu) - c.cores))
            c.cores = len(cpu)
        c.core_busy_sum[:len(cpu)] = map(operator.add, c.core_busy_sum, cpu)
    else:
        c.cpu_mean.append(nan)
        c.cpu_max.append(nan)
    c.iow_mean.append(sum(iow, 0.0) / len(iow) if iow else nan)
    c.iow_max.append(max(iow) if iow else nan)
    c.disk_read.append(disk[0])
    c.disk_write.append(disk[1])
    c.net_rx.append(net[0])
    c.net_tx.append(net[1])
    _add_gpus(c, gpus, n)


def _add_gpus(c: SampleColumns, gpus: dict[str, dict[str, float]], n: int) -> None:
    """A sample's GPU values, at row ``n`` of their columns."""
    nan = math.nan
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
