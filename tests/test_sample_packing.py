"""samples.jsonl in schema 1.3's blocks: whatever the samples and wherever the blocks are cut, the reader gives the
columns it gives for the same samples one line each (every column exactly; the per-CPU busy sums within the
bound of adding the same numbers in another order), the tools' sample records say the same, and a block that is
not what the writer writes is skipped whole and counted."""

from __future__ import annotations

import base64
import json
import math
import sys
from array import array
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otelprof.recording import limits, schema
from otelprof.recording.columns import SampleColumns
from otelprof.recording.packed_lines import read_packed
from otelprof.recording.sample_blocks import KIND, SampleBlock, decode
from otelprof.recording.sample_packing import MAX_BLOCK_SAMPLES, Packer, _finite, times_within
from otelprof.recording.samples import _add_sample, parse_samples
from otelprof.recording.writer import RecordingWriter
from tests.sample_columns import columns as comparable
from tests.test_sample_blocks import T0, _line, _sample, _samples

U = 2.0**-53
"""The rounding of a double."""


def _packed(samples: list[dict[str, Any]], kept: dict[tuple[str, str], bytes] | None = None) -> dict[str, Any]:
    """The block of ``samples``; ``kept``: what the writer knows of the blocks before (columns that have had one
    value so far are written once)."""
    packer = Packer()
    for sample in samples:
        packer.add(sample)
    return {"k": KIND, **packer.pack({} if kept is None else kept)}


def _read(path: Path, text: str) -> dict[str, Any]:
    path.write_text(text)
    return comparable(parse_samples(path))


def _lines_and_packed(tmp_path: Path, samples: list[dict[str, Any]], cuts: list[int]) -> tuple[dict, dict]:
    bounds = sorted({0, len(samples), *(c % (len(samples) + 1) for c in cuts)})
    lines = _read(tmp_path / "lines.jsonl", "".join(_line(s) + "\n" for s in samples))
    kept: dict[tuple[str, str], bytes] = {}
    blocks = _read(tmp_path / "blocks.jsonl",
                   "".join(_line(_packed(samples[a:b], kept)) + "\n" for a, b in pairwise(bounds) if b > a))
    return lines, blocks


def _assert_same(lines: dict[str, Any], blocks: dict[str, Any], samples: list[dict[str, Any]]) -> None:
    """Every column equal; the per-CPU busy sums within ``2 (N - 1) u sum|s_i|`` of each other (N samples)."""
    busy_lines, busy_blocks = lines.pop("core_busy_sum"), blocks.pop("core_busy_sum")
    assert lines == blocks
    assert len(busy_lines) == len(busy_blocks) == lines["cores"]
    rows = [s["cpu"] for s in samples if s.get("cpu")]
    for core, (a, b) in enumerate(zip(busy_lines, busy_blocks)):
        if a == "nan" or b == "nan":
            assert a == b
            continue
        magnitude = sum(abs(row[core]) for row in rows if len(row) > core)
        assert abs(a - b) <= 2 * max(len(rows) - 1, 0) * U * magnitude


def test_a_node_and_its_processes_read_the_same_as_lines(tmp_path: Path) -> None:
    samples = [_sample(i, node=i >= 7, gpus=2 if i < 30 else 3, cores=4 if i < 40 else 6) for i in range(61)]
    for i, sample in enumerate(samples):
        if "cpu" in sample:
            sample["cpu"] = [round(0.1 * ((i * 7 + k * 3) % 11) + 0.0123, 4) for k in range(len(sample["cpu"]))]
    samples[12]["gpu"]["0"]["pm"] = 123  # a key only some samples have
    del samples[20]["mem"], samples[21]["gpu"], samples[23]["cpu"]
    samples[22]["pcpu"] = float("nan")
    lines, blocks = _lines_and_packed(tmp_path, samples, [5, 20, 40])
    _assert_same(lines, blocks, samples)
    assert blocks["node_samples"] == 53 and blocks["cores"] == 6 and set(blocks["gpus"]) == {"0", "1", "2"}
    assert len(blocks["t_ns"]) == 61 and blocks["skipped_lines"] == 0


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(samples=_samples(), cuts=st.lists(st.integers(0, 12), max_size=4))
def test_any_samples_read_the_same_as_lines_however_the_blocks_are_cut(tmp_path_factory: pytest.TempPathFactory,
                                                                      samples: list[dict[str, Any]],
                                                                      cuts: list[int]) -> None:
    lines, blocks = _lines_and_packed(tmp_path_factory.mktemp("packed"), samples, cuts)
    _assert_same(lines, blocks, samples)


def test_the_per_cpu_sums_differ_from_sample_by_sample_only_by_the_order_of_adding(tmp_path: Path) -> None:
    values = [0.1, 0.7, 0.2, 0.3, 0.9999, 0.0001, 0.4567]
    samples = [{"t": T0 + i, "cpu": [values[i % 7], values[(i * 3) % 7]]} for i in range(2000)]
    lines, blocks = _lines_and_packed(tmp_path, samples, list(range(0, 2000, 20)))
    exact = [math.fsum(s["cpu"][k] for s in samples) for k in range(2)]
    for core in range(2):  # each within the bound of the exact sum; together within the bound of each other
        for found in (lines["core_busy_sum"][core], blocks["core_busy_sum"][core]):
            assert abs(found - exact[core]) <= 1999 * U * exact[core]
    _assert_same(lines, blocks, samples)


def test_tools_get_each_sample_with_its_per_cpu_values_reduced() -> None:
    samples = [_sample(i, node=i % 2 == 0) for i in range(5)]
    samples[1]["gpu"] = {"4": {"u": 0.5}}
    block = json.loads(_line(_packed(samples)))
    records = decode(block)
    assert [r["t"] for r in records] == [s["t"] for s in samples] and {r["pid"] for r in records} == {7}
    node = records[2]
    assert node["cpum"] == sum(samples[2]["cpu"], 0.0) / 4 and node["cpux"] == max(samples[2]["cpu"])
    assert node["iowm"] == sum(samples[2]["iow"], 0.0) / 4 and node["disk"] == [20, 10] and node["net"] == [2, 4]
    assert node["gpu"] == samples[2]["gpu"] and records[1]["gpu"] == {"4": {"u": 0.5}} and "cpum" not in records[1]
    assert records[4]["ncpu"] == 3 and len(records[4]["busy"]) == 4 and records[4]["niow"] == 3
    assert records[4]["busy"][1] == (0.0 + samples[0]["cpu"][1]) + samples[2]["cpu"][1] + samples[4]["cpu"][1]


def test_a_column_is_written_once_while_it_has_had_one_value() -> None:
    kept: dict[tuple[str, str], bytes] = {}
    samples = [_sample(i, node=True) for i in range(12)]
    for i, sample in enumerate(samples):
        sample["gpu"]["0"]["t"] = 40.0 if i < 4 or i >= 8 else 40.0 + i  # varies in the second block only
        sample["gpu"]["1"]["t"] = 50.0 if i < 4 else 51.0  # one value a block, another in the next
        sample["mem"] = -0.0 if i == 1 else 0.0  # bitwise: not one value
    first, second, third = (_packed(samples[a:a + 4], kept) for a in (0, 4, 8))
    positions = [("", name) for name in first["c"]] + [(i, k) for i, keys in first["gpu"].items() for k in keys]
    once = [[positions[j] for j in block.get("same", [])] for block in (first, second, third)]
    assert ("0", "t") in once[0] and ("0", "t") not in once[1] and ("0", "t") not in once[2]  # varied: for good
    assert ("1", "t") in once[0] and ("1", "t") not in once[1] + once[2] and ("", "mem") not in once[0]
    assert ("0", "mt") in once[0] and ("0", "mt") in once[2]
    assert [s["gpu"]["1"]["t"] for s in decode(second)] == [51.0] * 4
    assert [math.copysign(1, s["mem"]) for s in decode(first)] == [1, -1, 1, 1]


def test_the_block_is_smaller_than_its_lists() -> None:
    node = [_sample(i, node=True, gpus=8, cores=64) for i in range(20)]
    for i, sample in enumerate(node):
        sample["cpu"] = [round(0.35 + ((i * 64 + k) * 0.6180339) % 0.65, 4) for k in range(64)]
        sample["iow"] = [round(((i * 64 + k) * 0.31) % 0.04, 4) for k in range(64)]
    process = [{"t": T0 + i * 500_000_000, "pid": 1001, "pcpu": round(0.5 + i / 37, 4), "rss": 8_000_000_000 + i * 10}
               for i in range(20)]
    from otelprof.recording.sample_blocks import encode
    for samples in (node, process):
        assert len(_line(_packed(samples))) < 0.8 * len(_line(encode(samples)))


def test_a_process_killed_or_a_bad_sample_costs_that_sample_only() -> None:
    block = SampleBlock()
    block.add(_sample(0, node=True), 0.0)
    with pytest.raises(TypeError):
        block.add({"t": T0, "cpu": [0.5, "x"]}, 0.0)
    with pytest.raises(TypeError):
        block.add({"t": T0, "gpu": {"0": {"u": "x"}}}, 0.0)
    block.add(_sample(1, node=True), 0.0)
    taken = block.take()
    assert taken is not None and len(decode(taken)) == 2 and decode(taken)[1]["ncpu"] == 2


def _b64(typecode: str, values: list[Any]) -> str:
    packed = array(typecode, values)
    if sys.byteorder == "big":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode()


def _hostile(good: dict[str, Any]) -> list[dict[str, Any]]:
    n = len(decode(good))
    width = len(good["c"]) + sum(map(len, good["gpu"].values())) - len(good["same"])
    inf = _b64("d", [0.5] * (n * width - 1) + [math.inf])
    same, kept = good["same"], good["sv"]
    return [
        {**good, "t": good["t"][:-4] + "!!!!"}, {**good, "t": good["t"][:-1]}, {**good, "t": 5},
        {**good, "t": ""}, {**good, "t": _b64("q", [-1] * n)}, {**good, "t": _b64("q", [2**62 + 1] * n)},
        {**good, "t": _b64("q", [T0] * (MAX_BLOCK_SAMPLES + 1))}, {**good, "t": "é" * 8},
        {**good, "v": good["v"][:-8]}, {**good, "v": inf}, {**good, "v": _b64("d", [-math.inf] * n * width)},
        {**good, "v": [0.5] * n * width}, {**good, "c": good["c"] + ["pcpu"]}, {**good, "c": good["c"][:-1]},
        {**good, "c": [*good["c"][:-1], "nope"]}, {**good, "c": "pcpu"}, {**good, "c": [*good["c"][:-1], ["x"]]},
        {**good, "gpu": {**good["gpu"], "0": ["u", "u", "mt"]}}, {**good, "gpu": {**good["gpu"], "0": "umt"}},
        {**good, "gpu": {**good["gpu"], "0": [1, 2, 3]}}, {**good, "gpu": [1]},
        {**good, "gpu": {str(g): [] for g in range(limits.MAX_GPUS + 1)}},
        {**good, "gpu": {"0": [f"k{i}" for i in range(limits.MAX_GPU_KEYS + 1)]}},
        {**good, "gpu": {"x" * 65: good["gpu"]["0"], "1": good["gpu"]["1"]}},
        {**good, "ncpu": n + 1}, {**good, "ncpu": 0}, {**good, "ncpu": "3"}, {**good, "ncpu": -1},
        {**good, "busy": ""}, {**good, "busy": _b64("d", [0.5] * (limits.MAX_CORES + 1))},
        {**good, "busy": _b64("d", [math.inf, 0, 0, 0])}, {**good, "iowait": good["iowait"] + "A"},
        {**good, "niow": 0.5}, {**good, "t": "A" * (2**20 - 64)},
        {**good, "same": same[::-1]}, {**good, "same": [*same, same[-1]]}, {**good, "same": [-1, *same[1:]]},
        {**good, "same": [*same[:-1], 10**6]}, {**good, "same": [float(j) for j in same]}, {**good, "same": "0"},
        {**good, "sv": kept[:-4]}, {**good, "sv": _b64("d", [math.inf] * len(same))}, {**good, "sv": 1},
        {k: v for k, v in good.items() if k != "sv"}, {k: v for k, v in good.items() if k != "same"},
    ]


def test_every_hostile_block_is_skipped_whole_and_counted(tmp_path: Path) -> None:
    good = _packed([_sample(i, node=True) for i in range(4)])
    assert len(good["same"]) > 3 and good["sv"]  # memory total, node memory: one value in every sample
    hostile = _hostile(good)
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(_line(record) + "\n" for record in [good, *hostile, good]))
    c = parse_samples(path)
    assert len(c.t_ns) == 8 and c.skipped_lines == len(hostile) and c.node_samples == 8 and c.cores == 4
    for record in hostile:  # and the tools' records of it: a clear error, no other exception
        with pytest.raises((ValueError, TypeError, KeyError, OverflowError)):
            decode(json.loads(_line(record)))


def test_an_infinity_is_found_only_where_a_value_starts() -> None:
    inf = array("d", [math.inf]).tobytes() if sys.byteorder == "little" else b"\x00" * 6 + b"\xf0\x7f"
    assert not _finite(b"\x00" * 8 + inf) and not _finite(inf[:6] + b"\xf0\xff")
    assert _finite(b"\x00" * 3 + inf + b"\x00" * 5)  # the bytes of two values that happen to spell one
    assert _finite(array("d", [math.nan, 0.0, -0.0, 1e308, -1e308, 5e-324]).tobytes())


def _one_by_one(text: str) -> dict[str, Any]:
    c = SampleColumns()
    for line in text.split("\n"):
        if line.strip():
            _add_sample(c, line.strip())
    return comparable(c)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(samples=_samples(), cuts=st.lists(st.integers(0, 12), max_size=4), before=_samples())
def test_the_lines_read_at_once_give_what_they_give_one_by_one(samples: list[dict[str, Any]], cuts: list[int],
                                                             before: list[dict[str, Any]]) -> None:
    bounds = sorted({0, len(samples), *(c % (len(samples) + 1) for c in cuts)})
    kept: dict[tuple[str, str], bytes] = {}
    text = "".join(_line(_packed(samples[a:b], kept)) + "\n" for a, b in pairwise(bounds) if b > a)
    c = SampleColumns()
    for sample in before:  # what the rank read before: GPUs, node columns or none
        _add_sample(c, _line(sample))
    expected = _one_by_one("".join(_line(s) + "\n" for s in before) + text)
    if not read_packed(c, text):  # the writer's lines: all at once, unless its samples came from several processes
        assert '"pid":[' in text
        for line in text.splitlines():
            _add_sample(c, line)
    assert comparable(c) == expected


def test_lines_read_at_once_only_when_every_one_is_the_writers(tmp_path: Path) -> None:
    good = _packed([_sample(i, node=True) for i in range(4)])
    assert "same" in good
    variants = [*_hostile(good), {**good, "c": ["pc\\u0070u", *good["c"][1:]]}, {**good, "pid": [7, 7, 7, 7]},
                {**good, "extra": 1}, {"t": T0, "pid": 7}]
    for record in variants:
        text = "".join(_line(r) + "\n" for r in (good, record, good))
        c = SampleColumns()
        assert not read_packed(c, text) and comparable(c) == comparable(SampleColumns())
        path = tmp_path / "samples.jsonl"
        assert _read(path, text) == _one_by_one(text)  # one by one: the bad line skipped and counted
    escaped = _line(good).replace('"pcpu"', '"pc\\u0070u"')  # JSON the writer does not write, read the same
    assert _one_by_one(escaped) == _one_by_one(_line(good))


def test_the_times_range_is_checked_in_c() -> None:
    for times, inside in (([0, 2**62 - 1], True), ([2**62], True), ([2**62 + 1], False), ([-1], False),
                          ([5, 2**63 - 1], False), ([T0] * 20, True)):
        assert times_within(array("q", times)) is inside


def test_the_writer_drops_and_counts_a_sample_that_is_not_numbers(tmp_path: Path) -> None:
    dropped: list[int] = []
    writer = RecordingWriter(tmp_path, {"rank": 0}, on_dropped=dropped.append, on_written=lambda n: None)
    writer.add_sample(_sample(0, node=True))
    for bad in ({"t": "1"}, {"t": -5}, {"t": 2**63}, {"t": T0, "cpu": [0.5, None]}, {"t": T0, "gpu": {"0": 1}},
                {"t": T0, "disk": [1, 2, 3]}, {"t": T0, "rss": "x"}, {"t": T0, "gpu": {"0": {"u": [1]}}}):
        writer.add_sample(bad)
    writer.add_sample(_sample(1, node=True))
    writer.close()
    c = parse_samples(tmp_path / schema.SAMPLES)
    assert dropped == [1] * 8 and len(c.t_ns) == 2 and c.node_samples == 2 and c.skipped_lines == 0


def test_blocks_whose_columns_written_once_differ_read_at_once_as_one_by_one() -> None:
    first = [_sample(i, node=True) for i in range(4)]
    second = [{**_sample(i, node=True), "mem": 0.75} for i in range(4, 7)]  # written once, another value
    text = _line(_packed(first)) + "\n" + _line(_packed(second)) + "\n"  # each block as a writer's first
    c = SampleColumns()
    assert read_packed(c, text) and comparable(c) == _one_by_one(text)
    assert list(c.mem) == [0.5] * 4 + [0.75] * 3
