"""Property-based fuzzing of the recording reader (a fixed, small number of examples each, derandomized:
seconds in CI): mutated lines and manifests are either read, with every unusable line skipped and
counted, or refused with the reader's one error type, RecordingError; what is read can be analyzed."""

from __future__ import annotations

import base64
import json
import math
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otelprof.analysis.report import build_report, report_dict
from otelprof.recording import samples, schema
from otelprof.recording.columns import SampleColumns
from otelprof.recording.errors import RecordingError
from otelprof.recording.files import blocks, lines_backwards
from otelprof.recording.ranks import RankRecording
from otelprof.recording.reader import read_recording
from otelprof.recording.steps import parse_line
from otelprof.report.html import render
from otelprof.report.timeline import build_timeline, write_timeline
from tests.malformed_recordings import RUN_ID, record_base
from tests.sample_columns import columns as comparable

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_base(tmp_path_factory.mktemp("fuzz-base"))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _fresh(base: Path, scratch: Path) -> Path:
    run = scratch / RUN_ID
    if run.exists():
        shutil.rmtree(run)
    shutil.copytree(base, run)
    return run


def _nonblank(data: bytes) -> int:
    return sum(1 for line in data.decode("utf-8", errors="replace").split("\n") if line.strip())


@st.composite
def line_mutations(draw: st.DrawFn, lines: list[str]) -> tuple[int, bytes]:
    """(index of the line changed, its new bytes): a field replaced by any JSON value, bytes flipped,
    cut, or inserted, or the line replaced by any JSON value."""
    index = draw(st.integers(0, len(lines) - 1))
    line = lines[index]
    how = draw(st.sampled_from(["field", "bytes", "cut", "insert", "value"]))
    if how == "field":
        record = json.loads(line)
        key = draw(st.sampled_from(sorted(record)))
        record[key] = draw(json_values)
        return index, json.dumps(record).encode()
    raw = bytearray(line.encode())
    if how == "bytes":
        for _ in range(draw(st.integers(1, 4))):
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255).filter(lambda b: b != 10))
    elif how == "cut":
        raw = raw[:draw(st.integers(0, len(raw) - 1))]
    elif how == "insert":
        at = draw(st.integers(0, len(raw)))
        raw[at:at] = draw(st.sampled_from([b"1e400", b"NaN", b"[" * 5000, b'"\\ud800"', b"\xff\xfe", b",", b"}",
                                           b'{"k":"s"', b"99999999999999999999999"]))
    else:
        raw = bytearray(json.dumps(draw(json_values)).encode())
    return index, bytes(raw)


_PACKED_VALUES = [struct.pack("<d", math.inf), struct.pack("<d", -math.inf), struct.pack("<d", math.nan),
                  struct.pack("<q", 2**62 + 1), struct.pack("<q", -1), b"\x00\x00\x00\x00\x00\x00\xf0"]


@st.composite
def packed_mutations(draw: st.DrawFn, lines: list[str]) -> tuple[int, bytes]:
    """(index of a schema 1.3 block line, its new bytes): one of its packed fields with a character replaced, cut,
    padded, or with a value's bytes replaced (an infinity, a NaN, a time out of range, a length off)."""
    index = draw(st.sampled_from([i for i, line in enumerate(lines) if line.startswith('{"k":"b","t":"')]))
    record = json.loads(lines[index])
    key = draw(st.sampled_from([key for key in ("t", "v", "sv", "busy", "iowait") if key in record]))
    text = record[key]
    how = draw(st.sampled_from(["char", "cut", "pad", "value"]))
    if how == "char":
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + draw(st.sampled_from(list("A/+=-_ .\u00e9\\\"\n"))) + text[at + 1:]
    elif how == "cut":
        text = text[:draw(st.integers(0, len(text)))]
    elif how == "pad":
        text += draw(st.sampled_from(["=", "==", "AAAA", "AAAAAAAAAAA="]))
    else:
        raw = bytearray(base64.b64decode(text))
        at = draw(st.integers(0, max(len(raw) // 8 - 1, 0))) * 8
        raw[at:at + 8] = draw(st.sampled_from(_PACKED_VALUES))
        text = base64.b64encode(bytes(raw)).decode()
    record[key] = text
    return index, json.dumps(record, separators=(",", ":")).encode()


def _mutated_file(base: Path, scratch: Path, file: str, data: st.DataObject) -> tuple[Path, int]:
    """A fresh copy of the base run with one line of rank 0's ``file`` mutated; returns the run and the
    file's non-blank lines."""
    run = _fresh(base, scratch)
    path = run / "rank-0" / file
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    index, new = data.draw(line_mutations(lines))
    content = b"\n".join(new if i == index else line.encode() for i, line in enumerate(lines)) + b"\n"
    path.write_bytes(content)
    return run, _nonblank(content)


@FUZZ
@given(data=st.data())
def test_mutated_step_lines_are_read_or_skipped_and_counted(base_run: Path, scratch: Path, data: st.DataObject) -> None:
    run, lines = _mutated_file(base_run, scratch, schema.STEPS, data)
    rank = read_recording(run, samples=True).ranks[0]
    # The oracle: every line on its own through the JSON path. Each is one record, or one skipped line,
    # or a device-time record (several device times, or none); the bulk read gives the same.
    oracle = RankRecording(rank.path, rank.manifest)
    records = 0
    text = (rank.path / schema.STEPS).read_bytes().decode("utf-8", errors="replace")
    for line in filter(None, (line.strip() for line in text.split("\n"))):
        before = _counts(oracle)
        parse_line(line, oracle)
        grown = [after - was for after, was in zip(_counts(oracle), before)]
        assert sum(grown[:5]) <= 1 and all(g >= 0 for g in grown)
        records += 1
    assert records == lines
    assert _counts(rank)[:5] == _counts(oracle)[:5] and rank.device_times == oracle.device_times
    assert [(s.phase, s.number, s.start_ns, s.duration_ns, s.annotations, s.error) for s in rank.steps] == \
        [(s.phase, s.number, s.start_ns, s.duration_ns, s.annotations, s.error) for s in oracle.steps]
    assert [sorted(s.scalars) for s in rank.steps] == [sorted(s.scalars) for s in oracle.steps]
    assert (rank.annotations, rank.scalars, rank.phases) == (oracle.annotations, oracle.scalars, oracle.phases) \
        or math.nan in [v for *_, v in rank.scalars]
    _analyze(run)


def _counts(rank: RankRecording) -> list[int]:
    return [len(rank.steps), len(rank.annotations), len(rank.scalars), len(rank.phases), rank.skipped_lines,
            len(rank.device_times)]


@FUZZ
@given(data=st.data(), file=st.sampled_from([schema.SAMPLES, schema.PROFILES, schema.METRICS, schema.SPANS]))
def test_mutated_lines_of_the_other_files_are_read_or_skipped(base_run: Path, scratch: Path, data: st.DataObject,
                                                              file: str) -> None:
    run, lines = _mutated_file(base_run, scratch, file, data)
    rank = read_recording(run, samples=True).ranks[0]
    if file == schema.SAMPLES:  # the oracle: each line on its own (a block line holds several samples)
        read = skipped = 0
        text = (rank.path / schema.SAMPLES).read_bytes().decode("utf-8", errors="replace")
        for line in filter(None, (line.strip() for line in text.split("\n"))):
            alone = SampleColumns()
            samples._add_sample(alone, line)
            read, skipped = read + len(alone), skipped + alone.skipped_lines
        assert (len(rank.sample_columns()), rank.skipped_lines) == (read, skipped)
        assert read + skipped >= lines
    elif file == schema.PROFILES:
        assert len(list(rank.profiles())) + rank.skipped_lines == lines
    elif file == schema.SPANS:
        list(rank.spans())
        assert rank.skipped_lines <= lines
    else:
        rank.last_metric_snapshot()
        assert sum(1 for _ in rank.metric_snapshots()) + rank.skipped_lines == lines
    _analyze(run)


@FUZZ
@given(data=st.data())
def test_mutated_packed_sample_fields_read_as_line_by_line(base_run: Path, scratch: Path, data: st.DataObject) -> None:
    """A schema 1.3 block with a bad packed field is skipped whole; every other line reads as it reads alone."""
    run = _fresh(base_run, scratch)
    path = run / "rank-0" / schema.SAMPLES
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    index, new = data.draw(packed_mutations(lines))
    path.write_bytes(b"\n".join(new if i == index else line.encode() for i, line in enumerate(lines)) + b"\n")
    rank = read_recording(run, samples=True).ranks[0]
    oracle = SampleColumns()
    for line in path.read_bytes().decode("utf-8", errors="replace").split("\n"):
        if line.strip():
            samples._add_sample(oracle, line.strip())
    assert comparable(rank.sample_columns()) == comparable(oracle)
    assert rank.skipped_lines == oracle.skipped_lines <= 1
    _analyze(run)


@FUZZ
@given(key=st.sampled_from(["schema_version", "run_id", "rank", "local_rank", "world_size", "status", "resource",
                            "config", "lifecycle", "dropped", "lifecycle.init", "lifecycle.process_start",
                            "config.outlier_sigma", "config.outlier_min_steps", "config.job_name", "new"]),
       value=json_values)
def test_mutated_manifest_is_read_or_refused_with_recording_error(base_run: Path, scratch: Path, key: str,
                                                                  value: Any) -> None:
    run = _fresh(base_run, scratch)
    path = run / "rank-0" / schema.MANIFEST
    manifest = json.loads(path.read_text())
    where = manifest
    *parents, last = key.split(".")
    for parent in parents:
        where = where[parent]
    where[last] = value
    path.write_text(json.dumps(manifest))
    try:
        read_recording(run)
    except RecordingError as exc:
        assert "\n" not in str(exc)
        return
    _analyze(run)


@FUZZ
@given(text=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_manifest_bytes_are_read_or_refused_with_recording_error(base_run: Path, scratch: Path,
                                                                     text: bytes) -> None:
    run = _fresh(base_run, scratch)
    (run / "rank-0" / schema.MANIFEST).write_bytes(text)
    with pytest.raises(RecordingError):
        read_recording(run)  # none of these has a schema_version of major 1


def _analyze(run: Path) -> None:
    """What the commands do with a recording that was read: none of it may raise."""
    recording = read_recording(run, samples=True, regions=True)
    report = build_report(recording)
    assert report.rules.error is None, report.rules.error
    render(report)
    json.dumps(report_dict(report), allow_nan=False)
    write_timeline(build_timeline(recording), run / "trace.json")


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(lengths=st.lists(st.integers(0, 40), max_size=30), limit=st.integers(1, 24), final_newline=st.booleans())
def test_blocks_and_backwards_lines_skip_exactly_the_lines_past_the_limit(tmp_path_factory: pytest.TempPathFactory,
                                                                         lengths: list[int], limit: int,
                                                                         final_newline: bool) -> None:
    lines = [(b"%d" % i * 40)[:n] or b"" for i, n in enumerate(lengths)]
    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    path = tmp_path_factory.mktemp("blocks") / "file.jsonl"
    path.write_bytes(data)
    kept = [line for line in lines if len(line) <= limit]
    over = sum(1 for line in lines if len(line) > limit)
    texts, skipped = [], 0
    for text, n in blocks(path, limit):
        texts.append(text)
        skipped += n
    assert skipped == over
    assert "".join(texts).split("\n")[:len(kept)] == [k.decode() for k in kept]
    assert [x for x in "".join(texts).split("\n") if x] == [k.decode() for k in kept if k]
    with open(path, "rb") as handle:
        backwards = list(lines_backwards(handle, limit, chunk=max(1, limit // 3)))
    assert [x for x in backwards if x is not None] == [k for k in reversed(kept) if k.strip()]
    assert backwards.count(None) == sum(1 for line in lines if len(line) > limit and line.strip())
