"""`otelprof webhook` under an alert storm to targets that hang, over real sockets: every payload is answered at
once, /healthz and /metrics stay responsive, the queues and threads stay bounded, and a stop for a healthy job
(a real control endpoint, and a real training process) is still sent within the 10 s Alertmanager waits."""

from __future__ import annotations

import itertools
import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from otelprof.cli import actions
from otelprof.cli.action_queue import MAX_SHARED, QUEUE_FULL, QUEUED, TARGET_FULL, Action, ActionQueue
from otelprof.runtime import control
from otelprof.runtime._http import BackgroundServer, Limits, QuietHandler
from otelprof.runtime.control import ControlServer
from tests.servers import free_port, require_binary

TOKEN = "storm-webhook-token"
CONTROL_TOKEN = "storm-control-token"
DEADLINE = 10.0
"""Seconds Alertmanager waits for the webhook's answer (its default): the bound the issue names."""


class DeadTargets:
    """Listening sockets on 127.0.0.x that hang every request: ``never_accepting`` (the listen backlog is full,
    so a connect never completes) and ``silent`` (accepts, never reads or answers)."""

    def __init__(self) -> None:
        self._sockets: list[socket.socket] = []
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def never_accepting(self, host: str) -> int:
        listener = socket.socket()
        listener.bind((host, 0))
        listener.listen(0)
        port = int(listener.getsockname()[1])
        filler = socket.create_connection((host, port), timeout=5)  # fills the backlog: the next SYNs are dropped
        self._sockets += [listener, filler]
        return port

    def silent(self, host: str) -> int:
        listener = socket.socket()
        listener.bind((host, 0))
        listener.listen(128)
        listener.setblocking(False)
        self._sockets.append(listener)
        self._selector.register(listener, selectors.EVENT_READ)
        return int(listener.getsockname()[1])

    def _accept(self) -> None:
        while not self._stop.is_set():
            if not self._selector.get_map():
                time.sleep(0.05)
                continue
            for key, _ in self._selector.select(0.05):
                assert isinstance(key.fileobj, socket.socket)
                try:
                    connection, _ = key.fileobj.accept()
                except OSError:
                    continue
                self._sockets.append(connection)  # held open, never read, never answered

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._selector.close()
        for sock in self._sockets:
            sock.close()


@pytest.fixture
def dead() -> Iterator[DeadTargets]:
    targets = DeadTargets()
    yield targets
    targets.close()


class HealthyProcess:
    """A real control endpoint (otelprof.runtime.control) that sets an event when a stop reaches it."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.stops: list[str] = []
        self.server = ControlServer(self._stop, lambda steps: {"armed": True}, lambda: {}, CONTROL_TOKEN)
        assert self.server.start("127.0.0.1", 0) and self.server.address is not None
        self.url = f"http://127.0.0.1:{self.server.address[1]}"

    def _stop(self, reason: str, alert: str) -> dict[str, Any]:
        self.stops.append(alert)
        self.stopped.set()
        return {"stopping": True}


def alert(job: str, fingerprint: str, **labels: str) -> dict[str, Any]:
    return {"status": "firing", "labels": {"alertname": "OtelprofNonFiniteValues", "job_name": job, "rank": "0",
                                           "action": "stop", **labels},
            "annotations": {"summary": "The loss became NaN."}, "startsAt": "2026-01-01T00:00:00Z",
            "fingerprint": fingerprint}


def payload(alerts: list[dict[str, Any]]) -> bytes:
    return json.dumps({"version": "4", "status": "firing", "receiver": "otelprof-actions",
                       "alerts": alerts}).encode()


def wait_until(condition: Callable[[], bool], timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class Webhook:
    def __init__(self, targets: list[str], **options: Any) -> None:
        parsed = actions.TargetMap([actions.parse_target(t) for t in targets])
        self.receiver = actions.WebhookReceiver(TOKEN, parsed, CONTROL_TOKEN, max_body=4 * 1024 * 1024, **options)
        self.server = actions.WebhookServer(self.receiver)
        host, port = self.server.start_background("127.0.0.1", 0)
        self.url = f"http://{host}:{port}"

    def post(self, body: bytes) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(self.url + actions.PATH, data=body, method="POST",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=DEADLINE) as response:  # a hang fails here
            return response.status, json.load(response)

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=DEADLINE) as response:
            assert response.status == 200
            return bytes(response.read())

    def stop(self) -> None:
        self.server.stop()


def dead_targets(dead: DeadTargets, count: int) -> list[tuple[str, int]]:
    """``count`` distinct hanging targets (host, port): half never accept, half never answer."""
    hosts = [f"127.0.0.{10 + i}" for i in range(count)]
    return [(host, dead.never_accepting(host) if i % 2 == 0 else dead.silent(host)) for i, host in enumerate(hosts)]


def storm_alerts(name: str, count: int, targets: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """``count`` stop alerts, each for its own dead job, spread over ``targets``."""
    return [alert(f"{name}-{i}", f"{name}-{i}", host=targets[i % len(targets)][0].rsplit(".", 1)[1],
                  dead_port=str(targets[i % len(targets)][1])) for i in range(count)]


DEAD_TEMPLATE = "*=http://127.0.0.{host}:{dead_port}/{job_name}"
"""Every job but the healthy one: its own URL on one of the dead targets."""


def test_a_storm_to_hanging_targets_does_not_hold_up_a_stop_for_a_healthy_job(dead: DeadTargets) -> None:
    healthy = HealthyProcess()
    hanging = dead_targets(dead, 24)
    webhook = Webhook([f"healthy={healthy.url}", DEAD_TEMPLATE])
    threads_before = threading.active_count()
    try:
        # 8 concurrent payloads of 15 stop alerts, then one of 5,000: all answered, none waits for a target
        storms = [payload(storm_alerts(f"storm{p}", 15, hanging)) for p in range(8)]
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(webhook.post, storms))
        assert [status for status, _ in answers] == [202] * 8
        assert sum(answer["queued"] for _, answer in answers) == 8 * 15
        status, flood = webhook.post(payload(storm_alerts("flood", 5000, hanging)))
        assert status == 202 and flood["alerts"] == 5000 and len(flood["decisions"]) == actions.ANSWERED_DECISIONS
        queue = webhook.receiver.queue
        per_target_cap = len(hanging) * queue.per_target
        assert flood["queued"] <= per_target_cap  # each dead target's queue fills; the rest is dropped
        assert queue.dropped == {TARGET_FULL: 5000 - flood["queued"]}

        # health is answered while every worker may be waiting on a dead target
        health = json.loads(webhook.get(actions.HEALTH_PATH))
        assert health["ok"] and health["actions"]["queued"] + health["actions"]["in_flight"] > 0

        # the stop for the healthy job is sent while the storm's actions are still waiting
        status, answer = webhook.post(payload([alert("healthy", "legit")]))
        assert status == 202 and answer["decisions"][0]["result"] == f"{healthy.url}: stop queued"
        assert healthy.stopped.wait(DEADLINE), "the healthy job's stop was not sent"
        assert healthy.stops == ["OtelprofNonFiniteValues"]
        assert queue.depth() > per_target_cap / 2, "the storm was still queued when the stop went out"

        # bounded: each target holds at most its cap and the one in flight; at most 8 action workers
        assert queue.depth() <= min(queue.total, len(hanging) * (queue.per_target + 1))
        workers = [t for t in threading.enumerate() if t.name.startswith("otelprof-webhook-action")]
        assert len(workers) == queue.workers
        assert threading.active_count() <= threads_before + queue.workers + actions.LIMITS.workers + 1 \
            + control.LIMITS.workers  # the webhook's server, its worker kept for probes, the healthy endpoint's

        # /metrics: what happened, in the catalog's names; Prometheus' linter accepts it
        wait_until(lambda: queue.outcomes[("stop", "sent")] == 1)  # counted once the process's answer is read
        text = webhook.get(actions.METRICS_PATH).decode()
        lint = subprocess.run([require_binary("promtool"), "check", "metrics"], input=text, capture_output=True,
                              text=True, timeout=60)
        assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(text) for s in family.samples}
        assert samples[("otelprof_webhook_actions_total", (("action", "stop"), ("outcome", "sent")))] >= 1
        assert samples[("otelprof_webhook_dropped_total", (("reason", "target_full"),))] == 5000 - flood["queued"]
        assert samples[("otelprof_webhook_queue_depth", ())] > 0
        assert samples[("otelprof_webhook_targets_failing", ())] > 0
    finally:
        webhook.stop()
        healthy.server.stop()


def test_at_the_total_cap_a_flood_gives_way_to_a_stop(dead: DeadTargets) -> None:
    """A 5,000-alert payload fills the queue to its total; a later stop takes the place of the flood's newest
    action instead of being dropped."""
    healthy = HealthyProcess()
    hanging = dead_targets(dead, 8)
    webhook = Webhook([f"healthy={healthy.url}", DEAD_TEMPLATE], queue=ActionQueue(total=100))
    queue = webhook.receiver.queue
    try:
        status, flood = webhook.post(payload(storm_alerts("flood", 5000, hanging)))
        assert status == 202 and flood["queued"] == 100
        assert queue.dropped == {QUEUE_FULL: 4900}
        status, answer = webhook.post(payload([alert("healthy", "legit")]))
        assert status == 202 and answer["queued"] == 1
        assert queue.dropped == {QUEUE_FULL: 4901}  # the flood's newest action made room
        assert healthy.stopped.wait(DEADLINE), "the healthy job's stop was not sent"
    finally:
        webhook.stop()
        healthy.server.stop()


def _rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def test_floods_of_new_alerts_hold_bounded_state(dead: DeadTargets) -> None:
    """Round after round of 5,000 new stop alerts (new jobs, on hanging targets and on addresses that refuse):
    what the webhook holds stays within its caps, and its memory does not grow with the rounds."""
    hanging = dead_targets(dead, 8)
    refusing = [(f"127.0.0.{100 + i}", free_port()) for i in range(64)]  # nothing listens: refused at once
    webhook = Webhook([DEAD_TEMPLATE])
    queue = webhook.receiver.queue
    sizes = []
    try:
        for round_ in range(8):
            status, _ = webhook.post(payload(storm_alerts(f"r{round_}", 5000, [*hanging, *refusing])))
            assert status == 202
            with queue._cond:
                assert queue._queued + queue._in_flight <= queue.total
                assert len(queue._pending) == queue._queued + queue._in_flight
                assert len(queue._targets) <= 2 * queue.total + 1
                assert len(queue._served) <= 4 * queue.total + 1
                assert all(len(a.on_done) <= MAX_SHARED for a in queue._pending.values())
            sizes.append(_rss())
        assert queue.outcomes[("stop", "failed")] == 0  # nothing was given up yet: retried, not forgotten
        print(f"RSS after each round (MB): {[round(size / 2**20, 1) for size in sizes]}")
        assert sizes[-1] - sizes[1] < 32 * 1024 * 1024, sizes  # generous: a leak of the 35,000 alerts shows
    finally:
        webhook.stop()


def test_repeated_storms_to_one_dead_target_keep_one_action_queued(dead: DeadTargets) -> None:
    """Alertmanager re-sending the same alerts: identical pending actions are one; the dead target holds one
    worker and its queue never grows."""
    port = dead.never_accepting("127.0.0.9")
    healthy = HealthyProcess()
    webhook = Webhook([f"healthy={healthy.url}", f"*=http://127.0.0.9:{port}"])
    try:
        body = payload([alert(f"dead-{i}", f"dead-{i}") for i in range(15)])
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(webhook.post, [body] * 8))
        assert all(status == 202 or answer["queued"] == 0 for status, answer in answers)
        queue = webhook.receiver.queue
        assert queue.depth() == 1  # 120 alerts, one URL: one action
        assert queue.outcomes[("stop", "duplicate")] == 8 * 15 - 1
        [pending] = webhook.receiver.queue._pending.values()
        assert len(pending.on_done) == MAX_SHARED  # the duplicates beyond it cost nothing
        assert webhook.post(payload([alert("healthy", "legit")]))[0] == 202
        assert healthy.stopped.wait(DEADLINE)
    finally:
        webhook.stop()
        healthy.server.stop()


TRAINING = r"""
import json, sys, time
import otelprof

session = otelprof.init()
print(json.dumps({"event": "ready", "control": session.control_address}), flush=True)
step = 0
began = time.monotonic()
while time.monotonic() - began < 120:
    with otelprof.step():
        time.sleep(0.01)
    step += 1
    if session.should_stop():
        print(json.dumps({"event": "stopped", "step": step}), flush=True)
        break
otelprof.shutdown()
"""


def test_a_real_training_process_is_stopped_through_a_storm(dead: DeadTargets, tmp_path: Any) -> None:
    control_port = free_port()
    env = {**os.environ, "OTELPROF_JOB_NAME": "healthy", "OTELPROF_CONTROL_PORT": str(control_port),
           "OTELPROF_CONTROL_TOKEN": CONTROL_TOKEN, "OTELPROF_RECORD_DIR": str(tmp_path / "runs"),
           "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    training = subprocess.Popen([sys.executable, "-c", TRAINING], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hanging = dead_targets(dead, 16)
    webhook = Webhook([f"healthy=http://127.0.0.1:{control_port}", DEAD_TEMPLATE])
    try:
        assert training.stdout is not None
        ready = json.loads(training.stdout.readline())
        assert ready["event"] == "ready", training.stderr.read() if training.stderr else ""
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(webhook.post, [payload(storm_alerts(f"storm{p}", 15, hanging))
                                                   for p in range(8)]))
        assert [status for status, _ in answers] == [202] * 8
        assert webhook.post(payload([alert("healthy", "legit")]))[0] == 202
        out, err = training.communicate(timeout=60)
        stopped = [json.loads(line) for line in out.splitlines() if '"stopped"' in line]
        assert training.returncode == 0 and stopped, err[-3000:]
        assert "stop requested (alert OtelprofNonFiniteValues" in err
        assert webhook.receiver.queue.depth() > 0, "the storm was still queued when the process stopped"
    finally:
        if training.poll() is None:
            training.kill()
            training.wait(10)
        webhook.stop()


def test_post_json_never_waits_past_its_deadlines(dead: DeadTargets) -> None:
    """A target that never accepts fails at the connect timeout; one that accepts but never answers, and one
    that answers a byte at a time, at the request's timeout (generous bounds: they only catch a hang)."""
    never = dead.never_accepting("127.0.0.3")
    silent = dead.silent("127.0.0.4")
    trickle = socket.socket()
    trickle.bind(("127.0.0.5", 0))
    trickle.listen(8)
    stop = threading.Event()

    def drip() -> None:
        connection, _ = trickle.accept()
        with connection:
            for byte in b"HTTP/1.1 202 Accepted\r\n\r\n{}":
                if stop.wait(0.3):
                    return
                connection.sendall(bytes([byte]))

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    try:
        for url, error in ((f"http://127.0.0.3:{never}/v1/stop", TimeoutError),
                           (f"http://127.0.0.4:{silent}/v1/stop", TimeoutError),
                           (f"http://127.0.0.5:{trickle.getsockname()[1]}/v1/stop", TimeoutError)):
            began = time.monotonic()
            with pytest.raises(error):
                actions.post_json(url, {"reason": "x"}, CONTROL_TOKEN, 1.5)
            assert time.monotonic() - began < 1.5 + 2.0
    finally:
        stop.set()
        dripper.join(5)
        trickle.close()


class Blocked:
    """A send that blocks until released, recording the order sends started in."""

    def __init__(self, order: list[str]) -> None:
        self.order = order
        self.release = threading.Event()

    def send(self, name: str, status: int = 202) -> Callable[[], int]:
        def send() -> int:
            self.order.append(name)
            assert self.release.wait(30)
            return status
        return send


def test_queue_caps_eviction_and_turns() -> None:
    """Per-target cap, the total cap taking back from the largest payload, duplicates, and workers taking the
    payloads in turn."""
    order: list[str] = []
    gate = Blocked(order)
    queue = ActionQueue(workers=1, per_target=2, total=4)
    done: list[tuple[str, str]] = []

    def action(name: str, target: str) -> Action:
        return Action("stop", target, ("stop", name), gate.send(name), name,
                      on_done=[lambda outcome, _detail: done.append((name, outcome))])

    try:
        storm, other, late = queue.new_batch(), queue.new_batch(), queue.new_batch()
        assert queue.submit(action("a1", "a:1"), storm) == QUEUED
        while order != ["a1"]:  # the one worker took it and is blocked in it
            time.sleep(0.01)
        assert [queue.submit(action(n, "a:1"), storm) for n in ("a2", "a3", "a4")] == [QUEUED, QUEUED, TARGET_FULL]
        assert queue.submit(action("b1", "b:1"), other) == QUEUED  # 1 in flight and 3 queued: the total cap
        assert queue.submit(action("c1", "c:1"), late) == QUEUED  # takes the storm's newest one's place
        assert ("a3", QUEUE_FULL) in done
        assert queue.submit(action("c2", "c:2"), late) == QUEUE_FULL  # no payload holds more than late would
        assert queue.submit(action("b1", "b:1"), other) == "duplicate"
        assert queue.dropped == {TARGET_FULL: 1, QUEUE_FULL: 2}
        gate.release.set()
        assert queue.join(30)
        assert order == ["a1", "b1", "c1", "a2"]  # payloads in turn, not first come first served
        assert sorted(n for n, outcome in done if outcome == "sent") == ["a1", "a2", "b1", "b1", "c1"]
    finally:
        gate.release.set()
        queue.stop()


def test_a_failing_target_backs_off_and_gives_up_while_others_are_sent() -> None:
    attempts: list[float] = []

    def unreachable() -> int:
        attempts.append(time.monotonic())
        raise ConnectionRefusedError("refused")

    sent = threading.Event()
    queue = ActionQueue(workers=2, backoff=0.05, max_backoff=0.2, retry_for=1.0)
    outcomes: list[tuple[str, str]] = []
    try:
        queue.submit(Action("capture", "dead:1", ("capture", "dead"), unreachable, "dead",
                            on_done=[lambda outcome, detail: outcomes.append((outcome, detail))]))
        queue.submit(Action("stop", "ok:1", ("stop", "ok"), lambda: sent.set() or 202, "ok"))
        assert sent.wait(DEADLINE)
        assert queue.join(30)
        assert len(attempts) >= 3 and all(b - a >= 0.05 for a, b in itertools.pairwise(attempts))  # the backoff
        assert outcomes == [("failed", f"unreachable (refused); gave up after {len(attempts)} attempts")]
        assert queue.outcomes == {("capture", "failed"): 1, ("stop", "sent"): 1}
    finally:
        queue.stop()


def test_health_and_metrics_are_answered_while_targets_hang(dead: DeadTargets) -> None:
    """/healthz and /metrics never wait for the action workers, even when every one of them is on a dead
    target."""
    hanging = dead_targets(dead, 8)
    webhook = Webhook([DEAD_TEMPLATE], timeout=5.0)
    try:
        assert webhook.post(payload(storm_alerts("dead", 64, hanging)))[0] == 202
        queue = webhook.receiver.queue
        deadline = time.monotonic() + DEADLINE
        while queue.snapshot()["in_flight"] != queue.workers:  # every worker waits on a dead target
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for _ in range(20):
            assert json.loads(webhook.get(actions.HEALTH_PATH))["actions"]["queued"] > 0
            assert b"otelprof_webhook_queue_depth 64" in webhook.get(actions.METRICS_PATH)
        with pytest.raises(urllib.error.HTTPError) as info:
            webhook.post(b"{}")
        assert info.value.code == 400
    finally:
        webhook.stop()


def test_probes_go_before_requests_waiting_for_a_busy_worker() -> None:
    """With its one worker held by a request and more waiting, the server still answers GET /healthz (a server
    with priority paths keeps a worker for them); without priority paths the probe would wait its turn."""
    release, entered = threading.Event(), threading.Event()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            entered.set()
            release.wait(30)
            self.send_json(200, {})

        def do_GET(self) -> None:
            self.send_json(200, {"ok": True})

    server = BackgroundServer(Limits(workers=1, priority_paths=("/healthz",)))
    host, port = server.start("127.0.0.1", 0, Handler, "probe-test")
    posts = [socket.create_connection((host, port), timeout=DEADLINE) for _ in range(3)]
    try:
        posts[0].sendall(b"POST /x HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        assert entered.wait(DEADLINE)
        for sock in posts[1:]:
            sock.sendall(b"POST /x HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        for _ in range(3):
            with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=DEADLINE) as response:
                assert json.load(response) == {"ok": True}
        with pytest.raises(OSError):  # another path is no probe: it waits for the worker
            urllib.request.urlopen(f"http://{host}:{port}/healthzz", timeout=1)
        release.set()
        for sock in posts:
            assert sock.recv(100).startswith(b"HTTP/1.0 200")
    finally:
        release.set()
        for sock in posts:
            sock.close()
        server.stop()
