"""Hostile clients against the in-process servers (/metrics, the control endpoint) and the webhook:
real sockets, a real training process. The training job's stderr stays silent, its thread count bounded,
every refusal is counted, and an alert reaches only the process its own job and rank name."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import otelprof
from otelprof import semconv as sc
from otelprof.cli import actions
from otelprof.cli.action_queue import ActionQueue
from otelprof.runtime._http import BackgroundServer, Limits, QuietHandler
from otelprof.runtime.control import MAX_BODY, ControlServer
from otelprof.runtime.export.prometheus import PrometheusEndpoint
from tests.endpoints import (
    TOKEN,
    WEBHOOK_TOKEN,
    Trainer,
    WebhookProcess,
    alert,
    child_env,
    counted,
    payload,
    raw,
    reset,
    status_of,
)


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[Trainer]:
    started = Trainer.start(tmp_path)
    yield started
    started.kill()


# ---------------------------------------------------------------------- defect 6: silent and counted


def test_client_resets_bad_lengths_and_broken_pipes_print_nothing_and_are_counted(trainer: Trainer) -> None:
    for i in range(50):  # reset after asking for the exposition, before or while it is sent
        sock = socket.create_connection(trainer.metrics, timeout=5)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        if i % 2:
            sock.recv(10)
        reset(sock)
    for i in range(10):  # reset in the middle of the request line and of the headers
        sock = socket.create_connection(trainer.metrics if i % 2 else trainer.control, timeout=5)
        sock.sendall(b"GET /metr" if i % 4 < 2 else b"POST /v1/stop HTTP/1.1\r\nContent-Le")
        time.sleep(0.01)
        reset(sock)
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    for length in (b"abc", b"-5", b"99999999999999999999999", b"1e3", b"\xff"):
        answer = raw(trainer.control, b"POST /v1/stop HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: "
                     + length + b"\r\n\r\n{}")
        assert status_of(answer) in (400, 413), answer
        assert b"\n" not in answer.split(b"\r\n\r\n", 1)[1]  # a one-line JSON error
    for line, status in ((b"GET / HTTP/9.9", 400), (b"GET / HTTP/1.1 x", 400), (b"PUT /v1/stop HTTP/1.1", 405),
                         (b"GET /" + b"a" * 70_000 + b" HTTP/1.1", 414)):
        assert status_of(raw(trainer.control, line + b"\r\n\r\n")) == status
    assert status_of(raw(trainer.control, b"GARBAGE\r\n\r\n")) == 400
    time.sleep(0.5)
    text = trainer.scrape()
    assert counted(text, "metrics", "disconnect") >= 25
    assert counted(text, "control", "bad_request") >= 5
    result, err = trainer.finish()
    assert result["steps"] > 0 and not result["stopped"]
    assert err == "", err  # not one line on the training job's stderr


# ---------------------------------------------------------------------- defect 7: bounded threads


def test_idle_connections_do_not_cost_threads_and_scrapes_still_answer(trainer: Trainer) -> None:
    before = trainer.threads()
    idle = []
    try:
        for i in range(300):
            idle.append(socket.create_connection(trainer.metrics if i % 2 else trainer.control, timeout=5))
            if i % 3 == 0:
                idle[-1].sendall(b"GET /metrics HTTP/1.1\r\n")  # a request that never ends
        time.sleep(0.5)
        during = trainer.threads()
        text = trainer.scrape(timeout=15)  # answered while the idle ones hold on (the oldest make room)
        assert sc.STEPS.prometheus_name in text
    finally:
        for sock in idle:
            sock.close()
    assert during <= before + 2, (before, during)  # no thread per connection (workers start for whole requests)
    result, err = trainer.finish()
    assert result["steps"] > 0 and err == "", err


def test_slow_and_idle_clients_are_cut_off_at_their_deadline_and_the_backlog_is_not_five() -> None:
    class Echo(QuietHandler):
        def do_GET(self) -> None:
            self.send_json(200, {"ok": True})

    unserved = BackgroundServer()  # bound, nobody accepting: the kernel's backlog takes the connections
    address = unserved.bind("127.0.0.1", 0, Echo)
    try:
        waiting = [socket.create_connection(address, timeout=2) for _ in range(100)]  # a backlog of 5: timeouts
        for sock in waiting:
            sock.close()
    finally:
        unserved.stop()
    server = BackgroundServer(Limits(workers=2, max_connections=4, deadline=0.5, rate=1000.0))
    address = server.start("127.0.0.1", 0, Echo, "test-server")
    try:
        slow = [socket.create_connection(address, timeout=5) for _ in range(6)]
        for sock in slow[:3]:
            sock.sendall(b"GET / HTTP/1.1\r\n")  # headers that never end
        for sock in slow:  # every one is closed by the server: at its deadline, or evicted while idle
            sock.settimeout(5)
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(100) == b""
            sock.close()
        assert status_of(raw(address, b"GET / HTTP/1.0\r\n\r\n")) == 200
        assert server.refused["timeout"] >= 2 and server.refused["timeout"] + server.refused["overload"] >= 5
    finally:
        server.stop()


# ---------------------------------------------------------------------- defect 8: scrapes reuse a rendering


def test_scrape_bursts_reuse_one_rendering_per_interval(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    assert isinstance(session, otelprof.Session)
    renders: list[float] = []
    session.registry.before_collect(lambda: renders.append(time.monotonic()))
    endpoint = PrometheusEndpoint(session.registry, {"service.name": "x"})
    assert endpoint.start("127.0.0.1", 0) and endpoint.address is not None
    url = f"http://127.0.0.1:{endpoint.address[1]}/metrics"
    try:
        with otelprof.step():
            pass
        bodies: list[bytes] = []

        def scrape(n: int) -> None:
            for _ in range(n):
                with urllib.request.urlopen(url, timeout=10) as response:
                    bodies.append(response.read())

        began = time.monotonic()
        threads = [threading.Thread(target=scrape, args=(10,)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - began
        assert len(bodies) == 80
        # at most one rendering per interval, whatever the number of scrapers
        assert len(renders) <= 1 + elapsed / endpoint.cache_interval + 1, (len(renders), elapsed)
        assert endpoint.cache_interval <= 1.0
        # a step after the interval is seen by the next scrape: data is never older than the interval
        with otelprof.step():
            pass
        time.sleep(endpoint.cache_interval)
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        steps = [line for line in text.splitlines() if line.startswith(sc.STEPS.prometheus_name + "_total{")]
        assert [float(line.rsplit(" ", 1)[1]) for line in steps] == [2.0]
    finally:
        endpoint.stop()


# ---------------------------------------------------------------------- defect 9: series cap per metric


def test_series_are_capped_per_metric_not_per_label(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, max_series=100)
    assert isinstance(session, otelprof.Session)
    for p in range(70):
        with otelprof.phase(f"phase{p}"):
            for a in range(70):
                with otelprof.step():
                    with otelprof.annotate(f"region{a}"):
                        pass
    from otelprof.runtime.export.prometheus import render

    text = render(session.registry.collect(), {})
    name = sc.ANNOTATION_DURATION.prometheus_name
    series = {line.split("{", 1)[1].rsplit(',le="', 1)[0] for line in text.splitlines()
              if line.startswith(name + "_bucket{")}
    assert 90 <= len(series) <= 101, len(series)  # the cap (plus the series `other` folds into)
    assert any(f'phase="{sc.OTHER_LABEL_VALUE}"' in s and f'annotation="{sc.OTHER_LABEL_VALUE}"' in s
               for s in series)
    assert len(text) < 2_000_000, len(text)
    folded = [line for line in text.splitlines()
              if line.startswith(sc.SERIES_FOLDED.prometheus_name + "_total{")
              and f'metric="{sc.ANNOTATION_DURATION.name}"' in line]
    assert folded and float(folded[0].rsplit(" ", 1)[1]) > 0
    # every annotation is counted: folded ones in `other`, none lost
    counts = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "_count{"))
    assert counts == 70 * 70


# ---------------------------------------------------------------------- defect 10: nested JSON, big bodies


def test_control_endpoint_refuses_nested_json_with_400_and_no_traceback(trainer: Trainer) -> None:
    nested = b"[" * 30_000 + b"]" * 30_000
    assert len(nested) < MAX_BODY
    for body in (nested, b'{"reason": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"):
        answer = raw(trainer.control, f"POST /v1/stop HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                                      f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert status_of(answer) == 400, answer
    result, err = trainer.finish()
    assert not result["stopped"] and err == "", err


# ---------------------------------------------------------------------- defect 13: ::1, secrets


def test_control_endpoint_binds_ipv6_loopback() -> None:
    server = ControlServer(lambda r, a: {"stopping": True}, lambda n: {}, lambda: {"ok": 1}, "")
    try:
        assert server.start("::1", 0)
        assert server.address is not None
        with urllib.request.urlopen(f"http://[::1]:{server.address[1]}/v1/status", timeout=5) as response:
            assert json.load(response) == {"ok": 1}
    finally:
        server.stop()


def test_env_never_prints_secrets() -> None:
    env = {**child_env(), "OTELPROF_CONTROL_TOKEN": "tok-control-123", "OTELPROF_WEBHOOK_TOKEN": "tok-hook-456"}
    out = subprocess.run([sys.executable, "-m", "otelprof", "env"], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "tok-control-123" not in out and "tok-hook-456" not in out
    shown = {line.split()[0]: line.split(None, 1)[1] for line in out.splitlines() if line.startswith("OTELPROF_")}
    assert shown["OTELPROF_CONTROL_TOKEN"] == shown["OTELPROF_WEBHOOK_TOKEN"] == "(set, hidden)"


# ---------------------------------------------------------------------- the webhook


@dataclass
class Victim:
    """A real control endpoint of another job: nothing may reach it."""

    stops: list[str]
    server: ControlServer
    port: int


@pytest.fixture
def victim() -> Iterator[Victim]:
    stops: list[str] = []
    server = ControlServer(lambda r, a: stops.append(r) or {"stopping": True}, lambda n: {}, lambda: {}, TOKEN)
    assert server.start("127.0.0.1", 0) and server.address is not None
    yield Victim(stops, server, server.address[1])
    server.stop()


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[WebhookProcess]:
    """The indexed-Job template and the pod-IP template."""
    started = WebhookProcess.start(tmp_path, ["*=http://{job_name}-{rank}.{job_name}:9470",
                                              "*=http://{pod_ip}:{control_port}"],
                                   "--timeout", "2", "--control-port-base", "9470")
    yield started
    started.stop()


def test_an_alert_for_one_job_never_stops_another(webhook: WebhookProcess, victim: Victim) -> None:
    hostile = [
        {"job_name": f"127.0.0.1:{victim.port}/v1/stop?", "rank": "0"},
        {"job_name": f"127.0.0.1:{victim.port}/v1/stop#", "rank": "0"},
        {"job_name": "x", "rank": f"0.x@127.0.0.1:{victim.port}/v1/stop?"},
        {"job_name": f"a@127.0.0.1:{victim.port}", "rank": "0"},
        # without a rank every target of the job is used: the pod-IP one too
        {"job_name": "x", "pod_ip": f"127.0.0.1:{victim.port}/v1/stop?", "local_rank": "0"},
        {"job_name": "x", "pod_ip": "127.0.0.1", "local_rank": f"{victim.port - 9470}/../"},
        {"job_name": "x", "pod_ip": "127.0.0.1", "local_rank": "٣"},  # a digit, but not ASCII
        {"job_name": "x", "pod_ip": "127.0.0.1", "local_rank": "99999999"},
    ]
    for i, labels in enumerate(hostile):
        status, answer = webhook.post(payload(alert(labels, fingerprint=str(i))))
        assert status == 400, (labels, answer)
        assert answer["decisions"][0]["result"].startswith("rejected:"), answer
    assert victim.stops == []
    health = webhook.health()
    assert sum(health["rejected"].values()) == len(hostile)
    err = webhook.stop()
    rejections = [line for line in err.splitlines() if "rejected" in line]
    assert len(rejections) <= len(health["rejected"]), rejections  # once per cause


def test_a_valid_alert_still_reaches_its_own_target(victim: Victim) -> None:
    """The pod-IP template reaches exactly the control endpoint the alert's labels name."""
    receiver = actions.WebhookReceiver(WEBHOOK_TOKEN, actions.TargetMap([actions.parse_target(
        "*=http://{pod_ip}:{control_port}")]), TOKEN, control_port_base=victim.port - 1)
    status, answer = receiver.act(actions.parse_payload(payload(alert(
        {"job_name": "train-a", "rank": "3", "pod_ip": "127.0.0.1", "local_rank": "1"}))))
    assert status == 202, answer
    assert receiver.queue.join(30)
    receiver.queue.stop()
    assert len(victim.stops) == 1


def test_webhook_refuses_nested_json_with_400_and_big_bodies_with_a_readable_413(webhook: WebhookProcess) -> None:
    assert webhook.post(b"[" * 100_000 + b"]" * 100_000)[0] == 400
    assert webhook.post(b'{"version": "4", "alerts": ' + b"[" * 50_000 + b"]" * 50_000 + b"}")[0] == 400
    status, answer = webhook.post(b"x" * (2 * 1024 * 1024))  # urllib sends it all before reading the answer
    assert status == 413, answer
    assert webhook.post(payload())[0] == 200  # still serving
    assert webhook.health()["refused"] == {"bad_payload": 2, "too_large": 1}
    err = webhook.stop()
    assert "Traceback" not in err, err


def test_a_stop_that_falls_back_to_kubernetes_never_patches_a_path_its_labels_steer() -> None:
    from http.server import BaseHTTPRequestHandler, HTTPServer

    patched: list[str] = []

    class Api(BaseHTTPRequestHandler):
        def do_PATCH(self) -> None:
            patched.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    api = HTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=api.serve_forever, daemon=True).start()

    def unreachable(url: str, body: dict[str, object], token: str, timeout: float) -> int:
        raise OSError("connection refused")

    try:
        receiver = actions.WebhookReceiver(
            WEBHOOK_TOKEN, actions.TargetMap([actions.parse_target("*=http://{pod_ip}:9470")]), sender=unreachable,
            kubernetes=actions.KubernetesJobs(f"http://127.0.0.1:{api.server_address[1]}", "sa-token", None))
        for namespace, job in (("ml/../../kube-system", "bert"), ("ml", "bert/../../../other"), ("ml", "a?b"),
                               ("ML", "bert"), ("ml", "bert%2F..")):
            status, answer = receiver.act(actions.parse_payload(payload(alert(
                {"job_name": job, "rank": "0", "pod_ip": "10.0.0.7", "namespace": namespace}))))
            assert status in (200, 202) and "not suspending" in answer["decisions"][0]["result"], answer
        receiver.queue.stop()  # the stops without a fallback are retried: not waited for
        assert patched == []
        receiver.queue = ActionQueue()
        status, _ = receiver.act(actions.parse_payload(payload(alert(
            {"job_name": "bert.v2", "rank": "0", "pod_ip": "10.0.0.7", "namespace": "ml"}))))
        assert status == 202 and receiver.queue.join(30)
        assert patched == ["/apis/batch/v1/namespaces/ml/jobs/bert.v2"]
        assert sum(receiver.rejected.counts().values()) == 5
    finally:
        api.shutdown()
        receiver.queue.stop()
