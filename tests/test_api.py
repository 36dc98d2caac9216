"""The public API end to end: what the hot path records, as read back from the recording."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

import otelprof
from otelprof import semconv as sc
from otelprof.recording import schema
from otelprof.recording.ranks import RankRecording
from otelprof.recording.reader import read_recording


def _run(record_dir: Path, body: object, **overrides: object) -> RankRecording:
    session = otelprof.init(job_name="api", record_dir=str(record_dir), **overrides)
    assert isinstance(session, otelprof.Session)
    body()  # type: ignore[operator]
    assert session.run_dir is not None
    run_dir = session.run_dir.parent
    otelprof.shutdown()
    return read_recording(run_dir).ranks[0]


def test_steps_are_numbered_per_phase_and_explicit_numbers_continue(record_dir: Path) -> None:
    def body() -> None:
        for _ in range(3):
            with otelprof.step():
                pass
        with otelprof.step(phase="eval"):
            pass
        with otelprof.step(number=100):
            pass
        with otelprof.step():
            pass

    rank = _run(record_dir, body)
    assert [(s.phase, s.number) for s in rank.steps] == [
        ("train", 0), ("train", 1), ("train", 2), ("eval", 0), ("train", 100), ("train", 101)]


def test_annotations_nest_inside_steps_and_stand_alone_outside(record_dir: Path) -> None:
    def body() -> None:
        with otelprof.annotate("initialization"):
            time.sleep(0.002)
        with otelprof.step():
            with otelprof.annotate("forward"):
                with otelprof.annotate("attention"):
                    time.sleep(0.001)
            with otelprof.annotate("backward"):
                pass

    rank = _run(record_dir, body)
    [step] = rank.steps
    by_name = {a.name: a for a in step.annotations}
    assert set(by_name) == {"forward", "attention", "backward"}
    assert (by_name["forward"].depth, by_name["attention"].depth, by_name["backward"].depth) == (0, 1, 0)
    assert by_name["forward"].start_ns <= by_name["attention"].start_ns
    assert by_name["attention"].duration_ns >= 1_000_000
    for a in step.annotations:
        assert step.start_ns <= a.start_ns and a.start_ns + a.duration_ns <= step.end_ns
    [init] = rank.annotations
    assert init.name == "initialization" and init.duration_ns >= 2_000_000 and init.phase is None

    spans = {s.name: s for s in rank.spans()}
    root = spans[sc.SPAN_STEP]
    assert root.parent_span_id == ""
    assert spans["forward"].parent_span_id == root.span_id
    assert spans["attention"].parent_span_id == spans["forward"].span_id
    assert spans["backward"].parent_span_id == root.span_id
    assert len({spans[n].trace_id for n in ("forward", "attention", "backward", sc.SPAN_STEP)}) == 1
    assert spans["initialization"].parent_span_id == ""
    assert root.attributes[sc.ATTR_STEP_NUMBER] == 0
    assert root.attributes[sc.ATTR_STEP_PHASE] == "train"
    assert root.attributes[sc.ATTR_SPAN_REASON] == "first"


def test_begin_end_regions_and_decorator(record_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    @otelprof.annotate("load_batch")
    def load(x: int) -> int:
        return x * 2

    def body() -> None:
        with otelprof.step():
            otelprof.annotation_begin("data_wait")
            assert load(21) == 42
            otelprof.annotation_end("data_wait")
        otelprof.annotation_begin("save")
        otelprof.annotation_end("save")
        with caplog.at_level(logging.WARNING, logger="otelprof"):
            otelprof.annotation_end("never_begun")

    rank = _run(record_dir, body)
    assert {a.name for a in rank.steps[0].annotations} == {"data_wait", "load_batch"}
    assert [a.name for a in rank.annotations] == ["save"]
    assert "never_begun" in caplog.text


def test_user_exceptions_pass_through_and_the_step_is_kept(record_dir: Path) -> None:
    def body() -> None:
        with pytest.raises(KeyError), otelprof.step():
            with otelprof.annotate("forward"):
                raise KeyError("boom")

    rank = _run(record_dir, body)
    [step] = rank.steps
    assert step.error == "KeyError"
    root = next(s for s in rank.spans() if s.name == sc.SPAN_STEP)
    assert root.attributes[sc.ATTR_ERROR] == "KeyError"


def test_scalars_inside_and_outside_steps(record_dir: Path) -> None:
    class FakeTensor:
        def item(self) -> float:
            return 0.25

    def body() -> None:
        with otelprof.step():
            otelprof.record("loss", FakeTensor())
            otelprof.record("samples", 64)
            otelprof.record("my_metric", 3)
            otelprof.record("grad_norm", "not a number")
        otelprof.record("loss", 0.5)

    rank = _run(record_dir, body)
    assert rank.steps[0].scalars == {"loss": 0.25, "samples": 64.0, "my_metric": 3.0}
    assert [(name, value) for _, _, name, value in rank.scalars] == [("loss", 0.5)]
    root = next(s for s in rank.spans() if s.name == sc.SPAN_STEP)
    assert root.attributes[sc.ATTR_SCALAR_PREFIX + "loss"] == 0.25


def test_lifecycle_and_manifest(record_dir: Path) -> None:
    def body() -> None:
        time.sleep(0.01)
        for _ in range(3):
            with otelprof.step():
                time.sleep(0.001)
        time.sleep(0.01)

    rank = _run(record_dir, body)
    manifest = rank.manifest
    assert manifest["schema_version"] == schema.SCHEMA_VERSION
    assert manifest["status"] == schema.STATUS_FINISHED
    assert manifest["resource"][sc.SERVICE_NAME] == "api"
    assert manifest["config"]["job_name"] == "api"
    life = rank.lifecycle
    order = [life[k] for k in schema.LIFECYCLE_EVENTS]
    assert all(v is not None for v in order)
    assert order == sorted(order)  # type: ignore[type-var]
    assert life["first_step_start"] - life["init"] >= 0.01  # type: ignore[operator]
    assert life["shutdown"] - life["last_step_end"] >= 0.01  # type: ignore[operator]


def test_span_selection_first_every_window_and_outliers(record_dir: Path) -> None:
    def body() -> None:
        for i in range(60):
            with otelprof.step():
                time.sleep(0.03 if i == 45 else 0.001)

    rank = _run(record_dir, body, span_first_steps=2, span_every=10, span_windows=((20, 3),), span_budget=0.0,
                outlier_min_steps=20)
    reasons = {s.attributes[sc.ATTR_STEP_NUMBER]: s.attributes[sc.ATTR_SPAN_REASON]
               for s in rank.spans() if s.name == sc.SPAN_STEP}
    assert reasons[0] == reasons[1] == "first"
    assert reasons[10] == reasons[30] == reasons[50] == "every"
    # (a window step that happens to be slow is traced as an outlier: that reason wins)
    assert {reasons[20], reasons[21], reasons[22]} <= {"window", "outlier"}
    assert reasons[45] == "outlier"
    assert set(reasons) >= {0, 1, 10, 20, 21, 22, 30, 45, 50}
    assert len(rank.steps) == 60  # every step is in the timing record, traced or not


@pytest.mark.parametrize(("sampler", "arg", "traced"), [("always_off", None, 0), ("traceidratio", "0.5", None),
                                                        ("parentbased_always_on", None, 40)])
def test_spans_follow_the_otel_traces_sampler(record_dir: Path, monkeypatch: pytest.MonkeyPatch, sampler: str,
                                              arg: str | None, traced: int | None) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    if arg is not None:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)

    def body() -> None:
        for _ in range(40):
            with otelprof.step(), otelprof.annotate("forward"):
                pass
        with otelprof.annotate("checkpoint"):
            pass

    rank = _run(record_dir, body, span_first_steps=40)
    spans = list(rank.spans())
    roots = [s for s in spans if s.name == sc.SPAN_STEP]
    if traced is None:  # a ratio: some traces kept, some dropped, each whole
        assert 0 < len(roots) < 40
    else:
        assert len(roots) == traced
    children = [s for s in spans if s.name == "forward"]
    assert {c.trace_id for c in children} == {r.trace_id for r in roots}
    assert len(rank.steps) == 40  # the timing record keeps every step whatever the sampler says


def test_budget_limits_span_cost(record_dir: Path) -> None:
    def body() -> None:
        for _ in range(400):
            with otelprof.step():
                time.sleep(0.0005)

    rank = _run(record_dir, body, span_first_steps=0, span_budget=0.01)
    traced = sum(1 for s in rank.spans() if s.name == sc.SPAN_STEP)
    assert 0 < traced < 200


def test_label_values_are_capped(record_dir: Path) -> None:
    session = otelprof.init(record_dir=str(record_dir), max_label_values=3)
    with otelprof.step():
        for i in range(10):
            with otelprof.annotate(f"region{i}"):
                pass
    assert isinstance(session, otelprof.Session)
    [metric] = [m for m in session.registry.collect() if m.name == sc.ANNOTATION_DURATION.name]
    names = {p.attributes[sc.LABEL_ANNOTATION] for p in metric.data.data_points}
    assert names == {"region0", "region1", "region2", sc.OTHER_LABEL_VALUE}


def test_without_a_session_every_call_is_a_noop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with otelprof.step() as s, otelprof.annotate("x"):
        otelprof.record("loss", 1.0)
    assert s.number == 0
    otelprof.annotation_begin("y")
    otelprof.annotation_end("y")
    otelprof.shutdown()
    assert list(tmp_path.iterdir()) == []


def test_sdk_disabled_records_nothing(record_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    with otelprof.init(record_dir=str(record_dir)) as session:
        with otelprof.step():
            pass
        assert session.run_dir is None
    assert not record_dir.exists()


def test_init_twice_keeps_the_running_session_and_context_manager_shuts_down(record_dir: Path) -> None:
    with otelprof.init(record_dir=str(record_dir)) as first:
        assert otelprof.init(record_dir=str(record_dir)) is first
        assert otelprof.get_session() is first
    assert otelprof.get_session() is None


def test_metric_snapshots_in_the_recording(record_dir: Path) -> None:
    def body() -> None:
        for _ in range(5):
            with otelprof.step():
                pass

    rank = _run(record_dir, body)
    last = list(rank.metric_snapshots())[-1]
    metrics = {m.name: m for m in last.resource_metrics[0].scope_metrics[0].metrics}
    assert metrics[sc.STEP_DURATION.name].histogram.data_points[0].count == 5
    assert list(metrics[sc.STEP_DURATION.name].histogram.data_points[0].explicit_bounds) == list(sc.DURATION_BUCKETS)


def test_reader_skips_and_counts_corrupt_lines(record_dir: Path) -> None:
    def body() -> None:
        for _ in range(3):
            with otelprof.step():
                pass

    rank = _run(record_dir, body)
    steps_file = rank.path / schema.STEPS
    with open(steps_file, "a") as handle:
        handle.write('{"k":"s","ph":"train","n":9,"t":1\n')  # truncated by a kill
        handle.write("garbage\n")
    with open(rank.path / schema.SPANS, "a") as handle:
        handle.write('{"resourceSpans": [\n')
    again = read_recording(rank.path)
    assert len(again.ranks[0].steps) == 3
    spans = list(again.ranks[0].spans())
    assert spans
    assert again.skipped_lines == 3


def test_reader_rejects_unknown_schema_and_non_recordings(tmp_path: Path) -> None:
    from otelprof.recording.errors import RecordingError

    with pytest.raises(RecordingError, match="not a directory"):
        read_recording(tmp_path / "missing")
    with pytest.raises(RecordingError, match="rank-"):
        read_recording(tmp_path)
    rank_dir = tmp_path / "run" / "rank-0"
    rank_dir.mkdir(parents=True)
    (rank_dir / schema.MANIFEST).write_text(json.dumps({"schema_version": "2.0"}))
    with pytest.raises(RecordingError, match=r"schema 2\.0"):
        read_recording(tmp_path / "run")


def test_wake_up_processes_pending_records_before_the_flush_interval(record_dir: Path) -> None:
    session = otelprof.init(job_name="api", record_dir=str(record_dir), flush_interval=10.0, system_metrics=False)
    assert isinstance(session, otelprof.Session)
    recorder = session.recorder
    try:
        time.sleep(0.05)  # the background thread is waiting on its 10 s interval
        with otelprof.step():
            pass
        assert len(recorder.queue) == 1
        recorder.wake_up()
        deadline = time.monotonic() + 5.0
        while recorder.queue and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not recorder.queue
        # Processed by the background thread, not by a snapshot's drain: the drain lock is free once that
        # thread's drain, which applies the step totals last, is over.
        with recorder._drain_lock, recorder.registry.lock:
            assert recorder.steps.values == {("train",): 1}
        recorder.wake_up()
        recorder.wake_up()  # twice before the thread waits again: harmless
    finally:
        began = time.monotonic()
        otelprof.shutdown()
        assert time.monotonic() - began < 5.0  # shutdown wakes the thread instead of waiting 10 s
