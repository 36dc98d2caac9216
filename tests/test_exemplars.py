"""Exemplars: a slow bucket of the step and region duration histograms links to the trace of a step in it.

A loop of known steps (3 ms, one of 60 ms: an outlier) runs with ``/metrics`` and the local recording; the
recording holds every traced step's spans, so what each exemplar must be is computed from them: the trace and
span of a traced step (or region) whose duration is the exemplar's value and falls in the exemplar's bucket,
and for each bucket the last traced one in it, an outlier's first. A real Prometheus with exemplar storage
scrapes it in OpenMetrics and answers ``/api/v1/query_exemplars``; OTLP carries the same exemplars over the
wire; the recording leaves them out.
"""

from __future__ import annotations

import json
import time
import urllib.request
from bisect import bisect_left
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as text_families

import otelprof
from otelprof import semconv as sc
from otelprof.config import Config
from otelprof.recording.reader import read_recording
from otelprof.recording.records import Span
from otelprof.runtime.export.prometheus import CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE, wants_openmetrics
from otelprof.runtime.metrics import EXEMPLAR_HOLD_NS, HistogramInstrument
from tests.otlp_receiver import OTLPReceiver, attributes
from tests.servers import prometheus
from tests.test_otlp_export import clean_env

JOB = "exemplars"
STEPS = 60
OUTLIER = 45
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
                     "version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
"""What Prometheus 2.x sends when it scrapes."""


def _seconds(i: int) -> float:
    return 0.06 if i == OUTLIER else 0.003


def _loop() -> None:
    for i in range(STEPS):
        with otelprof.step():
            with otelprof.annotate("forward"):
                time.sleep(_seconds(i))


@pytest.fixture(autouse=True)
def _no_session_leak(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    clean_env(monkeypatch)
    otelprof.shutdown()
    yield
    otelprof.shutdown()


def _scrape(port: int, accept: str | None) -> tuple[str, str]:
    headers = {"Accept": accept} if accept is not None else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.headers["Content-Type"], response.read().decode()


def _bucket(value: float) -> int:
    return bisect_left(sc.DURATION_BUCKETS, value)


def _le(index: int) -> str:
    return "+Inf" if index == len(sc.DURATION_BUCKETS) else repr(float(sc.DURATION_BUCKETS[index]))


def _seconds_of(span: Span) -> float:
    return (span.end_ns - span.start_ns) / 1e9


def _expected(spans: list[Span]) -> dict[str, Span]:
    """Per bucket (its ``le``): the last of ``spans`` (in end order) in it, the last outlier's when there is one
    (the test runs well within the hold)."""
    chosen: dict[str, Span] = {}
    for span in sorted(spans, key=lambda s: s.end_ns):
        le = _le(_bucket(_seconds_of(span)))
        held = chosen.get(le)
        if held is None or not held.attributes.get(sc.ATTR_STEP_OUTLIER) or span.attributes.get(sc.ATTR_STEP_OUTLIER):
            chosen[le] = span
    return chosen


def _regions_of(spans: list[Span], steps: list[Span]) -> list[Span]:
    """The ``forward`` spans of ``steps``, with their step's outlier flag (their exemplars are held with it)."""
    outlier = {s.span_id: s.attributes.get(sc.ATTR_STEP_OUTLIER, False) for s in steps}
    return [Span(s.name, s.trace_id, s.span_id, s.parent_span_id, s.start_ns, s.end_ns,
                 {**s.attributes, sc.ATTR_STEP_OUTLIER: outlier[s.parent_span_id]})
            for s in spans if s.name == "forward" and s.parent_span_id in outlier]


def test_a_real_prometheus_stores_the_traced_steps_exemplars(tmp_path: Path) -> None:
    session = otelprof.init(job_name=JOB, record_dir=str(tmp_path / "runs"), metrics_exporters=("prometheus",),
                            prometheus_port=0, quiet=True)
    assert isinstance(session, otelprof.Session) and session.metrics_address is not None
    host, port = session.metrics_address
    began = time.time()
    _loop()
    with prometheus(tmp_path, [f"{host}:{port}"], features=["exemplar-storage"]) as prom:
        prom.wait_for(f'{sc.STEPS.prometheus_name}_total{{job_name="{JOB}"}} == {STEPS}')
        selector = f'{{job_name="{JOB}"}}'
        step_series = prom.exemplars(f"{sc.STEP_DURATION.prometheus_name}_bucket{selector}", began, time.time())
        region_series = prom.exemplars(f'{sc.ANNOTATION_DURATION.prometheus_name}_bucket{{job_name="{JOB}",'
                                       f'annotation="forward"}}', began, time.time())
    otelprof.shutdown()
    [rank] = read_recording(session.run_dir.parent).ranks
    spans = list(rank.spans())
    steps = [s for s in spans if s.name == sc.SPAN_STEP]
    numbers = {s.attributes[sc.ATTR_STEP_NUMBER]: s for s in steps}
    assert numbers[OUTLIER].attributes[sc.ATTR_STEP_OUTLIER] is True  # the slow step was traced, as an outlier
    regions = _regions_of(spans, steps)
    for series, traced in ((step_series, steps), (region_series, regions)):
        by_id = {(s.trace_id, s.span_id): s for s in traced}
        latest: dict[str, dict[str, Any]] = {}
        assert series
        for entry in series:
            le = entry["seriesLabels"]["le"]
            for exemplar in entry["exemplars"]:
                labels = exemplar["labels"]
                assert set(labels) == {sc.EXEMPLAR_TRACE_ID, sc.EXEMPLAR_SPAN_ID}
                span = by_id[(labels[sc.EXEMPLAR_TRACE_ID], labels[sc.EXEMPLAR_SPAN_ID])]  # a traced one
                assert float(exemplar["value"]) == _seconds_of(span) and _le(_bucket(_seconds_of(span))) == le
                assert exemplar["timestamp"] == pytest.approx(span.end_ns / 1e9, abs=0.001)
                if le not in latest or exemplar["timestamp"] >= latest[le]["timestamp"]:
                    latest[le] = exemplar
        expected = _expected(traced)
        assert {le: (e["labels"][sc.EXEMPLAR_TRACE_ID], e["labels"][sc.EXEMPLAR_SPAN_ID])
                for le, e in latest.items()} == {le: (s.trace_id, s.span_id) for le, s in expected.items()}
    slow = _le(_bucket(_seconds_of(numbers[OUTLIER])))
    assert latest[slow]["labels"][sc.EXEMPLAR_TRACE_ID] == numbers[OUTLIER].trace_id  # its region links to it too


def test_openmetrics_is_served_to_who_asks_and_says_what_the_text_format_says(tmp_path: Path) -> None:
    session = otelprof.init(job_name=JOB, record_dir=str(tmp_path / "runs"), metrics_exporters=("prometheus",),
                            prometheus_port=0, quiet=True)
    assert isinstance(session, otelprof.Session) and session.prometheus is not None
    session.prometheus.cache_interval = 0.0
    _loop()
    port = session.metrics_address[1]  # type: ignore[index]
    kind, text = _scrape(port, None)
    assert kind == CONTENT_TYPE and "# {" not in text and "# EOF" not in text
    kind, openmetrics = _scrape(port, PROMETHEUS_ACCEPT)
    assert kind == OPENMETRICS_CONTENT_TYPE and openmetrics.endswith("# EOF\n")

    def steps(families: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The step and region samples (the sampler's and the endpoint's own series move between scrapes)."""
        return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples
                if s.name.startswith(("otelprof_step", "otelprof_steps", "otelprof_annotation"))}

    # the strict OpenMetrics parser takes the whole exposition; both formats hold the same steps
    parsed = list(openmetrics_families(openmetrics))
    assert steps(parsed) == steps(text_families(text)) and len(steps(parsed)) > 2 * len(sc.DURATION_BUCKETS)
    marked = {s.labels["le"]: s.exemplar for f in parsed for s in f.samples if s.exemplar is not None
              and s.name == f"{sc.STEP_DURATION.prometheus_name}_bucket"}
    otelprof.shutdown()  # the recording holds the spans
    [slow] = [span for span in read_recording(session.run_dir.parent).ranks[0].spans()
              if span.name == sc.SPAN_STEP and span.attributes[sc.ATTR_STEP_NUMBER] == OUTLIER]
    assert marked[_le(_bucket(_seconds_of(slow)))].labels == {sc.EXEMPLAR_TRACE_ID: slow.trace_id,
                                                              sc.EXEMPLAR_SPAN_ID: slow.span_id}


def test_no_exemplars_when_turned_off_or_when_no_trace_is_kept(tmp_path: Path) -> None:
    assert Config.from_env({"OTEL_METRICS_EXEMPLAR_FILTER": "always_off"}).exemplars is False
    assert Config.from_env({"OTEL_METRICS_EXEMPLAR_FILTER": "always_on"}).exemplars is True
    assert Config.from_env({}).exemplars is True
    for settings_ in ({"exemplars": False}, {"record": False}):  # off; on, but no span goes anywhere
        session = otelprof.init(job_name=JOB, record_dir=str(tmp_path / "runs"), metrics_exporters=("prometheus",),
                                prometheus_port=0, quiet=True, **settings_)
        assert isinstance(session, otelprof.Session) and session.prometheus is not None
        _loop()
        _, openmetrics = _scrape(session.metrics_address[1], PROMETHEUS_ACCEPT)  # type: ignore[index]
        families = list(openmetrics_families(openmetrics))
        assert sum(s.name == f"{sc.STEP_DURATION.prometheus_name}_count" and s.value == STEPS
                   for f in families for s in f.samples) == 1
        assert not [s for f in families for s in f.samples if s.exemplar is not None], settings_
        otelprof.shutdown()


def test_otlp_carries_the_exemplars_and_the_recording_leaves_them_out(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    with OTLPReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint("http/protobuf"))
        session = otelprof.init(job_name=JOB, record_dir=str(tmp_path / "runs"), quiet=True)
        assert isinstance(session, otelprof.Session)
        _loop()
        otelprof.shutdown()
        assert receiver.errors == []
        steps = {s.trace_id: s for s in receiver.spans() if s.name == sc.SPAN_STEP}
        duration = receiver.last_metric(sc.STEP_DURATION.name)
        assert duration is not None
        [point] = duration.metric.histogram.data_points
        assert attributes(point.attributes)[sc.LABEL_PHASE] == "train" and point.exemplars
        for exemplar in point.exemplars:
            step = steps[exemplar.trace_id.hex()]
            assert exemplar.span_id.hex() == step.span_id
            assert exemplar.as_double == (step.span.end_time_unix_nano - step.span.start_time_unix_nano) / 1e9
        slow = [e for e in point.exemplars if steps[e.trace_id.hex()].attributes[sc.ATTR_STEP_NUMBER] == OUTLIER]
        assert len(slow) == 1
    snapshots = [json.loads(line) for line in (session.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert snapshots and not any(map(_has_exemplars, snapshots))


def _has_exemplars(node: Any) -> bool:
    if isinstance(node, dict):
        return "exemplars" in node or any(map(_has_exemplars, node.values()))
    return isinstance(node, list) and any(map(_has_exemplars, node))


def test_an_outliers_exemplar_holds_its_bucket_against_ordinary_steps_for_a_while() -> None:
    histogram = HistogramInstrument(sc.STEP_DURATION)
    labels = ("train",)
    for value in (0.06, 0.07, 0.065, 0.001):
        histogram.observe(value, labels)
    t0 = 10**18
    histogram.exemplar(0.06, labels, 1, 11, t0, hold=True)  # an outlier
    histogram.exemplar(0.07, labels, 2, 12, t0 + 1)  # an ordinary traced step in the same bucket
    histogram.exemplar(0.001, labels, 3, 13, t0 + 2)  # another bucket

    def linked() -> dict[float, int]:
        metric = histogram.data({}, 0, 1, exemplars=True)
        assert metric is not None
        [point] = metric.data.data_points  # type: ignore[attr-defined]
        return {e.value: e.trace_id for e in point.exemplars}

    assert linked() == {0.06: 1, 0.001: 3}
    histogram.exemplar(0.065, labels, 4, 14, t0 + 3, hold=True)  # a later outlier takes it
    assert linked() == {0.065: 4, 0.001: 3}
    histogram.exemplar(0.07, labels, 5, 15, t0 + 3 + EXEMPLAR_HOLD_NS)  # after the hold, the latest
    assert linked() == {0.07: 5, 0.001: 3}
    metric = histogram.data({}, 0, 1)
    assert metric is not None and not metric.data.data_points[0].exemplars  # type: ignore[attr-defined]
    histogram.exemplar(0.5, ("never observed",), 6, 16, t0)  # a series folded away or never made: none
    assert ("never observed",) not in histogram.series


@pytest.mark.parametrize(("accept", "openmetrics"), [
    ("", False),
    ("*/*", False),
    ("text/plain", False),
    (PROMETHEUS_ACCEPT, True),
    ("application/openmetrics-text", True),
    ("application/openmetrics-text; version=1.0.0", True),
    ("text/plain;q=0.9, application/openmetrics-text;q=0.5", False),
    ("application/openmetrics-text;q=0, text/plain", False),
    ("application/openmetrics-text;q=nan", False),
    ("application/openmetrics-text;q=2", False),
    ("APPLICATION/OPENMETRICS-TEXT;Q=0.4, TEXT/PLAIN;Q=0.3", True),
    (";;;,,,=;q", False),
])
def test_the_format_follows_the_accept_headers_preference(accept: str, openmetrics: bool) -> None:
    assert wants_openmetrics(accept) is openmetrics


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.text(max_size=300))
def test_any_accept_header_picks_a_format_and_never_raises(accept: str) -> None:
    assert wants_openmetrics(accept) in (True, False)
    assert wants_openmetrics(accept * 50) in (True, False)  # long headers are read up to a bound


def test_hostile_accept_headers_get_an_exposition(tmp_path: Path) -> None:
    session = otelprof.init(job_name=JOB, record_dir=str(tmp_path / "runs"), metrics_exporters=("prometheus",),
                            prometheus_port=0, quiet=True)
    assert isinstance(session, otelprof.Session) and session.metrics_address is not None
    _loop()
    port = session.metrics_address[1]
    for accept in ("application/openmetrics-text;q=" + "9" * 5000, "\x7f\x01;q=1e999", "application/openmetrics-text"
                   + ";version=1.0.0" * 300):
        kind, body = _scrape(port, accept)
        assert kind in (CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE) and f"{sc.STEPS.prometheus_name}_total" in body
