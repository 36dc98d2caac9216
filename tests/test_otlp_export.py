"""OTLP export over the real wire: gRPC and HTTP/protobuf into an in-test receiver.

Proves that what a collector receives (step spans, annotation children, resource,
the step-duration histogram with catalog buckets and identity labels) matches the
local recording of the same run.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

import otelprof
from otelprof import semconv as sc
from otelprof.recording.reader import read_recording
from tests.otlp_receiver import OTLPReceiver, ReceivedMetric, attributes

PROTOCOLS = ["grpc", "http/protobuf"]
RUN_ID = "otlp-test-run"
JOB = "otlp-test"
NODE = "node-a"
STEPS = 5
ANNOTATIONS = ("forward", "backward")


def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OTEL_*/OTELPROF_*/torchrun/Kubernetes variable from the outer environment leaks in."""
    for name in list(os.environ):
        if name.startswith(("OTEL_", "OTELPROF_")) or name in (
            "RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "KUBERNETES_SERVICE_HOST",
        ):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _no_session_leak() -> Iterator[None]:
    otelprof.shutdown()
    yield
    otelprof.shutdown()


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as r:
        yield r


def point_env(monkeypatch: pytest.MonkeyPatch, receiver: OTLPReceiver, protocol: str) -> None:
    clean_env(monkeypatch)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint(protocol))
    if protocol == "grpc":
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    monkeypatch.setenv("OTELPROF_NODE_NAME", NODE)


def start(tmp_path: Path, protocol: str, **overrides: Any) -> otelprof.Session:
    settings: dict[str, Any] = {
        "job_name": JOB, "run_id": RUN_ID, "record_dir": str(tmp_path), "otlp_protocol": protocol,
        "metric_export_interval": 1.0, "flush_interval": 0.1, "span_first_steps": 10,
        "rank": 3, "local_rank": 1, "world_size": 4,
    }
    settings.update(overrides)
    session = otelprof.init(**settings)
    assert isinstance(session, otelprof.Session), "init() fell back to a disabled session"
    return session


def run_steps(count: int = STEPS) -> None:
    for i in range(count):
        with otelprof.step():
            with otelprof.annotate("forward"), otelprof.annotate("inner"):
                time.sleep(0.001)
            with otelprof.annotate("backward"):
                time.sleep(0.001)
            otelprof.record("loss", 1.0 / (i + 1))


def histogram_point(metric: ReceivedMetric, phase: str = "train") -> Any:
    points = [p for p in metric.metric.histogram.data_points if attributes(p.attributes).get(sc.LABEL_PHASE) == phase]
    assert len(points) == 1, f"expected one {phase} point, got {metric.metric}"
    return points[0]


def number_points(metric: ReceivedMetric) -> list[Any]:
    kind = metric.metric.WhichOneof("data")
    return list(getattr(metric.metric, kind).data_points)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_steps_annotations_and_metrics_arrive(
    protocol: str, receiver: OTLPReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_env(monkeypatch, receiver, protocol)
    session = start(tmp_path, protocol)
    # Setting the endpoint alone turns OTLP on for both signals.
    assert session.config.traces_exporters == ("otlp",)
    assert session.config.metrics_exporters == ("otlp",)
    run_steps()
    otelprof.shutdown()

    # Nothing waits here: shutdown() itself must have delivered everything.
    assert receiver.errors == []
    transport = "grpc" if protocol == "grpc" else "http"
    assert {t for t, _ in receiver.transports} == {transport}

    spans = receiver.spans()
    steps = sorted((s for s in spans if s.name == sc.SPAN_STEP), key=lambda s: s.attributes[sc.ATTR_STEP_NUMBER])
    assert [s.attributes[sc.ATTR_STEP_NUMBER] for s in steps] == list(range(STEPS))
    for i, step in enumerate(steps):
        attrs = step.attributes
        assert attrs[sc.ATTR_STEP_PHASE] == "train"
        assert attrs[sc.ATTR_SPAN_REASON] == "first"
        assert attrs[sc.ATTR_STEP_OUTLIER] is False
        assert attrs[sc.ATTR_SCALAR_PREFIX + "loss"] == pytest.approx(1.0 / (i + 1))
        assert step.parent_span_id == "", "a step span is a trace root"
        assert step.span.end_time_unix_nano > step.span.start_time_unix_nano
    assert len({s.trace_id for s in steps}) == STEPS, "each step is its own trace"

    by_id = {s.span_id: s for s in spans}
    for step in steps:
        children = [s for s in spans if s.parent_span_id == step.span_id]
        assert sorted(c.name for c in children) == sorted(ANNOTATIONS)
        for child in children:
            assert child.trace_id == step.trace_id
            assert child.attributes[sc.ATTR_ANNOTATION] is True
            assert step.span.start_time_unix_nano <= child.span.start_time_unix_nano
            assert child.span.end_time_unix_nano <= step.span.end_time_unix_nano
        forward = next(c for c in children if c.name == "forward")
        inner = [s for s in spans if s.parent_span_id == forward.span_id]
        assert [s.name for s in inner] == ["inner"], "nested annotation hangs under its enclosing annotation"
        assert inner[0].trace_id == step.trace_id
    assert len(spans) == STEPS * 4
    assert all(s.parent_span_id == "" or s.parent_span_id in by_id for s in spans)

    for span in spans:
        res = span.resource_attributes
        assert res[sc.SERVICE_NAME] == JOB
        assert res[sc.OTELPROF_RUN_ID] == RUN_ID
        assert res[sc.OTELPROF_RANK] == 3
        assert res[sc.OTELPROF_LOCAL_RANK] == 1
        assert res[sc.OTELPROF_WORLD_SIZE] == 4
        assert res[sc.K8S_NODE_NAME] == NODE
        assert (span.scope_name, span.scope_version) == (sc.SCOPE_NAME, otelprof.__version__)

    # ---------------------------------------------------------------- metrics
    names = receiver.metric_names()
    for spec in (sc.STEP_DURATION, sc.STEPS, sc.ANNOTATION_DURATION, sc.LOSS, sc.EXPORTER_DROPPED):
        assert spec.name in names
    duration = receiver.last_metric(sc.STEP_DURATION.name)
    assert duration is not None
    assert duration.metric.WhichOneof("data") == "histogram"
    assert {(m.scope_name, m.scope_version) for m in receiver.metrics()} == {(sc.SCOPE_NAME, otelprof.__version__)}
    assert duration.metric.unit == "s"
    cumulative = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    assert duration.metric.histogram.aggregation_temporality == cumulative
    point = histogram_point(duration)
    assert point.count == STEPS
    assert list(point.explicit_bounds) == list(sc.DURATION_BUCKETS)
    assert len(point.bucket_counts) == len(sc.DURATION_BUCKETS) + 1
    assert sum(point.bucket_counts) == STEPS
    assert attributes(point.attributes) == {
        sc.LABEL_JOB: JOB, sc.LABEL_RANK: "3", sc.LABEL_LOCAL_RANK: "1", sc.LABEL_NODE: NODE, sc.LABEL_PHASE: "train",
    }
    assert duration.resource_attributes[sc.OTELPROF_RUN_ID] == RUN_ID
    assert duration.resource_attributes[sc.SERVICE_NAME] == JOB

    annotation = receiver.last_metric(sc.ANNOTATION_DURATION.name)
    assert annotation is not None
    per_name = {attributes(p.attributes)[sc.LABEL_ANNOTATION]: p.count
                for p in annotation.metric.histogram.data_points}
    assert per_name == {"forward": STEPS, "inner": STEPS, "backward": STEPS}

    steps_metric = receiver.last_metric(sc.STEPS.name)
    assert steps_metric is not None
    assert steps_metric.metric.sum.is_monotonic
    assert [p.as_double or p.as_int for p in steps_metric.metric.sum.data_points] == [STEPS]
    loss = receiver.last_metric(sc.LOSS.name)
    assert loss is not None
    assert [p.as_double for p in loss.metric.gauge.data_points] == [pytest.approx(1.0 / STEPS)]

    dropped = receiver.last_metric(sc.EXPORTER_DROPPED.name)
    assert dropped is not None
    for p in number_points(dropped):
        assert (p.as_double or p.as_int) == 0, f"nothing may be dropped with a healthy collector: {p}"

    for metric in receiver.metrics():
        for p in number_points(metric) if metric.metric.WhichOneof("data") != "histogram" else \
                metric.metric.histogram.data_points:
            labels = attributes(p.attributes)
            for key in sc.IDENTITY_LABELS:
                assert key in labels, f"{metric.name} lacks identity label {key}"

    # each metric arrives as the instrument the catalog names: a level the semantic conventions define as an
    # UpDownCounter (memory in use, threads) as a cumulative non-monotonic sum, not a gauge
    catalog = {m.name: m for m in sc.METRICS}
    instruments = {m.name: (m.metric.WhichOneof("data"), m.metric.sum.is_monotonic,
                            m.metric.sum.aggregation_temporality) for m in receiver.metrics()}
    expected = {"Counter": ("sum", True, cumulative), "UpDownCounter": ("sum", False, cumulative),
                "Histogram": ("histogram", False, 0), "Gauge": ("gauge", False, 0)}
    for name, got in instruments.items():
        assert got == expected[catalog[name].instrument], name
    assert {sc.PROCESS_MEMORY_USAGE.name, sc.PROCESS_THREAD_COUNT.name} <= set(instruments)

    # ---------------------------------------------------------------- the recording agrees
    recording = read_recording(tmp_path / RUN_ID)
    assert [r.rank for r in recording.ranks] == [3]
    rank = recording.ranks[0]
    assert rank.manifest["status"] == "finished"
    assert rank.skipped_lines == 0
    assert [(s.phase, s.number) for s in rank.steps] == [("train", i) for i in range(STEPS)]
    for i, step in enumerate(rank.steps):
        # In the order they closed; depth says "inner" sat inside "forward".
        assert [(a.name, a.depth) for a in step.annotations] == [("inner", 1), ("forward", 0), ("backward", 0)]
        assert step.scalars == {"loss": pytest.approx(1.0 / (i + 1))}
    assert point.sum == pytest.approx(sum(s.duration for s in rank.steps), rel=1e-9, abs=1e-12)
    # Span start/end are the same clock readings in both places.
    for step, span in zip(rank.steps, steps):
        assert span.span.start_time_unix_nano == step.start_ns
        assert span.span.end_time_unix_nano == step.end_ns
    recorded_spans = {(s.span_id, s.trace_id, s.parent_span_id, s.name) for s in rank.spans()}
    received_spans = {(s.span_id, s.trace_id, s.parent_span_id, s.name) for s in spans}
    assert recorded_spans == received_spans
    assert session.run_dir == tmp_path / RUN_ID / "rank-3"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_exports_while_running_not_only_at_shutdown(
    protocol: str, receiver: OTLPReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_env(monkeypatch, receiver, protocol)
    start(tmp_path, protocol)
    run_steps(3)

    def histogram_has_three(r: OTLPReceiver) -> bool:
        metric = r.last_metric(sc.STEP_DURATION.name)
        return metric is not None and histogram_point(metric).count == 3

    # Spans go out on the flush interval (0.1 s), metrics on the export interval (1 s).
    assert receiver.wait_for(lambda r: len([s for s in r.spans() if s.name == sc.SPAN_STEP]) == 3, timeout=5)
    assert receiver.wait_for(histogram_has_three, timeout=5)
    otelprof.shutdown()
    assert receiver.errors == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_gzip_compression(protocol: str, receiver: OTLPReceiver, tmp_path: Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    point_env(monkeypatch, receiver, protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    start(tmp_path, protocol)
    run_steps(2)
    otelprof.shutdown()
    assert receiver.errors == []
    assert len([s for s in receiver.spans() if s.name == sc.SPAN_STEP]) == 2
    metric = receiver.last_metric(sc.STEP_DURATION.name)
    assert metric is not None and histogram_point(metric).count == 2
    if protocol != "grpc":
        requests = receiver.http_requests
        assert requests and all(r.content_encoding == "gzip" for r in requests)
        assert all(r.content_type == "application/x-protobuf" for r in requests)


def test_sampled_steps_beyond_first_are_not_all_exported(
    receiver: OTLPReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """span_first_steps bounds forced tracing; the histogram still counts every step."""
    point_env(monkeypatch, receiver, "http/protobuf")
    start(tmp_path, "http/protobuf", span_first_steps=2, span_budget=0.0, outlier_sigma=0.0)
    for _ in range(6):
        with otelprof.step():
            pass
    otelprof.shutdown()
    steps = [s for s in receiver.spans() if s.name == sc.SPAN_STEP]
    assert sorted(s.attributes[sc.ATTR_STEP_NUMBER] for s in steps) == [0, 1]
    metric = receiver.last_metric(sc.STEP_DURATION.name)
    assert metric is not None and histogram_point(metric).count == 6
    assert math.isclose(histogram_point(metric).sum,
                        sum(s.duration for s in read_recording(tmp_path / RUN_ID).ranks[0].steps), rel_tol=1e-9)
