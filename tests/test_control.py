"""The control endpoint: stop at a step boundary after the user's callbacks, capture windows, auth."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import otelprof
from otelprof import semconv as sc
from otelprof.recording.reader import read_recording
from otelprof.runtime.control import MAX_BODY, ControlServer
from tests.servers import free_port

TOKEN = "s3cret-token"


def _post(address: tuple[str, int], path: str, body: Any, token: str | None = TOKEN) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{address[0]}:{address[1]}{path}", data=data, method="POST")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _server() -> ControlServer:
    return ControlServer(lambda r, a: {"stopping": True, "reason": r}, lambda n: {"armed": n}, lambda: {"ok": 1},
                         TOKEN)


@pytest.mark.parametrize(
    ("method", "path", "auth", "body", "status"),
    [
        ("POST", "/v1/stop", "", b"{}", 401),
        ("POST", "/v1/stop", "Bearer wrong", b"{}", 401),
        ("POST", "/v1/stop", f"Bearer {TOKEN}", b"not json", 400),
        ("POST", "/v1/stop", f"Bearer {TOKEN}", b"[1]", 400),
        ("POST", "/v1/stop", f"Bearer {TOKEN}", b'{"reason": 5}', 400),
        ("POST", "/v1/capture", f"Bearer {TOKEN}", b'{"steps": 0}', 400),
        ("POST", "/v1/capture", f"Bearer {TOKEN}", b'{"steps": "3"}', 400),
        ("POST", "/v1/capture", f"Bearer {TOKEN}", b'{"steps": 10001}', 400),
        ("POST", "/v1/capture", f"Bearer {TOKEN}", b'{"steps": true}', 400),
        ("POST", "/v1/capture", f"Bearer {TOKEN}", b'{"steps": 1e9}', 400),
        ("POST", "/v1/capture", f"Bearer {TOKEN}", b'{"steps": 10000}', 202),
        ("POST", "/v1/nothing", f"Bearer {TOKEN}", b"{}", 404),
        ("POST", "/v1/stop", f"Bearer {TOKEN}", b'{"reason": "loss is NaN"}', 202),
        ("POST", "/v1/capture", f"Bearer {TOKEN}", b'{"steps": 5}', 202),
        ("GET", "/v1/status", f"Bearer {TOKEN}", b"", 200),
    ],
)
def test_control_request_validation(method: str, path: str, auth: str, body: bytes, status: int) -> None:
    assert _server().handle(method, path, auth, body)[0] == status


def test_refuses_to_start_off_loopback_without_a_token(caplog: pytest.LogCaptureFixture) -> None:
    from otelprof._log import reset_warnings

    reset_warnings()
    server = ControlServer(lambda r, a: {}, lambda n: {}, lambda: {}, token="")
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        assert server.start("0.0.0.0", free_port()) is False
    assert "OTELPROF_CONTROL_TOKEN" in caplog.text


def test_stop_over_http_ends_the_loop_at_a_step_boundary_after_the_checkpoint(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), control_port=free_port(), control_token=TOKEN,
                            system_metrics=False)
    assert isinstance(session, otelprof.Session) and session.control_address is not None
    checkpoints: list[int] = []
    session.on_stop(lambda: checkpoints.append(done))
    done = 0
    for i in range(1000):
        with otelprof.step():
            if i == 5:
                status, answer = _post(session.control_address, "/v1/stop", {"reason": "test", "alert": "X"})
                assert status == 202 and answer["stopping"] is True
                assert _post(session.control_address, "/v1/stop", {}, token=None)[0] == 401
                assert checkpoints == []  # not in the middle of the step
            done += 1
        if session.should_stop():
            break
    assert done == 6 and checkpoints == [6]
    otelprof.shutdown()
    assert session.run_dir is not None
    rank = read_recording(session.run_dir).ranks[0]
    assert rank.manifest["stop"]["reason"] == "test" and rank.manifest["stop"]["alert"] == "X"
    assert rank.manifest["config"]["control_token"] == "(set)"  # never the secret itself
    assert len(rank.steps) == 6


def test_a_stop_that_arrives_between_steps_runs_the_callbacks_before_should_stop_says_so(tmp_path: Path) -> None:
    """The request lands after a step ended and before the loop checks: should_stop() runs the on_stop callbacks
    (an alerting end-to-end run once saw the loop leave without its checkpoint)."""
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    saved: list[int] = []
    session.on_stop(lambda: saved.append(1))
    with otelprof.step():
        pass
    session.request_stop("between steps")
    assert session.should_stop() and saved == [1]
    with otelprof.step():
        assert session.should_stop() and saved == [1]  # inside a step nothing runs
    assert saved == [1]  # the boundary finds the callbacks done: each runs once
    otelprof.shutdown()


def test_stop_can_raise_a_catchable_exception(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), stop_raises=True, system_metrics=False)
    saved: list[str] = []
    session.on_stop(lambda: saved.append("checkpoint"))
    steps = 0
    with pytest.raises(otelprof.StopTraining):
        for i in range(100):
            with otelprof.step():
                steps += 1
                if i == 2:
                    session.request_stop("loss diverged")
    assert steps == 3 and saved == ["checkpoint"]


def test_oversized_body_is_rejected(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), control_port=free_port(), control_token=TOKEN,
                            system_metrics=False)
    assert isinstance(session, otelprof.Session) and session.control_address is not None
    status, _ = _post(session.control_address, "/v1/stop", b"x" * (MAX_BODY + 1))
    assert status == 413
    assert not session.should_stop()


def test_capture_without_a_framework_profiler_traces_the_next_steps(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), control_port=free_port(), control_token=TOKEN,
                            span_first_steps=0, span_budget=0.0, outlier_sigma=0.0, system_metrics=False)
    assert isinstance(session, otelprof.Session) and session.control_address is not None
    for _ in range(10):
        with otelprof.step():
            pass
    status, answer = _post(session.control_address, "/v1/capture", {"steps": 3})
    assert status == 202 and answer == {"armed": True, "kind": "spans", "start_step": 10, "num_steps": 3}
    for _ in range(10):
        with otelprof.step():
            pass
    otelprof.shutdown()
    assert session.run_dir is not None
    traced = sorted(s.attributes[sc.ATTR_STEP_NUMBER] for s in read_recording(session.run_dir).ranks[0].spans()
                    if s.name == sc.SPAN_STEP)
    assert traced == [10, 11, 12]
