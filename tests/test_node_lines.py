"""Node samples read a block at a time give exactly the columns the line-by-line reader gives: for the sampler's
own lines, for lines that vary, and for blocks with hostile lines among them (which the block path leaves to the
line-by-line reader)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otelprof.recording import node_lines, samples
from otelprof.recording.columns import SampleColumns
from tests.sample_columns import columns as _columns

T0 = 1_750_000_001_000_000_000


def _node_line(i: int, rng: random.Random, cores: int = 8, gpus: int = 2) -> dict[str, object]:
    return {"t": T0 + i * 500_000_000, "pid": 7, "pcpu": round(rng.random() * 2, 4), "rss": 8_000_000_000 + i,
            "cpu": [round(rng.random(), 4) for _ in range(cores)],
            "iow": [round(rng.random() / 20, 4) for _ in range(cores)],
            "mem": round(rng.random(), 4), "disk": [i * 1024, i * 512], "net": [i * 10, i * 20], "thr": i // 10,
            "cws": 1e9 + i, "cml": 2e9,
            "gpu": {str(g): {"u": round(rng.random(), 4), "mu": 6e10 + g, "mt": 8e10, "p": 400.5 + g}
                    for g in range(gpus)}}


def _read(blocks: list[str], bulk: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, object], int]:
    """The columns of ``blocks`` (each one block of samples.jsonl), and how many lines the block path took."""
    taken = []

    def counted(c: SampleColumns, lines: list[str]) -> bool:
        done = node_lines.read_node_block(c, lines)
        taken.append(len(lines) if done else 0)
        return done

    monkeypatch.setattr(samples, "read_node_block", counted if bulk else (lambda c, lines: False))
    c = SampleColumns()
    for text in blocks:
        samples._read_samples(c, text)
    monkeypatch.undo()
    return _columns(c), sum(taken)


def _text(lines: list[object]) -> str:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)


def _both(blocks: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, object], int]:
    bulk, taken = _read(blocks, True, monkeypatch)
    lines, _ = _read(blocks, False, monkeypatch)
    assert bulk == lines
    return bulk, taken


def test_the_samplers_node_lines_are_read_in_bulk_to_the_same_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(1)
    blocks = [_text([_node_line(b * 50 + i, rng) for i in range(50)]) for b in range(3)]
    columns, taken = _both(blocks, monkeypatch)
    assert taken == 150
    assert len(columns["t_ns"]) == 150 and columns["node_samples"] == 150  # type: ignore[arg-type]
    assert columns["cores"] == 8 and set(columns["gpus"]) == {"0", "1"}  # type: ignore[arg-type]


def test_blocks_that_change_shape_between_them_read_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """Process-only lines first (the node sampler starts later), then node lines; more cores, a GPU and a GPU
    key appear in a later block; a block without the container keys; a block of lines without disk values."""
    rng = random.Random(2)
    process = _text([{"t": T0 - 10 + i, "pid": 7, "pcpu": 0.5, "rss": 100 + i} for i in range(5)])
    first = _text([_node_line(i, rng) for i in range(10)])
    wider = _text([dict(_node_line(10 + i, rng, cores=16, gpus=3)) for i in range(10)])
    lines = [_node_line(20 + i, rng) for i in range(10)]
    for line in lines:
        del line["cws"], line["cml"], line["disk"]
        line["gpu"]["0"]["clk"] = 1.98e9  # type: ignore[index]
    columns, taken = _both([process, first, wider, _text(lines), process], monkeypatch)
    assert taken == 30
    assert columns["cores"] == 16 and set(columns["gpus"]) == {"0", "1", "2"}  # type: ignore[arg-type]
    assert columns["disk_read"][-15:-5] == ["nan"] * 10  # type: ignore[index]


@pytest.mark.parametrize("bad", [
    '{"t":1,"cpu":[1e400,0]}', '{"t":1,"cpu":[Infinity,0],"iow":[0,0]}', '{"t":"1"}', '{"t":1.5,"cpu":[0]}',
    "not json", '{"t":1,"cpu":[true,0]}', '{"t":1,"cpu":[],"iow":[]}', '{"t":1,"cpu":[0,null]}',
    '{"t":1,"cpu":[0.5],"pcpu":true}', '{"t":1,"cpu":[0.5],"mem":NaN}', '{"t":1,"cpu":[0.5],"disk":[1]}',
    '{"t":1,"cpu":[0.5],"net":[1,null]}', '{"t":1,"cpu":[0.5],"gpu":{"0":{"u":null}}}',
    '{"t":1,"cpu":[0.5],"gpu":{"0":{"u":Infinity}}}', '{"t":1,"cpu":[0.5],"gpu":{"0":{"mu":1,"u":2}}}',
    '{"t":1,"cpu":[0.5],"gpu":{"1":{"u":0.5}}}', '{"t":1,"cpu":[0.5],"gpu":[]}', '{"t":1,"cpu":[0.5],"gpu":null}',
    '{"t":-1,"cpu":[0.5]}', '{"t":18446744073709551616,"cpu":[0.5]}', '[1,2]', '{"t":1,"cpu":"x"}',
    '{"t":1,"cpu":[0.5],"pcpu":1e308,"rss":1e308}', '{"t":1,"cpu":[1e308,1e308]}',
])
def test_a_hostile_line_in_a_block_reads_the_same(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    good = [_node_line(i, rng, cores=2, gpus=1) for i in range(6)]
    columns, _ = _both([_text([*good[:3], bad, *good[3:]])], monkeypatch)
    assert len(columns["t_ns"]) >= 6  # type: ignore[arg-type]


values = (st.floats(allow_infinity=False, width=32) | st.integers(-2**40, 2**40) | st.none() | st.booleans()
          | st.just(1e308))


@settings(max_examples=120, deadline=None, derandomize=True, database=None)
@given(edits=st.lists(st.tuples(st.integers(0, 5),
                                st.sampled_from(["pcpu", "rss", "mem", "thr", "cws", "cml", "cpu", "iow", "disk",
                                                 "net", "gpu", "t"]),
                                values | st.lists(values, max_size=3)
                                | st.dictionaries(st.sampled_from(["0", "1"]),
                                                  st.dictionaries(st.sampled_from(["u", "mu"]), values, max_size=2),
                                                  max_size=2)),
                      max_size=4),
       dropped=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["mem", "disk", "gpu", "cml"])), max_size=3))
def test_any_block_of_varied_node_lines_reads_the_same(edits: list[tuple[int, str, object]],
                                                      dropped: list[tuple[int, str]]) -> None:
    rng = random.Random(4)
    lines = [_node_line(i, rng, cores=3, gpus=2) for i in range(6)]
    for i, key, value in edits:
        lines[i][key] = value
    for i, key in dropped:
        lines[i].pop(key, None)
    with pytest.MonkeyPatch.context() as monkeypatch:
        _both([_text(lines)], monkeypatch)
