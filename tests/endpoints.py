"""Real processes and raw sockets for the attack and fuzz tests of the HTTP surfaces: a training process that
serves /metrics and the control endpoint, and ``otelprof webhook``; their stderr goes to files (a flood must
fail a test, not fill a pipe and hang it)."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otelprof import semconv as sc
from otelprof.cli import actions
from tests.servers import free_port

REPO = Path(__file__).resolve().parents[1]
TOKEN = "s3cret-control"
WEBHOOK_TOKEN = "s3cret-webhook"

TRAINER = """
    import json, sys, threading, time
    import otelprof

    record_dir, control_port, token, obey = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
    session = otelprof.init(job_name="victim", record_dir=record_dir, metrics_exporters=("prometheus",),
                            prometheus_port=0, control_port=control_port, control_token=token, system_metrics=False)
    print(json.dumps({"metrics": session.metrics_address, "control": session.control_address}), flush=True)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    steps = 0
    while not done.is_set() and not (obey and session.should_stop()):
        with otelprof.step():
            with otelprof.annotate("forward"):
                time.sleep(0.002)
            otelprof.record("loss", 1.0)
        steps += 1
    print(json.dumps({"steps": steps, "stopped": session.should_stop()}), flush=True)
    otelprof.shutdown()
"""


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "KUBERNETES_SERVICE_HOST")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class Trainer:
    """A real training process serving /metrics and the control endpoint (token :data:`TOKEN`)."""

    proc: subprocess.Popen[str]
    metrics: tuple[str, int]
    control: tuple[str, int]
    stderr: Path

    @classmethod
    def start(cls, tmp_path: Path, obey_stop: bool = True) -> Trainer:
        stderr = tmp_path / "trainer.stderr"
        with open(stderr, "w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(TRAINER), str(tmp_path / "runs"), str(free_port()), TOKEN,
                 "1" if obey_stop else "0"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=child_env())
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, stderr.read_text()
        addresses = json.loads(line)
        return cls(proc, tuple(addresses["metrics"]), tuple(addresses["control"]), stderr)  # type: ignore[arg-type]

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/task"))

    def scrape(self, timeout: float = 10.0) -> str:
        with urllib.request.urlopen(f"http://{self.metrics[0]}:{self.metrics[1]}/metrics",
                                    timeout=timeout) as response:
            return str(response.read().decode())

    def finish(self) -> tuple[dict[str, Any], str]:
        """End the loop; (its last line, its whole stderr)."""
        out, _ = self.proc.communicate("", timeout=30)
        err = self.stderr.read_text()
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1]), err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@dataclass
class WebhookProcess:
    """``otelprof webhook`` as a real process (bearer token :data:`WEBHOOK_TOKEN`)."""

    url: str
    proc: subprocess.Popen[bytes]
    stderr: Path

    @classmethod
    def start(cls, tmp_path: Path, targets: Sequence[str], *args: str) -> WebhookProcess:
        port = free_port()
        stderr = tmp_path / "webhook.stderr"
        command = [sys.executable, "-m", "otelprof", "webhook", "--host", "127.0.0.1", "--port", str(port), *args]
        for target in targets:
            command += ["--target", target]
        with open(stderr, "w") as err:
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err,
                                    env=child_env(OTELPROF_WEBHOOK_TOKEN=WEBHOOK_TOKEN, OTELPROF_CONTROL_TOKEN=TOKEN))
        webhook = cls(f"http://127.0.0.1:{port}", proc, stderr)
        deadline = time.monotonic() + 30
        while True:
            try:
                webhook.health()
                return webhook
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, stderr.read_text()
                time.sleep(0.1)

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + actions.HEALTH_PATH, timeout=2) as response:
            return dict(json.load(response))

    def post(self, body: bytes, token: str = WEBHOOK_TOKEN) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(self.url + actions.PATH, data=body, method="POST",
                                         headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def stop(self) -> str:
        """Stop it; its whole stderr."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        return self.stderr.read_text()


def counted(exposition: str, endpoint: str, reason: str) -> float:
    """``otelprof.endpoint.errors`` of one endpoint and reason in an exposition."""
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


def raw(address: tuple[str, int], request: bytes, timeout: float = 10.0, half_close: bool = False) -> bytes:
    """Send ``request`` and read the whole answer (the server closes after one); ``half_close``: then say that
    nothing more comes (a request that claims a longer body is dropped instead of waited for)."""
    with socket.create_connection(address, timeout=timeout) as sock:
        try:
            sock.sendall(request)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):  # answered and closed before all of it was sent
            pass
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
        return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def alert(labels: dict[str, str], fingerprint: str = "f", action: str = "stop") -> dict[str, Any]:
    return {"status": "firing", "labels": {"alertname": "OtelprofNonFiniteValues", "action": action, **labels},
            "annotations": {}, "startsAt": "2026-01-01T00:00:00Z", "fingerprint": fingerprint}


def payload(*alerts: dict[str, Any]) -> bytes:
    return json.dumps({"version": "4", "status": "firing", "alerts": list(alerts)}).encode()
