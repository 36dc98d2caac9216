"""`otelprof webhook` over real HTTP: auth, bad payloads, routing to the named job/rank only, retries, logs."""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from otelprof.cli import actions, main
from otelprof.cli.action_queue import ActionQueue
from otelprof.runtime.control import ControlServer
from tests.servers import free_port

TOKEN = "s3cret-webhook"
CONTROL_TOKEN = "s3cret-control"


@dataclass
class FakeProcess:
    """A real control endpoint (otelprof.runtime.control) whose callbacks record what reached it."""

    name: str
    stops: list[tuple[str, str]] = field(default_factory=list)
    captures: list[int] = field(default_factory=list)
    server: ControlServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None and self.server.address is not None
        return f"http://127.0.0.1:{self.server.address[1]}"

    def start(self, port: int = 0) -> str:
        self.server = ControlServer(self._stop, self._capture, lambda: {}, CONTROL_TOKEN)
        assert self.server.start("127.0.0.1", port)
        assert self.server.address is not None
        return f"http://127.0.0.1:{self.server.address[1]}"

    def _stop(self, reason: str, alert: str) -> dict[str, Any]:
        self.stops.append((reason, alert))
        return {"stopping": True}

    def _capture(self, steps: int) -> dict[str, Any]:
        self.captures.append(steps)
        return {"armed": True}


@pytest.fixture
def processes() -> Iterator[dict[str, FakeProcess]]:
    procs = {name: FakeProcess(name) for name in ("a0", "a1", "b0")}
    yield procs
    for proc in procs.values():
        if proc.server is not None:
            proc.server.stop()


def alert(name: str, job: str, rank: str | None = "0", action: str | None = "stop", status: str = "firing",
          fingerprint: str = "f1", starts_at: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    labels = {"alertname": name, "job_name": job, "severity": "critical"}
    if rank is not None:
        labels["rank"] = rank
    if action is not None:
        labels["action"] = action
    return {"status": status, "labels": labels, "annotations": {"summary": "The loss became NaN."},
            "startsAt": starts_at, "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": fingerprint}


def payload(*alerts: dict[str, Any], version: Any = "4") -> bytes:
    return json.dumps({"version": version, "groupKey": "{}:{}", "truncatedAlerts": 0, "status": "firing",
                       "receiver": "otelprof-actions", "groupLabels": {}, "commonLabels": {},
                       "commonAnnotations": {}, "externalURL": "http://am", "alerts": list(alerts)}).encode()


@dataclass
class Webhook:
    url: str
    server: actions.WebhookServer

    def post(self, body: bytes, token: str | None = TOKEN, path: str = actions.PATH,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        """POST, then wait until the actions it queued are done (the answer comes before they are)."""
        request = urllib.request.Request(self.url + path, data=body, method="POST",
                                         headers={"Content-Type": "application/json", **(headers or {})})
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                answer = response.status, json.load(response)
        except urllib.error.HTTPError as error:
            answer = error.code, json.loads(error.read() or b"{}")
        assert self.server.receiver.queue.join(30)
        return answer


@pytest.fixture
def webhook(processes: dict[str, FakeProcess]) -> Iterator[Webhook]:
    targets = actions.TargetMap([
        actions.parse_target(f"train-a/0={processes['a0'].start()}"),
        actions.parse_target(f"train-a/1={processes['a1'].start()}"),
        actions.parse_target(f"train-b={processes['b0'].start()}"),
    ])
    receiver = actions.WebhookReceiver(TOKEN, targets, CONTROL_TOKEN, capture_steps=7, max_body=64 * 1024)
    server = actions.WebhookServer(receiver)
    host, port = server.start_background("127.0.0.1", 0)
    yield Webhook(f"http://{host}:{port}", server)
    server.stop()


def test_stop_reaches_only_the_named_job_and_rank(webhook: Webhook, processes: dict[str, FakeProcess],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="otelprof.webhook")
    status, answer = webhook.post(payload(alert("OtelprofNonFiniteValues", "train-a", rank="1")))
    assert status == 202 and answer["queued"] == 1, answer
    assert processes["a1"].stops == [("alert OtelprofNonFiniteValues: The loss became NaN.",
                                      "OtelprofNonFiniteValues")]
    assert processes["a0"].stops == [] and processes["b0"].stops == []
    assert "OtelprofNonFiniteValues job=train-a rank=1 action=stop" in caplog.text
    assert f"stop {processes['a1'].url}/v1/stop: stop sent (answered 202)" in caplog.text


def test_capture_and_job_level_targets(webhook: Webhook, processes: dict[str, FakeProcess]) -> None:
    status, answer = webhook.post(payload(alert("OtelprofInputBound", "train-b", rank="3", action="capture")))
    assert status == 202, answer
    assert processes["b0"].captures == [7]
    assert processes["a0"].captures == processes["a1"].captures == []


def test_an_alert_without_rank_reaches_every_rank_of_its_job(webhook: Webhook,
                                                             processes: dict[str, FakeProcess]) -> None:
    status, answer = webhook.post(payload(alert("OtelprofGPULoadImbalance", "train-a", rank=None, action="capture")))
    assert status == 202 and answer["queued"] == 2
    assert processes["a0"].captures == [7] and processes["a1"].captures == [7]
    assert processes["b0"].captures == []


def test_nothing_is_done_for_resolved_unlabelled_unknown_or_unmapped_alerts(
        webhook: Webhook, processes: dict[str, FakeProcess], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="otelprof.webhook")
    status, answer = webhook.post(payload(
        alert("X", "train-a", status="resolved"), alert("Y", "train-a", action=None),
        alert("Z", "train-a", action="reboot"), alert("W", "train-c")))
    assert status == 200
    results = [d["result"] for d in answer["decisions"]]
    assert results == ["ignored: resolved", "ignored: no action label", "ignored: unknown action 'reboot'",
                       "ignored: no control endpoint known for this job/rank"]
    assert all(not p.stops and not p.captures for p in processes.values())
    assert caplog.text.count("action=") == 4


def test_repeated_notifications_act_once(webhook: Webhook, processes: dict[str, FakeProcess]) -> None:
    body = payload(alert("OtelprofNonFiniteValues", "train-a"))
    assert webhook.post(body)[0] == 202
    status, answer = webhook.post(body)
    assert status == 200 and "already done" in answer["decisions"][0]["result"]
    assert len(processes["a0"].stops) == 1
    # the same alert firing again later (new startsAt) is a new episode
    assert webhook.post(payload(alert("OtelprofNonFiniteValues", "train-a", starts_at="2026-01-02T00:00:00Z")))[0] \
        == 202
    assert len(processes["a0"].stops) == 2


@pytest.mark.parametrize(("token", "expected"), [(None, 401), ("wrong", 401), (TOKEN + "x", 401)])
def test_bearer_token_is_required(webhook: Webhook, processes: dict[str, FakeProcess], token: str | None,
                                  expected: int) -> None:
    status, _ = webhook.post(payload(alert("OtelprofNonFiniteValues", "train-a")), token=token)
    assert status == expected
    assert processes["a0"].stops == []


@pytest.mark.parametrize("body", [
    b"not json", b"[]", b"{}", payload(version="5"), payload(version=4),
    json.dumps({"version": "4", "alerts": {}}).encode(),
    json.dumps({"version": "4", "alerts": ["x"]}).encode(),
    json.dumps({"version": "4", "alerts": [{"status": "firing", "labels": {"rank": 1}}]}).encode(),
    json.dumps({"version": "4", "alerts": [{"status": "burning", "labels": {}}]}).encode(),
    # one bad alert spoils the payload: the good one before it is not acted on either
    payload(alert("OtelprofNonFiniteValues", "train-a"), {"status": "firing", "labels": []}),
])
def test_malformed_payloads_are_refused_and_change_nothing(webhook: Webhook, processes: dict[str, FakeProcess],
                                                           body: bytes) -> None:
    status, answer = webhook.post(body)
    assert status == 400, answer
    assert processes["a0"].stops == []
    # the receiver goes on working
    assert webhook.post(payload(alert("OtelprofNonFiniteValues", "train-a")))[0] == 202
    assert len(processes["a0"].stops) == 1


def test_unknown_version_is_named(webhook: Webhook) -> None:
    status, answer = webhook.post(payload(version="5"))
    assert status == 400 and "unsupported payload version '5'" in answer["error"]


def test_oversized_payload_gets_413_without_being_read(webhook: Webhook, processes: dict[str, FakeProcess]) -> None:
    big = payload(alert("OtelprofNonFiniteValues", "train-a", fingerprint="x" * 70_000))
    assert webhook.post(big)[0] == 413
    assert processes["a0"].stops == []
    # a lying Content-Length is refused before the body is read
    assert webhook.server.address is not None
    with socket.create_connection(webhook.server.address, timeout=5) as sock:
        sock.sendall(f"POST {actions.PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                     "Content-Length: 999999999\r\n\r\n".encode())
        assert sock.recv(100).startswith(b"HTTP/1.0 413")


def test_paths_methods_and_health(webhook: Webhook) -> None:
    assert webhook.post(b"{}", path="/other")[0] == 404
    with urllib.request.urlopen(webhook.url + actions.HEALTH_PATH, timeout=5) as response:
        assert response.status == 200
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(webhook.url + actions.PATH, timeout=5)
    assert info.value.code == 405


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_an_unreachable_process_is_retried_until_it_answers(processes: dict[str, FakeProcess]) -> None:
    """Answered at once; the stop waits for its target's backoff and is sent once the endpoint comes up."""
    port = free_port()
    receiver = actions.WebhookReceiver(TOKEN, actions.TargetMap([actions.parse_target(
        f"train-a=http://127.0.0.1:{port}")]), CONTROL_TOKEN, timeout=1.0, queue=ActionQueue(backoff=0.2))
    body = payload(alert("OtelprofNonFiniteValues", "train-a"))
    try:
        status, answer = receiver.handle("POST", actions.PATH, f"Bearer {TOKEN}", len(body), lambda n: body)
        assert status == 202 and answer["decisions"][0]["result"] == f"http://127.0.0.1:{port}: stop queued"
        wait_until(lambda: receiver.queue.waiting_targets() == 1)  # the first attempt was refused
        assert receiver.queue.depth() == 1
        processes["a0"].start(port)  # the process's endpoint comes up; a retry reaches it
        assert receiver.queue.join(30)
        assert len(processes["a0"].stops) == 1
        assert receiver.queue.outcomes == {("stop", "sent"): 1} and receiver.queue.waiting_targets() == 0
        # Alertmanager's repeat of the same alert changes nothing
        assert receiver.handle("POST", actions.PATH, f"Bearer {TOKEN}", len(body), lambda n: body)[0] == 200
        assert receiver.queue.join(30) and len(processes["a0"].stops) == 1
    finally:
        receiver.queue.stop()


def test_wrong_control_token_is_refused_and_not_retried(processes: dict[str, FakeProcess],
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="otelprof.webhook")
    receiver = actions.WebhookReceiver(TOKEN, actions.TargetMap([actions.parse_target(
        f"train-a={processes['a0'].start()}")]), "not-the-token")
    body = payload(alert("OtelprofNonFiniteValues", "train-a"))
    try:
        status, _ = receiver.handle("POST", actions.PATH, f"Bearer {TOKEN}", len(body), lambda n: body)
        assert status == 202
        assert receiver.queue.join(30)
        assert processes["a0"].stops == []
        assert receiver.queue.outcomes == {("stop", "refused"): 1}
        assert "an action was not sent: stop refused (1 so far)" in caplog.text and "answered 401" in caplog.text
    finally:
        receiver.queue.stop()


def test_templated_targets_and_file_reload(tmp_path: Path) -> None:
    sent: list[str] = []

    def sender(url: str, body: dict[str, Any], token: str, timeout: float) -> int:
        sent.append(url)
        return 202

    targets_file = tmp_path / "targets.yaml"
    targets_file.write_text("# job/rank: control URL\ntrain-a/0: http://a-0:9470\n")
    targets = actions.TargetMap([actions.parse_target("*=http://{job_name}-{rank}.svc:9470")], targets_file)
    receiver = actions.WebhookReceiver(TOKEN, targets, sender=sender)
    receiver.act(actions.parse_payload(payload(alert("A", "train-a", fingerprint="1"),
                                               alert("A", "train-z", rank="4", fingerprint="2"),
                                               alert("A", "train-q", rank=None, fingerprint="3"))))
    assert receiver.queue.join(30)
    assert sorted(sent) == ["http://a-0:9470/v1/stop", "http://train-z-4.svc:9470/v1/stop"]
    time.sleep(0.01)
    targets_file.write_text("train-a/0: http://a-0-new:9470\n")
    import os
    os.utime(targets_file, (time.time() + 5, time.time() + 5))
    receiver.act(actions.parse_payload(payload(alert("A", "train-a", fingerprint="9"))))
    assert receiver.queue.join(30)
    assert sent[-1] == "http://a-0-new:9470/v1/stop"
    receiver.queue.stop()


def test_target_parsing() -> None:
    assert actions.parse_target("job/3=http://h:1/") == actions.Target("job", "3", "http://h:1/")
    assert actions.parse_target("job: https://h:1") == actions.Target("job", None, "https://h:1")
    for bad in ("job", "job=ftp://x", "=http://x", "a/b=http://x"):
        with pytest.raises(actions.TargetError):
            actions.parse_target(bad)
    with pytest.raises(actions.TargetError, match="line 2"):
        actions.parse_targets_text("a=http://x\nnonsense\n")


def test_dry_run_sends_nothing() -> None:
    def sender(url: str, body: dict[str, Any], token: str, timeout: float) -> int:
        raise AssertionError("sent in a dry run")

    receiver = actions.WebhookReceiver(TOKEN, actions.TargetMap([actions.parse_target("j=http://x:1")]),
                                       dry_run=True, sender=sender)
    status, answer = receiver.act(actions.parse_payload(payload(alert("A", "j"))))
    assert status == 200 and "dry run, would POST http://x:1/v1/stop" in answer["decisions"][0]["result"]


def test_cli_requires_a_token_and_valid_targets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["webhook", "--port", "0"]) == 2
    assert "bearer token is required" in capsys.readouterr().err
    assert main(["webhook", "--target", "nonsense"]) == 2
    assert "bad target" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["webhook", "--help"])
    assert info.value.code == 0
    assert "--targets-file" in capsys.readouterr().out


def test_kubernetes_fallback_suspends_the_job_and_control_port_template() -> None:
    """A stop that reaches no process suspends the Job through the API (fake API server here)."""
    import json as _json
    import threading as _threading
    from http.server import BaseHTTPRequestHandler as _Handler
    from http.server import HTTPServer as _Server

    from otelprof.cli import actions as _actions

    seen: list[tuple[str, str, str, dict[str, object]]] = []

    class Api(_Handler):
        def do_PATCH(self) -> None:
            body = _json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, self.headers["Authorization"], self.headers["Content-Type"], body))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            return None

    api = _Server(("127.0.0.1", 0), Api)
    _threading.Thread(target=api.serve_forever, daemon=True).start()
    try:
        sent: list[str] = []

        def sender(url: str, body: dict[str, object], token: str, timeout: float) -> int:
            sent.append(url)
            raise OSError("connection refused")

        receiver = _actions.WebhookReceiver(
            "t", _actions.TargetMap([_actions.parse_target("*=http://{pod_ip}:{control_port}")]), sender=sender,
            control_port_base=9565,
            kubernetes=_actions.KubernetesJobs(f"http://127.0.0.1:{api.server_address[1]}", "sa-token", None))
        item = _actions.AlertItem("firing", {"alertname": "OtelprofNonFiniteValues", "action": "stop",
                                             "job_name": "bert", "rank": "3", "local_rank": "1", "pod_ip": "10.0.0.7",
                                             "namespace": "ml"}, {}, "", "fp")
        status, answer = receiver.act([item])
        assert receiver.queue.join(30)
    finally:
        api.shutdown()
        receiver.queue.stop()
    assert sent == ["http://10.0.0.7:9566/v1/stop"]  # once: the fallback, not retries, follows a failed stop
    assert seen == [("/apis/batch/v1/namespaces/ml/jobs/bert", "Bearer sa-token", "application/merge-patch+json",
                     {"spec": {"suspend": True}})]
    assert status == 202 and answer["decisions"][0]["result"] == "http://10.0.0.7:9566: stop queued"
    assert receiver.queue.outcomes == {("stop", "failed"): 1, ("suspend", "sent"): 1}


def test_the_webhook_process_serves_its_series_from_the_catalog(tmp_path: Path) -> None:
    """`otelprof webhook` as a process: GET /metrics holds exactly the catalog's webhook series, zero at first."""
    from prometheus_client.parser import text_string_to_metric_families

    from otelprof import semconv as sc
    from tests.endpoints import WebhookProcess

    process = WebhookProcess.start(tmp_path, ["train-a=http://127.0.0.1:9"])
    try:
        with urllib.request.urlopen(process.url + actions.METRICS_PATH, timeout=10) as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
        assert set(families) == {m.prometheus_name for m in sc.WEBHOOK_METRICS}
        for spec in sc.WEBHOOK_METRICS:
            family = families[spec.prometheus_name]
            assert family.type == spec.kind.value and family.documentation == spec.description
            assert all(set(s.labels) == set(spec.labels) and s.value == 0 for s in family.samples)
        outcomes = {(s.labels["action"], s.labels["outcome"]) for s in families["otelprof_webhook_actions"].samples}
        assert outcomes == {(a, o) for a in ("stop", "capture", "suspend") for o in sc.WEBHOOK_OUTCOMES}
    finally:
        assert "Traceback" not in process.stop()
