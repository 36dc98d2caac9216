"""A failing collector costs the training job's stderr one warning and a periodic summary, never a flood.

Real child processes export over the real wire to a collector that is down, answers every export with 500
(a reason phrase and body full of terminal escapes), answers 503 / UNAVAILABLE (the SDK retries with backoff)
or answers with random bytes. The OpenTelemetry SDK logs a line for every failed or retried export and quotes
the server; otelprof holds those back on its exporter threads and prints, per exporter, one warning and one
summary line with counts every ``OTELPROF_EXPORT_WARNING_INTERVAL`` while it fails, sanitised and cut.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

import otelprof
from otelprof.runtime.export.log_gate import GATE
from tests.otlp_receiver import Fault, Garbage, OTLPReceiver, closed_port
from tests.test_never_harm import child_env, clean_env

PROTOCOLS = ["grpc", "http/protobuf"]
ESCAPES = "\x1b[2J\x1b]0;pwned\x07"
FAULTS = {
    "500": Fault(500, f"GARBAGE{ESCAPES}\xe9 reason", ESCAPES.encode() * 20, grpc.StatusCode.INTERNAL,
                 f"details {ESCAPES} garbage"),
    "503": Fault(503, f"Unavail{ESCAPES}able", b"", grpc.StatusCode.UNAVAILABLE, f"retry {ESCAPES} later"),
}

CHILD = """
    import json, sys, time
    import otelprof

    record_dir, protocol, seconds, interval = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    session = otelprof.init(run_id="faults", record_dir=record_dir, otlp_protocol=protocol, system_metrics=False,
                            metric_export_interval=1.0, span_every=1, export_warning_interval=interval,
                            shutdown_timeout=1.0)
    end = time.monotonic() + seconds
    steps = 0
    while time.monotonic() < end:
        with otelprof.step():
            with otelprof.annotate("forward"):
                time.sleep(0.005)
        steps += 1
    otelprof.shutdown()
    print(json.dumps({"steps": steps, "dropped": session._dropped_summary()}), flush=True)
"""


def start(tmp_path: Path, name: str, protocol: str, port: int, seconds: float, interval: float
          ) -> subprocess.Popen[str]:
    env = child_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}", OTEL_EXPORTER_OTLP_INSECURE="true")
    record_dir = tmp_path / name.replace("/", "-")
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD), str(record_dir), protocol, str(seconds),
                             str(interval)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[dict[str, Any], list[str]]:
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    [line] = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(line), stderr.splitlines()


def check_lines(lines: list[str]) -> None:
    """Only otelprof's own lines, each plain printable ASCII (nothing the server sent reaches the terminal)."""
    for line in lines:
        assert line.startswith("otelprof: "), f"a line that is not otelprof's: {line!r}"
        assert line.isascii() and line.isprintable(), f"bytes from outside reached stderr: {line!r}"
        assert len(line) < 600, line


def per_exporter(lines: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"otlp_traces": [], "otlp_metrics": []}
    for line in lines:
        match = re.match(r"otelprof: (otlp_\w+) export", line)
        if match:
            out[match.group(1)].append(line)
    return out


def test_a_failing_collector_gives_one_warning_per_exporter_and_a_summary_at_the_end(tmp_path: Path) -> None:
    """Every fault, both protocols, in parallel: the summary interval (60 s) is longer than the run (4 s), so each
    exporter prints its first warning and, at shutdown, one summary of what failed since."""
    with contextlib.ExitStack() as stack:
        ports: dict[str, int] = {"down": closed_port()}
        receivers = {}
        for fault, how in FAULTS.items():
            receiver = stack.enter_context(OTLPReceiver(how))
            receivers[fault] = receiver
            ports[f"{fault}/grpc"], ports[f"{fault}/http/protobuf"] = receiver.grpc_port, receiver.http_port
        garbage = stack.enter_context(Garbage())
        ports["garbage"] = garbage.port
        children = {}
        for fault in ("down", "500", "503", "garbage"):
            for protocol in PROTOCOLS:
                port = ports.get(f"{fault}/{protocol}", ports.get(fault, 0))
                children[(fault, protocol)] = start(tmp_path, f"{fault}-{protocol}", protocol, port, 4.0, 60.0)
        results = {key: finish(proc) for key, proc in children.items()}
        assert all(r.refused > 0 for r in receivers.values()) and garbage.answered > 0

    for (fault, protocol), (result, lines) in results.items():
        where = f"{fault} over {protocol}"
        check_lines(lines)
        assert result["dropped"].get("otlp_traces", 0) > 0, (where, result)
        by_exporter = per_exporter(lines)
        assert sum(map(len, by_exporter.values())) == len(lines), (where, lines)
        for exporter, own in by_exporter.items():
            assert 1 <= len(own) <= 2, (where, exporter, own)
            assert "is failing" in own[0] and "a summary follows every 60s" in own[0], (where, own)
            if len(own) == 2:
                assert re.search(r" failed: \d+ batch(es)? \(\d+ items\) dropped, \d+ retries since ", own[1]), own


def test_a_collector_that_keeps_failing_gets_a_summary_every_interval(tmp_path: Path) -> None:
    with OTLPReceiver(FAULTS["503"]) as receiver:
        proc = start(tmp_path, "503", "http/protobuf", receiver.http_port, 6.0, 1.0)
        result, lines = finish(proc)
    check_lines(lines)
    traces = per_exporter(lines)["otlp_traces"]
    summaries = [line for line in traces if " failing: " in line or " failed: " in line]
    assert "is failing" in traces[0] and len(traces) == 1 + len(summaries)
    assert 2 <= len(summaries) <= 8, traces  # about one a second while it fails, the last at shutdown
    retries = [int(m.group(1)) for line in summaries if (m := re.search(r"(\d+) retries", line))]
    assert sum(retries) >= 2, "the SDK's retries are counted, not printed"
    assert all("Unavail?" in line for line in summaries), "the server's reason, sanitised"
    assert result["dropped"]["otlp_traces"] > 0


@pytest.fixture
def _sdk_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO)
    yield caplog


def test_the_gate_holds_back_only_otelprof_exporter_threads_and_is_removed_at_shutdown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _sdk_logs: pytest.LogCaptureFixture) -> None:
    clean_env(monkeypatch)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    sdk = logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    filters_before = list(sdk.filters)
    session = otelprof.init(run_id="gate", record_dir=str(tmp_path), system_metrics=False, shutdown_timeout=1.0)
    assert isinstance(session, otelprof.Session)
    assert sdk in GATE.attached
    sdk.warning("the application's own OpenTelemetry pipeline: %s", "shown")  # the main thread: not held back
    for _ in range(3):
        with otelprof.step():
            pass
    otelprof.shutdown()
    assert GATE.attached == [] and sdk.filters == filters_before, "the SDK's loggers are as they were"
    messages = [r.getMessage() for r in _sdk_logs.records]
    assert "the application's own OpenTelemetry pipeline: shown" in messages
    assert not [r for r in _sdk_logs.records if r.name.startswith("opentelemetry") and r.threadName.startswith(
        "otelprof-")], "nothing the SDK logged on otelprof's exporter threads got through"
    assert [m for m in messages if "otlp_traces export to http://127.0.0.1:" in m and "is failing" in m]
