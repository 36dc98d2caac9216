"""Hostile clients against the in-process servers (/metrics, the control endpoint) and the webhook:
real sockets, a real training process. The training job's stderr stays silent, its thread count bounded,
every refusal is counted, and an alert reaches only the process its own job and rank name."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import otelprof
from otelprof import actions
from otelprof import semconv as sc
from otelprof._http import BackgroundServer, Limits, QuietHandler
from otelprof.control import MAX_BODY, ControlServer
from otelprof.export.prometheus import PrometheusEndpoint
from tests.servers import free_port

REPO = Path(__file__).resolve().parents[1]
TOKEN = "s3cret-control"
WEBHOOK_TOKEN = "s3cret-webhook"

TRAINER = """
    import json, sys, threading, time
    import otelprof

    session = otelprof.init(job_name="victim", record_dir=sys.argv[1], metrics_exporters=("prometheus",),
                            prometheus_port=0, control_port=int(sys.argv[2]), control_token=sys.argv[3],
                            system_metrics=False)
    print(json.dumps({"metrics": session.metrics_address, "control": session.control_address}), flush=True)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    steps = 0
    while not done.is_set() and not session.should_stop():
        with otelprof.step():
            with otelprof.annotate("forward"):
                time.sleep(0.002)
            otelprof.record("loss", 1.0)
        steps += 1
    print(json.dumps({"steps": steps, "stopped": session.should_stop()}), flush=True)
    otelprof.shutdown()
"""


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "KUBERNETES_SERVICE_HOST")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Trainer:
    """A real training process serving /metrics and the control endpoint."""

    proc: subprocess.Popen[str]
    metrics: tuple[str, int]
    control: tuple[str, int]

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/task"))

    def scrape(self, timeout: float = 10.0) -> str:
        with urllib.request.urlopen(f"http://{self.metrics[0]}:{self.metrics[1]}/metrics",
                                    timeout=timeout) as response:
            return str(response.read().decode())

    def finish(self) -> tuple[dict[str, Any], str]:
        """End the loop; (its last line, its whole stderr)."""
        out, err = self.proc.communicate("", timeout=30)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1]), err


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[Trainer]:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(TRAINER), str(tmp_path), str(free_port()), TOKEN],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())
    assert proc.stdout is not None
    addresses = json.loads(proc.stdout.readline())
    yield Trainer(proc, tuple(addresses["metrics"]), tuple(addresses["control"]))  # type: ignore[arg-type]
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def counted(exposition: str, endpoint: str, reason: str) -> float:
    name = sc.ENDPOINT_ERRORS.prometheus_name + "_total"
    total = 0.0
    for line in exposition.splitlines():
        if line.startswith(name + "{") and f'endpoint="{endpoint}"' in line and f'reason="{reason}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a client that is killed or times out does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def raw(address: tuple[str, int], request: bytes, timeout: float = 10.0) -> bytes:
    """Send ``request`` and read the whole answer (the server closes after one)."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


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
        began = time.monotonic()
        text = trainer.scrape(timeout=10)
        assert sc.STEPS.prometheus_name in text
        assert time.monotonic() - began < 8  # answered, not queued behind the idle ones (generous)
    finally:
        for sock in idle:
            sock.close()
    assert during <= before + 2, (before, during)  # the workers already run; no thread per connection
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
            sock.sendall(b"GET / HTTP/1.1\r\n")  # headers that never end: each holds a worker until cut off
        began = time.monotonic()
        for sock in slow:  # every one is closed by the server: at its deadline, or evicted while idle
            sock.settimeout(5)
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(100) == b""
            sock.close()
        assert time.monotonic() - began < 3
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
    from otelprof.export.prometheus import render

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
    assert out.count("(set, hidden)") == 2


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


def _alert(labels: dict[str, str], fingerprint: str = "f") -> dict[str, Any]:
    return {"status": "firing", "labels": {"alertname": "OtelprofNonFiniteValues", "action": "stop", **labels},
            "annotations": {}, "startsAt": "2026-01-01T00:00:00Z", "fingerprint": fingerprint}


def _payload(*alerts: dict[str, Any]) -> bytes:
    return json.dumps({"version": "4", "status": "firing", "alerts": list(alerts)}).encode()


@pytest.fixture
def webhook_process(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``otelprof webhook`` as a real process, with the indexed-Job template target."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "otelprof", "webhook", "--host", "127.0.0.1", "--port", str(port), "--timeout", "2",
         "--target", "*=http://{job_name}-{rank}.{job_name}:9470", "--target", "*=http://{pod_ip}:{control_port}",
         "--control-port-base", "9470"],
        env={**child_env(), "OTELPROF_WEBHOOK_TOKEN": WEBHOOK_TOKEN, "OTELPROF_CONTROL_TOKEN": TOKEN},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + actions.HEALTH_PATH, timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
    yield url, proc
    proc.terminate()
    proc.communicate(timeout=10)


def post(url: str, body: bytes, token: str = WEBHOOK_TOKEN) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url + actions.PATH, data=body, method="POST",
                                     headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def test_an_alert_for_one_job_never_stops_another(webhook_process: tuple[str, subprocess.Popen[str]],
                                                 victim: Victim) -> None:
    url, proc = webhook_process
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
        status, answer = post(url, _payload(_alert(labels, fingerprint=str(i))))
        assert status == 400, (labels, answer)
        assert answer["decisions"][0]["result"].startswith("rejected:"), answer
    assert victim.stops == []
    with urllib.request.urlopen(url + actions.HEALTH_PATH, timeout=5) as response:
        health = json.load(response)
    assert sum(health["rejected"].values()) == len(hostile)
    proc.terminate()
    _, err = proc.communicate(timeout=10)
    rejections = [line for line in err.splitlines() if "rejected" in line]
    assert len(rejections) <= len(health["rejected"]), rejections  # once per cause


def test_a_valid_alert_still_reaches_its_own_target(victim: Victim) -> None:
    """The pod-IP template reaches exactly the control endpoint the alert's labels name."""
    receiver = actions.WebhookReceiver(WEBHOOK_TOKEN, actions.TargetMap([actions.parse_target(
        "*=http://{pod_ip}:{control_port}")]), TOKEN, control_port_base=victim.port - 1)
    status, answer = receiver.act(actions.parse_payload(_payload(_alert(
        {"job_name": "train-a", "rank": "3", "pod_ip": "127.0.0.1", "local_rank": "1"}))))
    assert status == 200, answer
    assert len(victim.stops) == 1


def test_webhook_refuses_nested_json_with_400_and_big_bodies_with_a_readable_413(
        webhook_process: tuple[str, subprocess.Popen[str]]) -> None:
    url, proc = webhook_process
    assert post(url, b"[" * 100_000 + b"]" * 100_000)[0] == 400
    assert post(url, b'{"version": "4", "alerts": ' + b"[" * 50_000 + b"]" * 50_000 + b"}")[0] == 400
    status, answer = post(url, b"x" * (2 * 1024 * 1024))  # urllib sends it all before reading the answer
    assert status == 413, answer
    assert post(url, _payload())[0] == 200  # still serving
    proc.terminate()
    _, err = proc.communicate(timeout=10)
    assert "Traceback" not in err, err
