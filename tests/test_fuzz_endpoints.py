"""Property-based attacks on the HTTP surfaces, against real processes over real sockets: Alertmanager payload
mutations and hostile label values against ``otelprof webhook``, raw requests (methods, paths, headers, bodies)
against a training process's control endpoint. Every answer is a 4xx or 2xx with a one-line body, nothing is
printed on stderr, and a decoy server that a label value would reach if it could steer a URL is never hit.

Bounded for CI: derandomized, no example database, a fixed number of examples (a few seconds each)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.endpoints import TOKEN, Trainer, WebhookProcess, alert, counted, raw, status_of

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
"""The webhook answers 100 requests a second: 150 examples take about 2 s."""
FUZZ_CONTROL = settings(FUZZ, max_examples=100)
"""The control endpoint answers 10 requests a second: 100 examples take about 10 s."""


class Decoy:
    """A TCP listener that records every connection: the control endpoint of a job no alert here names."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.hits = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def decoy() -> Iterator[Decoy]:
    started = Decoy()
    yield started
    started.close()


def one_line(answer: bytes) -> bool:
    body = answer.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in answer else b""
    return b"\n" not in body and (not body or isinstance(json.loads(body), dict))


# ---------------------------------------------------------------------- the webhook

# Characters that cannot stand in a host, a DNS label or a port; at least one is in every hostile value.
METACHARACTERS = list(":/?#@[]%\\ \t\r\n\x00,;=&+$!*'()\"<>{}|^`~\u0663\uff0f\u2024")


def hostile(decoy: Decoy) -> st.SearchStrategy[str]:
    crafted = [f"127.0.0.1:{decoy.port}", f"127.0.0.1:{decoy.port}/v1/stop?", f"127.0.0.1:{decoy.port}#",
               f"x@127.0.0.1:{decoy.port}", f"[::1]:{decoy.port}", f"localhost:{decoy.port}/", f"{decoy.port}/",
               f"%31%32%37.0.0.1:{decoy.port}", f"127.0.0.1%3A{decoy.port}", f"0x7f.1:{decoy.port}",
               f"\u0661\u0662\u0667.0.0.1:{decoy.port}", f"{decoy.port}\n", f" {decoy.port}", f"+{decoy.port}"]
    text = st.text(st.characters(codec="utf-8"), max_size=20)
    forced = st.tuples(text, st.sampled_from(METACHARACTERS), text).map("".join)
    return st.one_of(st.sampled_from(crafted), forced)


def alerts(decoy: Decoy) -> st.SearchStrategy[dict[str, Any]]:
    """Firing stop/capture alerts whose job, rank, pod IP and local rank values are all hostile."""
    labels = st.fixed_dictionaries({"job_name": hostile(decoy), "pod_ip": hostile(decoy),
                                    "local_rank": hostile(decoy)},
                                   optional={"rank": hostile(decoy), "namespace": hostile(decoy)})
    return st.builds(alert, labels, st.text(max_size=8), st.sampled_from(["stop", "capture"]))


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)


def mutate(document: dict[str, Any], data: st.DataObject) -> bytes:
    """An Alertmanager payload changed the way broken or hostile senders change it."""
    kind = data.draw(st.sampled_from(["as is", "drop", "replace", "nest", "truncate", "bytes", "deep", "huge number"]))
    if kind == "drop":
        key = data.draw(st.sampled_from(sorted(document)))
        document = {k: v for k, v in document.items() if k != key}
    elif kind == "replace":
        path = data.draw(st.sampled_from([("version",), ("alerts",), ("alerts", 0), ("alerts", 0, "labels"),
                                          ("alerts", 0, "status"), ("alerts", 0, "labels", "action"),
                                          ("alerts", 0, "startsAt"), ("alerts", 0, "annotations")]))
        target: Any = document
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = data.draw(JSON)
    elif kind == "nest":
        document["alerts"] = [document["alerts"]] * data.draw(st.integers(1, 3))
    body = json.dumps(document).encode()
    if kind == "truncate":
        body = body[:data.draw(st.integers(0, max(0, len(body) - 1)))]
    elif kind == "bytes":
        body = data.draw(st.binary(max_size=200))
    elif kind == "deep":
        depth = data.draw(st.sampled_from([1_000, 100_000]))
        body = b'{"version": "4", "alerts": ' + b"[" * depth + b"]" * depth + b"}"
    elif kind == "huge number":
        body = body.replace(b'"4"', b"1" * 5000, 1).replace(b'"firing"', b"1e400", 1)
    return body


def test_fuzzed_alertmanager_payloads_never_act_on_another_target(tmp_path: Path, decoy: Decoy) -> None:
    webhook = WebhookProcess.start(
        tmp_path,
        ["*=http://{job_name}-{rank}.{job_name}:9470", "*=http://{pod_ip}:{control_port}",
         "*=http://[{pod_ip}]:9470", "*=http://127.0.0.2:9/jobs/{job_name}/{rank}"],
        "--timeout", "1", "--control-port-base", str(decoy.port))
    statuses: list[int] = []
    try:
        @FUZZ
        @given(st.lists(alerts(decoy), min_size=1, max_size=3), st.data())
        def attack(items: list[dict[str, Any]], data: st.DataObject) -> None:
            document = {"version": "4", "status": "firing", "receiver": "otelprof-actions", "groupLabels": {},
                        "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://am", "alerts": items}
            status, answer = webhook.post(mutate(document, data))
            statuses.append(status)
            assert 400 <= status < 500 or status == 200, (status, answer)
            for decision in answer.get("decisions", []):  # every firing action was rejected, none sent
                assert not decision["result"].startswith("http"), decision
            assert decoy.hits == 0

        attack()
        assert webhook.post(b"{}", token="wrong")[0] == 401
        health = webhook.health()
    finally:
        err = webhook.stop()
    assert decoy.hits == 0
    assert statuses.count(400) > len(statuses) // 2 and health["rejected"], health
    assert "Traceback" not in err and "internal" not in health["refused"], err[-2000:]
    logged = [line for line in err.splitlines() if "rejected an alert" in line]
    assert len(logged) <= 3 * len(health["rejected"]), logged  # once per cause, then at 10, 100, ...


# ---------------------------------------------------------------------- the control endpoint

ENDPOINTS = st.sampled_from(["POST /v1/stop", "POST /v1/capture", "GET /v1/status"])
METHODS = st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "CONNECT", "get", "", "G T",
                           "POST\x00", "\u00e9"]) | st.text(max_size=8)
PATHS = st.sampled_from(["/v1/stop", "/v1/capture", "/v1/status", "/", "/v1/stop?x=1", "//v1/stop", "/v1/../v1/stop",
                         "/%2e%2e/v1/stop", "*", "http://x/v1/stop", "/v1/stop#", "/v1/capture\x00"]) | \
    st.text(max_size=30).map(lambda t: "/" + t)
VERSIONS = st.sampled_from(["HTTP/1.0", "HTTP/1.1", "HTTP/2.0", "HTTP/9.9", "HTTP/1.1 extra", "", "HTTP/",
                            "HTTP/1.1\x00"])
REQUEST_LINES = st.one_of(  # half well formed (their headers and bodies fuzzed), half anything
    st.builds("{} {}".format, ENDPOINTS, st.sampled_from(["HTTP/1.0", "HTTP/1.1"])),
    st.builds("{} {} {}".format, METHODS, PATHS, VERSIONS))
AUTH = st.sampled_from([f"Bearer {TOKEN}", f"Bearer {TOKEN}", f"bearer {TOKEN}", "Bearer", "", f"Bearer {TOKEN}x",
                        "Basic Zm9vOmJhcg==", f"Bearer {TOKEN}\u00e9"])
HEADER_NAMES = st.sampled_from(["Content-Length", "Transfer-Encoding", "Expect", "Content-Type", "Connection", "Host",
                                "Authorization", "X-" + "a" * 100]) | st.text(max_size=10)
HEADER_VALUES = st.sampled_from(["0", "-1", "5", "99999999999", "1e3", " 2 ", "chunked", "100-continue", "close",
                                 "keep-alive"]) | st.text(max_size=20)
BODIES = st.one_of(st.binary(max_size=100), JSON.map(lambda v: json.dumps(v).encode()),
                   st.builds(lambda s, r: json.dumps({"steps": s, "reason": r}).encode(), JSON, JSON),
                   st.builds(lambda s, r: json.dumps({"steps": s, "reason": r}).encode(), st.integers(-5, 20_000),
                             st.text(max_size=600)),
                   st.integers(1, 30_000).map(lambda n: b"[" * n + b"]" * n),
                   st.integers(1, 30_000).map(lambda n: b'{"steps": ' + b"[" * n + b"]" * n + b"}"))


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    line = draw(REQUEST_LINES).encode("utf-8", "surrogateescape")
    headers = [(name, draw(HEADER_VALUES)) for name in draw(st.lists(HEADER_NAMES, max_size=4))]
    if draw(st.booleans()):
        headers.append(("Authorization", draw(AUTH)))
    body = draw(BODIES)
    if draw(st.booleans()):
        headers.append(("Content-Length", str(len(body))))
    head = b"".join(f"{name}: {value}\r\n".encode("utf-8", "surrogateescape") for name, value in headers)
    return line + b"\r\n" + head + b"\r\n" + body


def test_fuzzed_requests_to_the_control_endpoint_get_4xx_and_leave_the_training_job_silent(tmp_path: Path) -> None:
    trainer = Trainer.start(tmp_path, obey_stop=False)  # a valid stop may be drawn: the loop goes on regardless
    answered: list[int] = []
    try:
        @FUZZ_CONTROL
        @given(requests())
        def attack(request: bytes) -> None:
            answer = raw(trainer.control, request, half_close=True)
            if not answer:  # the request claimed more body than it sent, and the client said it was done
                return
            assert answer.startswith(b"HTTP/1."), answer[:200]
            status = status_of(answer)
            answered.append(status)
            assert status < 500, answer[:300]
            assert one_line(answer), answer[:300]

        attack()
        text = trainer.scrape()
    finally:
        result, err = trainer.finish()
    assert len(answered) > 70 and {400, 401} <= set(answered) and min(answered) < 300, sorted(set(answered))
    assert result["steps"] > 0
    # a valid stop may have been drawn: its one notice is all the training job's stderr may hold
    assert [line for line in err.splitlines() if "stop requested" not in line] == [], err[-3000:]
    assert counted(text, "control", "internal") == 0
