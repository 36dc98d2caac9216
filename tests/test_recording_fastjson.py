"""The reader's optional fast JSON path (orjson, the "fast" extra) reads exactly what the json module
reads: every line it accepts gives the same columns, every line it refuses goes to the json module."""

from __future__ import annotations

import json
import math
from pathlib import Path

import orjson  # noqa: F401  the fast path must be importable where the tests run
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otelprof.recording import limits
from otelprof.recording.samples import parse_samples
from tests.sample_columns import columns as _columns

NODE_LINE = {"t": 1_750_000_001_000_000_000, "pid": 7, "pcpu": 1.25, "rss": 8_000_000_000,
             "cpu": [0.5, 0.25, 1, 0], "iow": [0.01, 0.0, 0.02, 0], "mem": 0.5, "thr": 0,
             "disk": [1024.5, 0], "net": [10, 20.25], "cws": 1e9, "cml": 2e9,
             "gpu": {"0": {"util": 0.9, "mem": 0.5}, "1": {"util": 0.1, "mem": 0.25}}}

HOSTILE = [
    '{"t":1,"pcpu":NaN}', '{"t":1,"pcpu":Infinity}', '{"t":1,"pcpu":1e400}', '{"t":1,"cpu":[1e400,0]}',
    '{"t":18446744073709551616}', '{"t":-9223372036854775809}', '{"t":1,"rss":18446744073709551616}',
    '{"t":1,"cpu":[100000000000000000000000,1]}', '{"t":1,"gpu":{"0":{"util":"x"}}}', '{"t":1,"s":"\\ud800"}',
    '{"t":1,"s":"\udcff"}', '[' * 1500 + ']' * 1500, '{"t":1,"cpu":[1,]}', '{"t":1,"t":2}', '"text"', "null",
    '{"t":1,"gpu":{"0":{"util":0.5}},"gpu":{}}', '{"t":1.5}', '{"t":-1}', '{"t":1,"disk":[1,2,3]}',
]


def _both(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, object], dict[str, object]]:
    path = tmp_path / "samples.jsonl"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    fast = _columns(parse_samples(path))
    monkeypatch.setattr(limits, "_fast_loads", None)
    plain = _columns(parse_samples(path))
    monkeypatch.undo()
    return fast, plain


def test_the_fast_path_is_taken_where_it_is_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert limits._fast_loads is not None
    assert limits.loads(json.dumps(NODE_LINE), exact=False) == NODE_LINE
    decoded: list[object] = []
    fast = limits._fast_loads
    monkeypatch.setattr(limits, "_fast_loads", lambda text: decoded.append(fast(text)) or decoded[-1])
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps(NODE_LINE) + "\n" + json.dumps(dict(NODE_LINE, t=NODE_LINE["t"] + 1)) + "\n")
    assert len(parse_samples(path).t_ns) == 2
    assert len(decoded) == 2  # the node lines went through orjson


def test_values_only_the_json_module_reads_are_read_as_before() -> None:
    assert math.isnan(limits.loads('{"a":NaN}', exact=False)["a"])
    assert limits.loads("1e400", exact=False) == math.inf
    with pytest.raises(ValueError):
        limits.loads('"\\ud800"', exact=False)
    with pytest.raises(ValueError):
        limits.loads("[" * 5000 + "]" * 5000, exact=False)


def test_node_lines_with_hostile_lines_among_them_read_the_same(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    lines = []
    for i, bad in enumerate(HOSTILE):
        good = dict(NODE_LINE, t=NODE_LINE["t"] + i * 500_000_000)  # type: ignore[operator]
        lines += [json.dumps(good), bad]
    fast, plain = _both(tmp_path, "\n".join(lines) + "\n", monkeypatch)
    assert fast == plain
    assert fast["skipped_lines"] > 0 and len(fast["t_ns"]) >= len(HOSTILE)  # type: ignore[arg-type]


numbers = (st.integers(min_value=-2**70, max_value=2**70) | st.floats(allow_nan=False, allow_infinity=False)
           | st.none() | st.text(max_size=3))


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(edits=st.lists(st.tuples(st.sampled_from(["t", "pcpu", "rss", "mem", "thr", "cws", "cml", "cpu", "iow",
                                                  "disk", "net", "gpu"]),
                                numbers | st.lists(numbers, max_size=5)
                                | st.dictionaries(st.sampled_from(["0", "1"]),
                                                  st.dictionaries(st.sampled_from(["util", "mem"]), numbers,
                                                                  max_size=2), max_size=2)),
                      min_size=1, max_size=4),
       spelled=st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "123456789012345678901234"]))
def test_any_mutated_node_line_reads_the_same_either_way(tmp_path_factory: pytest.TempPathFactory,
                                                        edits: list[tuple[str, object]], spelled: str) -> None:
    line = dict(NODE_LINE)
    for key, value in edits:
        line[key] = value
    text = json.dumps(line) + "\n" + json.dumps(NODE_LINE).replace("1.25", spelled) + "\n"
    tmp_path = tmp_path_factory.mktemp("fastjson")
    with pytest.MonkeyPatch.context() as monkeypatch:
        fast, plain = _both(tmp_path, text, monkeypatch)
    assert fast == plain
