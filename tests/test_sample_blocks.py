"""samples.jsonl in blocks (schema 1.2's lists here, 1.3's in test_sample_packing): whatever the samples and
wherever the blocks are cut, the reader gives exactly the columns it gives for the same samples one line each; the
writer writes blocks when full, old or asked, and a killed process loses at most the block it was filling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otelprof.recording import schema
from otelprof.recording.reader import read_recording
from otelprof.recording.sample_blocks import BLOCK_SAMPLES, BLOCK_SECONDS, SampleBlock, decode, encode
from otelprof.recording.samples import parse_samples
from otelprof.recording.writer import RecordingWriter
from tests.sample_columns import columns as comparable
from tests.sample_records import sample_records

T0 = 1_750_000_001_000_000_000
ROOT = Path(__file__).resolve().parents[1]


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))


def _columns(path: Path) -> dict[str, object]:
    return comparable(parse_samples(path))


def _as_lines_and_blocks(tmp_path: Path, samples: list[dict[str, Any]], cuts: list[int]) -> tuple[dict, dict]:
    lines, blocks = tmp_path / "lines.jsonl", tmp_path / "blocks.jsonl"
    lines.write_text("".join(_line(s) + "\n" for s in samples))
    bounds = sorted({0, len(samples), *(c % (len(samples) + 1) for c in cuts)})
    blocks.write_text("".join(_line(encode(samples[a:b])) + "\n" for a, b in pairwise(bounds) if b > a))
    return _columns(lines), _columns(blocks)


def _sample(i: int, node: bool, gpus: int = 2, cores: int = 4) -> dict[str, Any]:
    sample: dict[str, Any] = {"t": T0 + i * 500_000_000, "pid": 7, "pcpu": 0.25 * (i % 5), "rss": 1e9 + i}
    if node:
        sample |= {"cpu": [round(0.1 * ((i + k) % 10), 4) for k in range(cores)],
                   "iow": [0.01 * k for k in range(cores)], "mem": 0.5, "disk": [i * 10, i * 5],
                   "net": [i, 2 * i], "thr": i // 3,
                   "gpu": {str(g): {"u": 0.9 - 0.1 * g, "mu": 6e10 + i, "mt": 8e10} for g in range(gpus)}}
    return sample


def test_a_sampled_run_reads_the_same_as_lines_and_as_blocks(tmp_path: Path) -> None:
    samples = [_sample(i, node=i >= 7, gpus=2 if i < 30 else 3, cores=4 if i < 40 else 6) for i in range(61)]
    samples[12]["gpu"]["0"]["pm"] = 123  # a key only some samples have
    del samples[20]["mem"], samples[21]["gpu"]
    samples[22]["pcpu"] = float("nan")
    lines, blocks = _as_lines_and_blocks(tmp_path, samples, [5, 20, 40])
    assert lines == blocks
    assert blocks["node_samples"] == 54 and blocks["cores"] == 6 and set(blocks["gpus"]) == {"0", "1", "2"}  # type: ignore[arg-type]
    assert len(blocks["t_ns"]) == 61  # type: ignore[arg-type]


finite = st.floats(allow_nan=False, allow_infinity=False, width=32)
value = finite | st.integers(0, 2**40) | st.just(float("nan"))


@st.composite
def _samples(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    node_from = draw(st.integers(0, 12))
    for i in range(draw(st.integers(1, 12))):
        sample: dict[str, Any] = {"t": T0 + i}
        for key in ("pid", "pcpu", "rss"):
            if draw(st.booleans()):
                sample[key] = draw(value)
        if i >= node_from:
            for key in ("mem", "thr", "cws", "cml"):
                if draw(st.booleans()):
                    sample[key] = draw(value)
            for key in ("cpu", "iow"):
                if draw(st.booleans()):
                    sample[key] = draw(st.lists(value, max_size=4))
            for key in ("disk", "net"):
                if draw(st.booleans()):
                    sample[key] = draw(st.lists(value, min_size=2, max_size=2))
            if draw(st.booleans()):
                sample["gpu"] = draw(st.dictionaries(st.sampled_from("012"),
                                                     st.dictionaries(st.sampled_from(["u", "mu", "p"]), value,
                                                                     max_size=3), max_size=3))
        out.append(sample)
    return out


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(samples=_samples(), cuts=st.lists(st.integers(0, 12), max_size=4))
def test_any_samples_read_the_same_however_the_blocks_are_cut(tmp_path_factory: pytest.TempPathFactory,
                                                             samples: list[dict[str, Any]], cuts: list[int]) -> None:
    lines, blocks = _as_lines_and_blocks(tmp_path_factory.mktemp("blocks"), samples, cuts)
    assert lines == blocks


def test_decode_gives_back_the_samples() -> None:
    samples = [_sample(i, node=i % 2 == 0) for i in range(5)]
    samples[1]["gpu"] = {"4": {"u": 0.5}}
    assert decode(json.loads(_line(encode(samples)))) == samples


def test_a_bad_block_is_skipped_whole_and_counted(tmp_path: Path) -> None:
    good = encode([_sample(i, node=True) for i in range(4)])
    path = tmp_path / "samples.jsonl"
    bad = {**good, "rss": good["rss"][:-1]}  # a column of the wrong length
    path.write_text(_line(good) + "\n" + _line(bad) + "\n" + _line({**good, "t": [T0 + 9] * 4}) + "\n")
    c = parse_samples(path)
    assert len(c.t_ns) == 8 and c.skipped_lines == 1 and c.node_samples == 8


def test_the_block_is_written_when_full_old_or_asked() -> None:
    block = SampleBlock()
    assert all(block.add(_sample(i, node=False), 100.0) is None for i in range(BLOCK_SAMPLES - 1))
    full = block.add(_sample(99, node=False), 100.0)
    assert full is not None and len(decode(full)) == BLOCK_SAMPLES and len(block) == 0
    block.add(_sample(0, node=False), 200.0)
    assert not block.due(200.0 + BLOCK_SECONDS - 0.1) and block.due(200.0 + BLOCK_SECONDS)
    wide = SampleBlock()  # thousands of CPUs: smaller blocks
    assert wide.add(_sample(0, node=True, cores=12_000), 0.0) is not None
    assert block.take() is not None and block.take() is None


def test_the_writer_writes_blocks_and_the_rest_at_a_complete_flush(tmp_path: Path) -> None:
    writer = RecordingWriter(tmp_path, {"rank": 0}, on_dropped=lambda n: None, on_written=lambda n: None)
    for i in range(BLOCK_SAMPLES + 3):
        writer.add_sample(_sample(i, node=True))
    writer.flush(complete=False)  # the periodic flush: the full block only
    path = tmp_path / schema.SAMPLES
    assert len(sample_records(path)) == BLOCK_SAMPLES
    writer.flush()
    assert len(sample_records(path)) == BLOCK_SAMPLES + 3
    writer.close()
    assert len(parse_samples(path).t_ns) == BLOCK_SAMPLES + 3


_KILLED = """
import sys, time
import otelprof
otelprof.init(job_name="blocks", record_dir=sys.argv[1], sample_interval=0.1)
for step in range(1000):
    with otelprof.step():
        time.sleep(0.01)
    if step == 20:
        print("ready", flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_process_loses_at_most_the_block_it_was_filling(tmp_path: Path, sig: signal.Signals) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL", "TORCHELASTIC"))}
    env["PYTHONPATH"] = str(ROOT)
    child = subprocess.Popen([sys.executable, "-c", _KILLED, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 60  # until the first block is written (a loaded machine takes its time), then 2 s
    while time.monotonic() < deadline and not any(p.stat().st_size
                                                  for p in tmp_path.glob(f"*/rank-0/{schema.SAMPLES}")):
        time.sleep(0.1)
    time.sleep(2.0)
    child.send_signal(sig)
    child.wait(30)
    rank = next(tmp_path.glob("*/rank-0"))
    samples = read_recording(rank, samples=True).ranks[0].sample_columns()
    times = sample_records(rank / schema.SAMPLES)
    assert len(samples.t_ns) == len(times) and samples.skipped_lines == 0
    last = times[-1]["t"] / 1e9
    lost = time.time() - last  # the samples not written: at most a block's (20 samples of 0.1 s), and since the kill
    assert len(times) >= 20 and lost < BLOCK_SAMPLES * 0.1 + 5.0
    if sig == signal.SIGTERM:  # flushed on the signal: nothing held back
        assert lost < 5.0
