"""The reader's columnar fast path (bulk parsing of the recorder's own step format) gives exactly what
parsing every line as JSON gives, for awkward names and values too; samples become columns."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from otelprof.recording import limits, schema, steps
from otelprof.recording.ranks import RankRecording
from otelprof.recording.reader import read_recording
from otelprof.recording.records import Annotation, Step
from otelprof.recording.steps import _read_steps_slowly as steps_read_slowly
from otelprof.recording.steps import parse_line
from tests.test_report_fixtures import NS, T0, dumps, manifest, small_run, step_line, write_lines, write_rank

AWKWARD = ["a,b", "x],[y", 'quo"te', "back\\slash", "ünïcode", "[br", "br]", "", "a:b", '"', "},{"]


def _slow(path: Path) -> RankRecording:
    """The same rank parsed line by line through JSON (the reader's fallback)."""
    rank = RankRecording(path, json.loads((path / schema.MANIFEST).read_text()))
    for line in (path / schema.STEPS).read_text().splitlines():
        if line.strip():
            parse_line(line, rank)
    return rank


def _same(a: RankRecording, b: RankRecording) -> None:
    assert len(a.steps) == len(b.steps)
    for x, y in zip(a.steps, b.steps):
        assert (x.phase, x.number, x.start_ns, x.duration_ns, x.error) == (y.phase, y.number, y.start_ns,
                                                                          y.duration_ns, y.error)
        assert x.annotations == y.annotations
        assert x.scalars.keys() == y.scalars.keys()
        for k in x.scalars:
            assert x.scalars[k] == y.scalars[k] or (math.isnan(x.scalars[k]) and math.isnan(y.scalars[k]))
    assert a.annotations == b.annotations and a.phases == b.phases and a.scalars == b.scalars


def _recorder_line(phase: str, number: int, start: int, duration: int, regions: list[tuple[str, int, int, int]],
                   scalars: dict[str, float], error: str | None = None) -> str:
    """A step line formatted like otelprof.runtime.recorder.Recorder._step_line."""
    parts = [f'{{"k":"s","ph":{json.dumps(phase)},"n":{number},"t":{start},"d":{duration}']
    if regions:
        parts.append(',"a":[' + ",".join(f"[{json.dumps(n)},{o},{d},{depth}]" for n, o, d, depth in regions) + "]")
    if scalars:
        parts.append(',"x":{' + ",".join(f"{json.dumps(k)}:{v!r}" if math.isfinite(v) else f'{json.dumps(k)}:"{v}"'
                                         for k, v in scalars.items()) + "}")
    if error:
        parts.append(f',"err":{json.dumps(error)}')
    return "".join(parts) + "}"


def test_fast_path_matches_json_for_plain_steps(tmp_path: Path) -> None:
    run = small_run(tmp_path)
    fast = read_recording(run).ranks[0]
    assert fast.step_columns.ann_names == ["dataloader", "forward", "backward"]
    _same(fast, _slow(run / "rank-0"))
    step = fast.steps[19]
    assert step.duration == 1.0 and step.annotations[0].name == "dataloader"
    assert step.annotations[0].start_ns == step.start_ns and step.annotations[0].phase == "train"
    assert fast.steps[-1].phase == "eval" and fast.steps[-1] == fast.steps[24]
    assert [s.number for s in fast.steps[18:21]] == [18, 19, 0]
    with pytest.raises(IndexError):
        fast.steps[25]
    first = fast.steps[0]  # made without the dataclass __init__: must be the same value
    start = first.start_ns
    expected = Step("train", 0, start, 100_000_000, (
        Annotation("dataloader", start, 20_000_000, 0, "train"), Annotation("forward", start + 20_000_000, 30_000_000,
                                                                            0, "train"),
        Annotation("backward", start + 50_000_000, 40_000_000, 0, "train")), {"loss": 2.0, "samples": 32.0}, None)
    assert first == expected and repr(first) == repr(expected)
    assert hash(first.annotations[1]) == hash(expected.annotations[1])
    with pytest.raises(AttributeError):
        first.number = 3  # type: ignore[misc]


@pytest.mark.parametrize("name", AWKWARD)
def test_awkward_region_and_scalar_names_parse_like_json(tmp_path: Path, name: str) -> None:
    directory = write_rank(tmp_path / "run", 0, manifest(), [])
    start = int(T0 * NS)
    lines = [
        _recorder_line("train", 0, start, 100, [("forward", 1, 50, 0), (name, 60, 30, 1)],
                       {"loss": 1.5, name: 2.0, "g": math.nan}),
        _recorder_line(name or "p", 1, start + 200, 100, [(name, 0, 10, 0)], {"loss": math.inf}, "ValueError"),
        _recorder_line("train", 2, start + 400, 100, [], {}),
    ]
    write_lines(directory / schema.STEPS, lines)
    fast = read_recording(directory).ranks[0]
    slow = _slow(directory)
    _same(fast, slow)
    assert fast.steps[0].annotations[1].name == name and fast.steps[0].scalars[name] == 2.0
    assert math.isnan(fast.steps[0].scalars["g"]) and fast.steps[1].scalars["loss"] == math.inf
    assert fast.steps[1].error == "ValueError" and fast.steps[2].annotations == ()


@pytest.mark.parametrize("name", AWKWARD)
def test_awkward_region_names_alone_parse_like_json(tmp_path: Path, name: str) -> None:
    """A name only among the regions (the scalars' names do not send the block to the JSON path)."""
    directory = write_rank(tmp_path / "run", 0, manifest(), [])
    start = int(T0 * NS)
    write_lines(directory / schema.STEPS, [
        _recorder_line("train", 0, start, 100, [("forward", 1, 50, 0), (name, 60, 30, 1), ("backward", 1, 2, 0)],
                       {"loss": 1.5}),
        _recorder_line("train", 1, start + 200, 100, [(name, 0, 10, 0)], {"loss": 1.0})])
    fast = read_recording(directory).ranks[0]
    _same(fast, _slow(directory))
    assert [a.name for a in fast.steps[0].annotations] == ["forward", name, "backward"]


def test_other_layouts_and_corrupt_lines(tmp_path: Path) -> None:
    directory = write_rank(tmp_path / "run", 0, manifest(), [step_line("train", 0, T0, 0.1)])
    write_lines(directory / schema.STEPS, [
        json.dumps({"k": "s", "ph": "train", "n": 1, "t": int(T0 * NS) + 10**8, "d": 5, "x": {"loss": 1.0}}),  # spaces
        dumps({"k": "x", "name": "lr", "v": 0.1, "ph": "train", "t": 5}),
        '{"k":"s","ph":"train","n":2,"t":1,"d":',  # truncated
        "garbage",
    ])
    rank = read_recording(directory).ranks[0]
    assert [s.number for s in rank.steps] == [0, 1]
    assert rank.scalars == [(5, "train", "lr", 0.1)]
    assert rank.skipped_lines == 2


def test_truncated_last_step_line_is_skipped_and_counted(tmp_path: Path) -> None:
    run = small_run(tmp_path)
    with open(run / "rank-0" / schema.STEPS, "a") as handle:
        handle.write('{"k":"s","ph":"train","n":20,"t":17000000')  # a killed writer
    rank = read_recording(run).ranks[0]
    assert len(rank.steps) == 25 and rank.skipped_lines == 1
    assert rank.step_columns.ann_names == ["dataloader", "forward", "backward"]  # still the fast path


def test_sample_columns(tmp_path: Path) -> None:
    run = small_run(tmp_path)
    write_lines(run / "rank-0" / schema.SAMPLES, ['{"t":1,"cpu":[0.5', '{"t":"x"}', '{"t":2,"cpu":"bad"}'])
    recording = read_recording(run, samples=True)
    rank = recording.ranks[0]
    c = rank.sample_columns()
    assert len(c) == 10 and c.cores == 4 and c.node_samples == 10 and c.skipped_lines == 3
    assert list(c.cpu_mean) == pytest.approx([(i + 1) / 10 for i in range(10)])
    assert c.iow_max[9] == 0.6 and c.iow_mean[9] == pytest.approx(0.15)
    assert list(c.gpus["1"]["u"]) == pytest.approx([(9 - i) / 10 for i in range(10)])
    assert c.core_busy_sum == pytest.approx([5.5] * 4)
    assert recording.skipped_lines == 3


def test_process_only_samples_in_bulk_and_gpus_that_come_and_go(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_rank(run, 1, manifest(rank=1), samples=[{"t": 1, "pid": 5, "pcpu": 0.5, "rss": 10},
                                                  {"t": 2, "pid": 5, "rss": 20}])
    write_rank(run, 0, manifest(), samples=[{"t": 1, "cpu": [1.0], "gpu": {"0": {"u": 0.5}}},
                                            {"t": 2, "cpu": [0.0]},
                                            {"t": 3, "cpu": [0.5], "gpu": {"0": {"u": 0.7}, "1": {"u": 0.1}}}])
    recording = read_recording(run, samples=True)
    one = recording.ranks[1].sample_columns()
    assert list(one.t_ns) == [1, 2] and list(one.rss) == [10.0, 20.0]
    assert one.pcpu[0] == 0.5 and math.isnan(one.pcpu[1])
    assert [len(column) for column in one.node_columns()] == [0] * 12  # no node value: no NaN columns kept
    zero = recording.ranks[0].sample_columns()
    u0, u1 = list(zero.gpus["0"]["u"]), list(zero.gpus["1"]["u"])
    assert u0[0] == 0.5 and math.isnan(u0[1]) and u0[2] == 0.7
    assert math.isnan(u1[0]) and math.isnan(u1[1]) and u1[2] == 0.1


@pytest.mark.parametrize("bulk", [True, False])
def test_node_columns_appear_with_the_first_node_value(tmp_path: Path, bulk: bool) -> None:
    """Process-only samples keep no node columns; the first node value (after them, in bulk or one by one)
    brings every node column, NaN for the samples before it, and process-only samples after it are NaN there."""
    first = [{"t": i, "pid": 5, "pcpu": 0.5, "rss": 10} for i in range(3)]
    if not bulk:
        first.append({"t": 3, "pid": 5, "rss": 10, "gpu": {"0": {"u": 0.25}}})  # not the bulk layout: one by one
    node = {"t": 10, "pid": 5, "rss": 11, "mem": 0.5, "disk": [1, 2]}
    later = [{"t": 11, "pid": 5, "pcpu": 0.5, "rss": 12}]
    run = tmp_path / "run"
    write_rank(run, 0, manifest(), samples=[*first, node, *later])
    c = read_recording(run, samples=True).ranks[0].sample_columns()
    n = len(first)
    assert len(c) == n + 2 and all(len(column) == n + 2 for column in c.node_columns())
    assert list(c.mem[n:n + 1]) == [0.5] and list(c.disk_write[n:n + 1]) == [2.0] and c.node_samples == 0
    assert all(math.isnan(v) for v in [*c.mem[:n], c.mem[n + 1], *c.cpu_mean, *c.net_rx])


def test_parallel_read_gives_the_same_recording(tmp_path: Path) -> None:
    run = small_run(tmp_path)
    write_rank(run, 1, manifest(rank=1), [step_line("train", 0, T0 + 10, 0.5, [("forward", 0, 0.2, 0)])],
               [{"t": 5, "pid": 1, "rss": 3}])
    one = read_recording(run, samples=True, workers=1)
    two = read_recording(run, samples=True, workers=2)
    for a, b in zip(one.ranks, two.ranks):
        _same(a, b)
        assert list(a.sample_columns().t_ns) == list(b.sample_columns().t_ns)
    calls: list[tuple[int, int]] = []
    read_recording(run, samples=True, workers=2, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1][0] == calls[-1][1] and len(calls) == 4


def test_last_metric_snapshot_reads_from_the_end(tmp_path: Path) -> None:
    import otelprof

    session = otelprof.init(job_name="snap", record_dir=str(tmp_path))
    with otelprof.step():
        otelprof.record("samples", 3)
    run_dir = session.run_dir
    otelprof.shutdown()
    assert run_dir is not None
    rank = read_recording(run_dir).ranks[0]
    with open(run_dir / schema.METRICS, "a") as handle:
        handle.write('{"resourceMetrics":[')  # a torn last line
    snapshot = rank.last_metric_snapshot()
    assert snapshot is not None and rank.skipped_lines == 1
    names = {m.name for rm in snapshot.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert "otelprof.steps" in names


@pytest.mark.parametrize("name", AWKWARD)
def test_the_recorders_own_step_lines_with_awkward_names_read_back(tmp_path: Path, name: str) -> None:
    """Lines the real recorder wrote (names JSON-encoded once and cached) read back exactly, by the fast path
    and by JSON alike: phase, region and scalar names, a non-finite scalar, an error."""
    import contextlib

    import otelprof

    phase = name or "p"
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    for _ in range(2):  # the second time from the caches
        with otelprof.step(phase=phase), otelprof.annotate(name):
            otelprof.record(name, 2.0)
            otelprof.record("g", math.nan)
    with contextlib.suppress(ValueError), otelprof.step(phase=phase):
        raise ValueError
    run_dir = session.run_dir
    otelprof.shutdown()
    fast = read_recording(run_dir).ranks[0]
    _same(fast, _slow(fast.path))
    assert [(s.phase, s.error) for s in fast.steps] == [(phase, None), (phase, None), (phase, "ValueError")]
    for step in fast.steps[:2]:
        if name:
            assert [a.name for a in step.annotations] == [name]
            assert step.scalars[name] == 2.0 and math.isnan(step.scalars["g"])
        else:  # an empty name is no name: the region and the scalar are dropped (and counted), the step kept
            assert not step.annotations and set(step.scalars) == {"g"} and math.isnan(step.scalars["g"])


def test_the_documented_read_api_is_at_its_documented_path(tmp_path: Path) -> None:
    """docs show ``otelprof.recording.reader``: its names are the reader's own objects and read a run."""
    from otelprof.recording import reader
    from otelprof.recording.errors import RecordingError
    from otelprof.recording.ranks import Recording

    assert sorted(reader.__all__) == ["RankRecording", "Recording", "RecordingError", "latest_run", "read_rank",
                                      "read_recording"]
    assert (reader.RankRecording, reader.Recording, reader.RecordingError) == (RankRecording, Recording,
                                                                              RecordingError)
    run = small_run(tmp_path / "runs")
    assert reader.latest_run(tmp_path / "runs") == run
    recording = reader.read_recording(run, samples=True)
    rank = reader.read_rank(run / "rank-0")
    assert isinstance(recording, reader.Recording) and recording.run_id == rank.manifest["run_id"]
    assert [s.number for s in rank.steps] == [s.number for s in recording.ranks[0].steps] and len(rank.steps) > 0
    assert len(recording.ranks[0].sample_columns()) == len(list(rank.samples())) > 0
    with pytest.raises(reader.RecordingError, match="holds no rank"):
        reader.read_recording(tmp_path)


def _mark_prepared(rank: RankRecording) -> None:
    """A prepare hook for the test below: leaves the pid of the process that ran it with the rank's columns."""
    import os

    rank.step_columns.__dict__["_prepared_in"] = os.getpid()


def test_prepare_runs_in_the_parsing_processes_and_the_checks_read_what_it_kept(tmp_path: Path) -> None:
    import os

    from otelprof.analysis.check_recording import _sample_table, _step_table, prepare_rank
    from otelprof.analysis.checks import evaluate

    run = small_run(tmp_path)
    write_rank(run, 1, manifest(rank=1), [step_line("train", 0, T0 + 10, 0.5, [("forward", 0, 0.2, 0)])],
               [{"t": 5, "pid": 1, "rss": 3}])
    marked = read_recording(run, samples=True, workers=2, prepare=_mark_prepared)
    pids = {r.step_columns.__dict__["_prepared_in"] for r in marked.ranks}
    assert os.getpid() not in pids and len(marked.ranks) == 2
    assert [len(r.sample_columns()) for r in marked.ranks] == [len(r.sample_columns())
                                                              for r in read_recording(run, samples=True).ranks]
    plain = read_recording(run, samples=True, workers=1)
    prepared = read_recording(run, samples=True, workers=2, prepare=prepare_rank)
    for rank in prepared.ranks:  # made in the parsing process, found here, not made again
        assert rank.step_columns.__dict__["_check_steps"] and rank.sample_columns().__dict__["_check_samples"]
    from otelprof.analysis.check_recording import OutlierSettings
    from otelprof.mixin.config import MixinConfig

    rank = prepared.ranks[0]
    settings = OutlierSettings.of(rank.manifest.get("config") or {}, MixinConfig())
    assert _step_table(rank, settings) is _step_table(rank, settings)
    assert _sample_table(rank, MixinConfig()) is _sample_table(rank, MixinConfig())
    assert evaluate(prepared) == evaluate(plain)  # the same verdicts, values and subjects
    assert sum(result.datapoints for result in evaluate(plain)) > 0  # they judged something


_names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6) | st.sampled_from(AWKWARD)
_ints = st.integers(0, 10**9) | st.integers(-2**65, 2**65) | st.sampled_from([2**63 - 1, 2**63, -2**63, 2**64])
_region = st.tuples(_names, _ints, _ints, st.integers(0, 3) | st.integers(2**31 - 2, 2**33))


@settings(max_examples=150, deadline=None)
@example([("train", 0, 0, 5, [("forward", 1, 2, 0), ("x],[y", 3, 1, 1), ("a,b", 2**64, 0, 0)])], True)
@example([("train", 0, 0, 5, [("x],[y", 3, 1, 1), ("forward", 1, 2, 0)])], False)
@given(st.lists(st.tuples(_names, _ints, st.integers(0, 10**12), st.integers(0, 10**9),
                          st.lists(_region, max_size=4)), min_size=1, max_size=6), st.booleans())
def test_bulk_step_columns_equal_json_for_any_names_and_integers(
        tmp_path_factory: pytest.TempPathFactory,
        rows: list[tuple[str, int, int, int, list[tuple[str, int, int, int]]]], fast_json: bool) -> None:
    """The recorder's step lines, with names holding JSON's punctuation and integers past 64 bits, read in bulk
    (their integers as one JSON array, through orjson or the json module) give what each line as JSON gives."""
    directory = write_rank(tmp_path_factory.mktemp("bulk") / "run", 0, manifest(), [])
    start = int(T0 * NS)
    write_lines(directory / schema.STEPS, [_recorder_line(phase, number, start + t, d, regions, {"loss": 1.0})
                                           for phase, number, t, d, regions in rows])
    slowly: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        if not fast_json:
            patch.setattr(limits, "_fast_loads", None)
        patch.setattr(steps, "_read_steps_slowly", lambda rank, text: slowly.append(text) or
                      steps_read_slowly(rank, text))
        fast = read_recording(directory).ranks[0]
    _same(fast, _slow(directory))
    plain = all(-2**63 <= n < 2**63 and all(0 <= o < 2**40 and 0 <= d < 2**40 and depth < 4 and "\\" not in
                                            json.dumps(name) and "],[" not in name for name, o, d, depth in regions)
                for _, n, _, _, regions in rows)
    if plain and all("\\" not in json.dumps(s[0]) for s in rows):  # what the bulk parse takes: it did
        assert len(fast.steps) == len(rows) and fast.skipped_lines == 0 and not slowly
    else:
        assert slowly or len(fast.steps) == len(rows)


_GREEDY = re.compile(steps._STEP_LINE.pattern.replace("*+", "*").replace("++", "+").replace("?+", "?"), re.M)
_PIECES = ['{"k":"s","ph":', '"train"', ',"n":', ',"t":', ',"d":', ',"a":[', '["fw",1,2,0]', "],", ',"x":{',
           '"loss":', "1.5e-3", '"nan"', "}", "]", ",", '"', "\\", '\\"', "0", "-", "12", ".", "e", "+", "\n", ":",
           '"a\\\\"', ',"err":', "[", "{"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES) | st.text(max_size=3), max_size=40),
       st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), max_size=3))
def test_the_possessive_step_pattern_matches_what_the_greedy_one_does(pieces: list[str],
                                                                      cuts: list[tuple[int, int]]) -> None:
    """Possessive quantifiers (no backtracking into a part) find the same step lines and groups as the plain
    ones, in valid lines cut or spliced and in any text made of the format's pieces."""
    line = _recorder_line("train", 3, 10**18, 5, [("fw", 1, 2, 0), ('a"b', -3, 0, 1)], {"loss": 1.5, "g": math.nan},
                          "E")
    text = "".join(pieces)
    for at, how in cuts:
        cut = len(line) * at // 4
        text += "\n" + (line[:cut] if how == 0 else line[:cut] + text[:5] + line[cut:] if how == 1 else line)
    assert steps._STEP_LINE.findall(text) == _GREEDY.findall(text)
    assert steps._STEP_LINE.findall(line) == _GREEDY.findall(line) and not steps._STEP_LINE.findall(line)[0][7]
