"""otelprof must never harm the training job: with real processes, real signals and real sockets.

* a collector that is down, or that accepts connections and never answers, costs
  a bounded shutdown and counted drops, never steps or a hang;
* SIGTERM flushes the recording and still kills the process;
* SIGKILL loses at most the last flush interval of steps;
* a broken exporter, odd record() values and bad configuration never raise;
* a forked child records nothing and starts no threads;
* a Prometheus port in use gives one warning and no endpoint.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace.export import SpanExporter

import otelprof
from otelprof import semconv as sc
from otelprof.config import Config
from otelprof.recording import schema
from otelprof.recording.ranks import RankRecording
from otelprof.recording.reader import read_recording
from otelprof.runtime.export import otlp
from tests.otlp_receiver import BlackHole, closed_port

REPO = Path(__file__).resolve().parents[1]
PROTOCOLS = ["grpc", "http/protobuf"]
_OUTER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "KUBERNETES_SERVICE_HOST")


# ---------------------------------------------------------------------- helpers


def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("OTEL_", "OTELPROF_")) or name in _OUTER_VARS:
            monkeypatch.delenv(name, raising=False)


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_")) and k not in _OUTER_VARS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def script(source: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(source)]


def run_child(source: str, args: Sequence[str], env: dict[str, str], timeout: float = 30.0
              ) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    proc = subprocess.run([*script(source), *args], env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - began


def last_json(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"child printed no result:\n{stdout}"
    return dict(json.loads(lines[-1]))


def rank_of(record_dir: Path, run_id: str) -> RankRecording:
    recording = read_recording(record_dir / run_id)
    assert len(recording.ranks) == 1
    return recording.ranks[0]


def dropped_by_exporter(session: Any) -> dict[str, float]:
    """otelprof.exporter.dropped per ``exporter`` label, from the session's metric snapshot."""
    out: dict[str, float] = {}
    for resource_metrics in session.metrics_data().resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == sc.EXPORTER_DROPPED.name:
                    for point in metric.data.data_points:
                        out[str(point.attributes[sc.LABEL_EXPORTER])] = float(point.value)
    return out


def otelprof_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "otelprof" and r.levelno >= logging.WARNING]


@pytest.fixture(autouse=True)
def _no_session_leak() -> Iterator[None]:
    otelprof.shutdown()
    yield
    otelprof.shutdown()


# ---------------------------------------------------------------------- a. collector down / black hole

STEPS_200 = """
    import json, sys, time
    import otelprof

    record_dir, protocol = sys.argv[1], sys.argv[2]
    session = otelprof.init(run_id="down", record_dir=record_dir, otlp_protocol=protocol,
                            metric_export_interval=1.0)
    assert session.config.traces_exporters == ("otlp",), session.config.traces_exporters
    assert session.config.metrics_exporters == ("otlp",), session.config.metrics_exporters
    began = time.monotonic()
    slowest = 0.0
    for i in range(200):
        t0 = time.perf_counter()
        with otelprof.step():
            with otelprof.annotate("forward"):
                time.sleep(0.006)
            otelprof.record("loss", 1.0 / (i + 1))
        slowest = max(slowest, time.perf_counter() - t0)
    steps_s = time.monotonic() - began
    t0 = time.monotonic()
    otelprof.shutdown()
    shutdown_s = time.monotonic() - t0
    with session.registry.lock:
        dropped = {labels[0]: value for labels, value in session.recorder.dropped.values.items()}
        built = sum(session.recorder.spans_built.values.values())
    print(json.dumps({"steps_s": steps_s, "slowest_step_s": slowest, "shutdown_s": shutdown_s,
                      "dropped": dropped, "spans_built": built}), flush=True)
"""


def _endpoint_env(protocol: str, port: int) -> dict[str, str]:
    env = child_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}")
    if protocol == "grpc":
        env["OTEL_EXPORTER_OTLP_INSECURE"] = "true"
    return env


def _check_bounded_run(tmp_path: Path, proc: subprocess.CompletedProcess[str], wall: float) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    result = last_json(proc.stdout)
    # Default OTELPROF_SHUTDOWN_TIMEOUT is 3 s; the whole shutdown stays bounded whatever the collector does.
    assert result["shutdown_s"] < 6.0, result
    # Interpreter start, ~1.3 s of steps, 3 s of shutdown, exit: far below the SDK's 10 s export timeout x retries.
    assert wall < 20.0, f"child took {wall:.1f}s"
    # The training loop itself never waits on the exporter (a 6 ms step stays well under a second).
    assert result["slowest_step_s"] < 1.0, result
    assert "otelprof: internal error" not in proc.stderr, proc.stderr
    rank = rank_of(tmp_path, "down")
    assert [s.number for s in rank.steps] == list(range(200))
    assert all(s.scalars["loss"] == pytest.approx(1.0 / (s.number + 1)) for s in rank.steps)
    assert rank.skipped_lines == 0
    assert rank.manifest["status"] == schema.STATUS_FINISHED
    assert rank.manifest["lifecycle"]["shutdown"] is not None
    return result


def _check_drops_accounted(tmp_path: Path, result: dict[str, Any]) -> None:
    """Nothing reached a collector, so every span built must be counted as dropped, in the manifest too."""
    # In process, right after shutdown(): drops were counted, the record queue never overflowed.
    assert result["spans_built"] > 0
    assert result["dropped"].get("otlp_traces", 0) > 0, (
        f"no span drop counted in process right after shutdown(): {result} (see the in-flight batch bug below)")
    assert result["dropped"].get("queue", 0) == 0, result

    # The manifest is what outlives the process (the "dropped" dict is written at shutdown).
    manifest_dropped = rank_of(tmp_path, "down").manifest.get("dropped", {})
    assert manifest_dropped.get("otlp_traces", 0) > 0, (
        "BUG: Session.shutdown() writes manifest['dropped'] before the exporters are shut down, so the drops "
        f"of an unreachable collector never reach the recording: manifest dropped={manifest_dropped}, "
        f"in process={result}")
    assert manifest_dropped.get("otlp_metrics", 0) > 0, manifest_dropped
    assert manifest_dropped["otlp_traces"] == result["spans_built"], (
        "BUG: BackgroundExporter.shutdown() counts only the queued items at the deadline, not the batch its "
        f"blocked export thread holds: dropped={manifest_dropped}, spans built={result['spans_built']}")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_collector_down_shutdown_is_bounded_and_drops_are_counted(protocol: str, tmp_path: Path) -> None:
    proc, wall = run_child(STEPS_200, [str(tmp_path), protocol], _endpoint_env(protocol, closed_port()))
    result = _check_bounded_run(tmp_path, proc, wall)
    _check_drops_accounted(tmp_path, result)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_black_hole_collector_shutdown_is_bounded_and_drops_are_counted(protocol: str, tmp_path: Path) -> None:
    """A collector that accepts the connection and never answers: the export thread blocks in a read."""
    with BlackHole() as hole:
        proc, wall = run_child(STEPS_200, [str(tmp_path), protocol], _endpoint_env(protocol, hole.port))
        assert hole.accepted > 0, "the exporter never connected: the test would not test a hanging collector"
    result = _check_bounded_run(tmp_path, proc, wall)
    _check_drops_accounted(tmp_path, result)


# ---------------------------------------------------------------------- b. SIGTERM

SIGTERM_LOOP = """
    import pathlib, sys, time
    import otelprof

    record_dir, marker, n = sys.argv[1], pathlib.Path(sys.argv[2]), int(sys.argv[3])
    otelprof.init(run_id="term", record_dir=record_dir)
    i = 0
    while True:
        with otelprof.step():
            with otelprof.annotate("forward"):
                time.sleep(0.002)
        i += 1
        if i == n:
            tmp = marker.with_suffix(".tmp")
            tmp.write_text(str(i))
            tmp.replace(marker)
"""


def _wait_for_file(path: Path, proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"child exited early ({proc.returncode}): {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"child never reached the marker: {proc.communicate()}")
        time.sleep(0.02)


def test_sigterm_flushes_recording_and_still_terminates(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    n = 50
    proc = subprocess.Popen([*script(SIGTERM_LOOP), str(tmp_path / "rec"), str(marker), str(n)],
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_file(marker, proc, timeout=15)
        os.kill(proc.pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # otelprof flushes, then re-raises the default action: the job still dies *by* SIGTERM.
    assert proc.returncode == -signal.SIGTERM, stderr
    rank = rank_of(tmp_path / "rec", "term")
    assert rank.manifest["status"] == schema.STATUS_FINISHED
    assert rank.manifest["lifecycle"]["shutdown"] is not None
    numbers = [s.number for s in rank.steps]
    assert len(numbers) >= n
    assert numbers == list(range(len(numbers))), "steps up to the signal are all there, in order"
    assert all([a.name for a in s.annotations] == ["forward"] for s in rank.steps)
    assert rank.skipped_lines == 0


SIGTERM_USER_HANDLER = """
    import pathlib, signal, sys, time
    import otelprof

    record_dir, marker, out = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])

    def user_handler(signum, frame):
        out.write_text("user handler ran")
        sys.exit(7)

    signal.signal(signal.SIGTERM, user_handler)
    otelprof.init(run_id="term", record_dir=record_dir)
    i = 0
    while True:
        with otelprof.step():
            time.sleep(0.002)
        i += 1
        if i == 20:
            marker.write_text("go")
"""


def test_sigterm_chains_to_the_users_handler(tmp_path: Path) -> None:
    marker, out = tmp_path / "marker", tmp_path / "out"
    proc = subprocess.Popen([*script(SIGTERM_USER_HANDLER), str(tmp_path / "rec"), str(marker), str(out)],
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_file(marker, proc, timeout=15)
        os.kill(proc.pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 7, stderr
    assert out.read_text() == "user handler ran"
    rank = rank_of(tmp_path / "rec", "term")
    assert rank.manifest["status"] == schema.STATUS_FINISHED
    assert len(rank.steps) >= 20


# ---------------------------------------------------------------------- c. SIGKILL

SIGKILL_LOOP = """
    import sys, time
    import otelprof

    otelprof.init(run_id="kill", record_dir=sys.argv[1])
    i = 0
    while True:
        with otelprof.step():
            time.sleep(0.01)
        print(i, time.monotonic(), flush=True)
        i += 1
"""


def test_sigkill_loses_at_most_about_one_second_of_steps(tmp_path: Path) -> None:
    proc = subprocess.Popen([*script(SIGKILL_LOOP), str(tmp_path)], env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reported: list[tuple[int, float]] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 15
        while len(reported) < 150 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            number, at = line.split()
            reported.append((int(number), float(at)))
        assert len(reported) >= 150, f"child too slow or dead: {proc.poll()} {proc.stderr and proc.stderr.read()}"
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    for line in rest.splitlines():
        parts = line.split()
        if len(parts) == 2:  # a line cut by the kill is ignored
            reported.append((int(parts[0]), float(parts[1])))
    assert proc.returncode == -signal.SIGKILL
    assert [n for n, _ in reported] == list(range(len(reported)))

    rank = rank_of(tmp_path, "kill")
    assert rank.manifest["status"] == schema.STATUS_RUNNING, "nobody could mark a SIGKILLed run finished"
    assert rank.skipped_lines <= 1, "at most the line being written when the kill came is cut"
    numbers = [s.number for s in rank.steps]
    assert numbers == list(range(len(numbers))), "what is recorded is a gap-free prefix"
    assert len(numbers) <= len(reported) + 1, "nothing recorded that did not happen"
    last_at = reported[-1][1]
    last_second = sum(1 for _, at in reported if at > last_at - 1.0)
    lost = len(reported) - len(numbers)
    assert lost <= last_second, (f"lost {lost} steps, more than the {last_second} of the last second "
                                 f"(flush interval 0.5 s)")


# ---------------------------------------------------------------------- d. broken exporters, odd values, bad config


class ExplodingSpanExporter(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Any) -> Any:
        self.calls += 1
        raise RuntimeError("span exporter bug")

    def shutdown(self) -> None:
        raise RuntimeError("span exporter close bug")


class ExplodingMetricExporter(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        self.calls += 1
        raise RuntimeError("metric exporter bug")

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        raise RuntimeError("metric exporter flush bug")

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        raise RuntimeError("metric exporter close bug")


def test_broken_exporter_never_raises_and_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clean_env(monkeypatch)
    spans, metrics = ExplodingSpanExporter(), ExplodingMetricExporter()
    monkeypatch.setattr(otlp, "make_span_exporter", lambda kind, protocol: spans)
    monkeypatch.setattr(otlp, "make_metric_exporter", lambda kind, protocol: metrics)
    caplog.set_level(logging.WARNING, logger="otelprof")
    session = otelprof.init(run_id="broken", record_dir=str(tmp_path), traces_exporters=("otlp",),
                            metrics_exporters=("otlp",), metric_export_interval=1.0, flush_interval=0.1)
    assert isinstance(session, otelprof.Session)
    for i in range(5):
        with otelprof.step():
            with otelprof.annotate("forward"):
                pass
            otelprof.record("loss", 1.0 / (i + 1))
    with pytest.raises(ValueError, match="user error"), otelprof.step():
        raise ValueError("user error")  # the user's exception passes through untouched
    session.flush()
    dropped = dropped_by_exporter(session)
    built = sum(session.recorder.spans_built.values.values())
    assert spans.calls > 0 and metrics.calls > 0
    assert dropped.get("otlp_traces") == built, dropped
    assert dropped.get("otlp_metrics", 0) >= 1, dropped
    otelprof.shutdown()  # exporters whose shutdown() raises must not raise either

    failing = [m for m in otelprof_warnings(caplog) if "export is failing" in m]
    assert len(failing) == 2, f"one warning per exporter, not one per failure: {failing}"
    rank = rank_of(tmp_path, "broken")
    assert len(rank.steps) == 6 and rank.steps[-1].error == "ValueError"
    assert rank.manifest["status"] == schema.STATUS_FINISHED
    assert rank.manifest["dropped"].get("otlp_traces", 0) > 0


def test_unconstructible_exporter_costs_otlp_not_the_recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A typo in a standard OTLP variable makes the SDK exporter's constructor raise."""
    clean_env(monkeypatch)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "bogus")  # grpc exporter: InvalidCompressionValueException
    caplog.set_level(logging.WARNING, logger="otelprof")
    session = otelprof.init(run_id="typo", record_dir=str(tmp_path), otlp_protocol="grpc")  # must not raise
    for _ in range(3):
        with otelprof.step():
            pass
    otelprof.shutdown()
    manifest_path = tmp_path / "typo" / "rank-0" / schema.MANIFEST
    status = json.loads(manifest_path.read_text())["status"] if manifest_path.exists() else None
    assert isinstance(session, otelprof.Session) and status == schema.STATUS_FINISHED, (
        "BUG: an exception from an OTLP exporter's constructor aborts the whole Session: init() returns a "
        f"disabled session ({type(session).__name__}), the local recording (which needs no collector) is lost, "
        f"and a half-made rank directory is left with manifest status {status!r} forever")
    assert len(rank_of(tmp_path, "typo").steps) == 3
    assert otelprof_warnings(caplog), "the broken exporter is reported"


def test_record_odd_values_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    clean_env(monkeypatch)
    caplog.set_level(logging.WARNING, logger="otelprof")
    session = otelprof.init(run_id="odd", record_dir=str(tmp_path))
    assert isinstance(session, otelprof.Session)
    otelprof.record("loss", object())  # outside a step
    otelprof.record("loss", float("nan"))
    with otelprof.step():
        otelprof.record("loss", object())
        otelprof.record("grad_norm", float("inf"))
        otelprof.record("weird", "not a number")
    with otelprof.step():
        otelprof.record("loss", float("nan"))
    with otelprof.step():
        otelprof.record("loss", 0.5)
    session.flush()
    with session.registry.lock:
        nonfinite = dict(session.recorder.nonfinite.values)
        loss = dict(session.recorder.scalar_gauges["loss"].values)
    assert nonfinite == {("train", "loss"): 2, ("train", "grad_norm"): 1}
    assert loss == {("train",): 0.5}, "a NaN must not overwrite the loss gauge"
    otelprof.shutdown()
    assert any("not a number" in m for m in otelprof_warnings(caplog))

    rank = rank_of(tmp_path, "odd")
    assert rank.skipped_lines == 0
    assert [s.number for s in rank.steps] == [0, 1, 2]
    assert rank.steps[0].scalars.keys() == {"grad_norm"} and math.isinf(rank.steps[0].scalars["grad_norm"])
    assert math.isnan(rank.steps[1].scalars["loss"])
    assert rank.steps[2].scalars == {"loss": 0.5}

    def strict(token: str) -> Any:
        raise ValueError(f"{token} is not JSON")

    bad = []
    for line in (rank.path / schema.STEPS).read_text().splitlines():
        try:
            json.loads(line, parse_constant=strict)
        except ValueError:
            bad.append(line)
    assert bad == [], (
        "BUG: steps.jsonl is not valid JSON for non-finite scalars recorded inside a step (bare NaN/Infinity); "
        f"scalars outside steps are written as strings. Offending lines: {bad}")


def test_invalid_env_config_only_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    clean_env(monkeypatch)
    monkeypatch.setenv("OTELPROF_SPAN_BUDGET", "abc")
    monkeypatch.setenv("OTELPROF_QUEUE_SIZE", "lots")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "-5")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    caplog.set_level(logging.WARNING, logger="otelprof")
    session = otelprof.init(run_id="badenv", record_dir=str(tmp_path), flush_interval="fast", no_such_setting=1)
    assert isinstance(session, otelprof.Session)
    defaults = Config()
    assert session.config.span_budget == defaults.span_budget
    assert session.config.queue_size == defaults.queue_size
    assert session.config.metric_export_interval == defaults.metric_export_interval
    assert session.config.traces_exporters == ()
    assert session.config.flush_interval == defaults.flush_interval
    messages = otelprof_warnings(caplog)
    for needle in ("OTELPROF_SPAN_BUDGET", "OTELPROF_QUEUE_SIZE", "OTEL_METRIC_EXPORT_INTERVAL",
                   "OTEL_TRACES_EXPORTER", "flush_interval", "no_such_setting"):
        assert sum(needle in m for m in messages) == 1, f"{needle}: {messages}"
    with otelprof.step():
        pass
    otelprof.shutdown()
    assert len(rank_of(tmp_path, "badenv").steps) == 1


# ---------------------------------------------------------------------- e. fork safety


def test_forked_child_records_nothing_and_starts_no_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    session = otelprof.init(run_id="fork", record_dir=str(tmp_path), flush_interval=0.1)
    assert isinstance(session, otelprof.Session)
    with otelprof.step():
        pass
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork() in a multi-threaded process
        pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        status = 1
        try:
            for i in range(3):
                with otelprof.step(phase="child"), otelprof.annotate("child-work"):
                    otelprof.record("loss", float(i))
            otelprof.annotation_begin("child-region")
            otelprof.annotation_end("child-region")
            otelprof.shutdown()  # a no-op in the child
            report = {"threads": threading.active_count(), "names": [t.name for t in threading.enumerate()],
                      "session": otelprof.get_session() is None}
            os.write(write_end, json.dumps(report).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    report = json.loads(b"".join(chunks))
    assert report["threads"] == 1, f"the child started threads: {report['names']}"
    assert report["session"] is True

    for _ in range(2):
        with otelprof.step():
            pass
    otelprof.shutdown()
    rank = rank_of(tmp_path, "fork")
    assert [(s.phase, s.number) for s in rank.steps] == [("train", 0), ("train", 1), ("train", 2)]
    assert rank.annotations == []
    assert not [s for s in rank.spans() if s.name.startswith("child")]


FORK_NORMAL_EXIT = """
    import json, os, sys, threading
    import otelprof

    otelprof.init(run_id="fork", record_dir=sys.argv[1], flush_interval=5.0)  # parent's steps stay queued
    for _ in range(3):
        with otelprof.step():
            pass
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        for _ in range(3):
            with otelprof.step(phase="child"):
                pass
        os.write(write_end, str(threading.active_count()).encode())
        sys.exit(0)  # a normal exit: atexit handlers (otelprof's included) run in the child
    os.close(write_end)
    threads = int(os.read(read_end, 100))
    _, status = os.waitpid(pid, 0)
    for _ in range(3):
        with otelprof.step():
            pass
    otelprof.shutdown()
    print(json.dumps({"child_threads": threads, "child_exit": os.waitstatus_to_exitcode(status)}))
"""


def test_forked_child_exiting_normally_writes_no_duplicates(tmp_path: Path) -> None:
    proc, _ = run_child(FORK_NORMAL_EXIT, [str(tmp_path)], child_env(), timeout=30)
    assert proc.returncode == 0, proc.stderr
    result = last_json(proc.stdout)
    assert result == {"child_threads": 1, "child_exit": 0}
    rank = rank_of(tmp_path, "fork")
    assert [(s.phase, s.number) for s in rank.steps] == [("train", i) for i in range(6)]
    assert rank.manifest["status"] == schema.STATUS_FINISHED
    assert rank.manifest["lifecycle"]["init"] is not None


# ---------------------------------------------------------------------- f. Prometheus port in use


def test_prometheus_port_in_use_warns_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    clean_env(monkeypatch)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        caplog.set_level(logging.WARNING, logger="otelprof")
        session = otelprof.init(run_id="prom", record_dir=str(tmp_path), metrics_exporters=("prometheus",),
                                prometheus_port=port)
        assert isinstance(session, otelprof.Session)
        assert session.metrics_address is None
        # Exactly one warning about the endpoint (other subsystems, e.g. GPU discovery, may warn on their own).
        about_port = [m for m in otelprof_warnings(caplog) if "/metrics" in m or "prometheus" in m.lower()]
        assert len(about_port) == 1, about_port
        assert str(port) in about_port[0]
        with otelprof.step():
            pass
        otelprof.shutdown()
    assert len(rank_of(tmp_path, "prom").steps) == 1


def test_a_scraper_that_hangs_up_mid_answer_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    """A Prometheus whose scrape timed out closes the connection while /metrics answers; the write fails
    with a broken pipe. socketserver would print that traceback to the training job's stderr."""
    from otelprof.runtime._http import BackgroundServer, QuietHandler

    class HungUp(QuietHandler):
        def do_GET(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    server = BackgroundServer()
    host, port = server.start("127.0.0.1", 0, HungUp, "test-metrics")
    try:
        for _ in range(3):
            with socket.create_connection((host, port), timeout=5) as client:
                client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                assert client.recv(1024) == b""  # the handler failed: the connection closes unanswered
    finally:
        server.stop()
    assert capfd.readouterr().err == ""


# ---------------------------------------------------------------------- g. the job's own warnings

WARN_EVERY_STEP = """
    import json, sys, time, warnings
    import torch
    import otelprof
    from otelprof.integrations import torch as otorch

    record_dir = sys.argv[1]
    session = otelprof.init(run_id="warn", record_dir=record_dir, system_metrics=False, profile_every=0,
                            profile_flops=True)
    otorch.profile_window(2, 1)  # the first window's start imports torch._inductor; its summary makes a span
    otorch.profile_window(6, 2)

    def work():
        warnings.warn("the job's own warning")  # one location: Python shows it once

    for _ in range(12):
        with otelprof.step():
            torch.mm(torch.randn(8, 8), torch.randn(8, 8))
            work()
        time.sleep(0.05)
    otelprof.shutdown()  # the windows' summaries are done
    work()
    print(json.dumps({"windows": sum(1 for _ in open(f"{record_dir}/warn/rank-0/profiles.jsonl"))
                      if session.run_dir is not None else 0}))
"""


@pytest.mark.parametrize("disabled", [True, False])
def test_the_jobs_warning_prints_once_as_without_otelprof(tmp_path: Path, disabled: bool) -> None:
    """A warning the job gives at one location every step prints once, with profiling windows as without
    otelprof: nothing otelprof does (a window's start importing torch._inductor, which adds warning filters,
    its span, the FLOP counter) makes Python forget which warnings it already showed."""
    env = child_env(**({"OTEL_SDK_DISABLED": "true"} if disabled else {}))
    proc, _ = run_child(WARN_EVERY_STEP, [str(tmp_path)], env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("UserWarning: the job's own warning") == 1, proc.stderr
    assert last_json(proc.stdout) == {"windows": 0 if disabled else 2}
