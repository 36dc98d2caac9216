"""A stop that stops: under ``otelprof run`` an unmodified training script (it never calls ``should_stop()``) ends
at the next step boundary after a stop request — from the control endpoint or from the webhook acting on a stop
alert — with exit status ``STOP_EXIT_STATUS``, its recording finished and no traceback; a step stuck past the stop
is ended after ``OTELPROF_STOP_GRACE_SECONDS`` with the same status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from otelprof import STOP_EXIT_STATUS
from otelprof.cli import actions
from otelprof.recording.reader import read_recording
from tests.servers import free_port
from tests.test_launch import ROOT, otelprof_lines
from tests.test_webhook import CONTROL_TOKEN, TOKEN, Webhook, alert, payload

pytest.importorskip("torch")

TRAIN = """
import os, sys, time, torch
from torch.utils.data import DataLoader, TensorDataset
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
stuck = sys.argv[1]
for epoch in range(100_000):
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        if os.path.exists(stuck):  # a step that never ends: a collective that hangs, a read that never returns
            open(stuck + ".in", "w").close()
            time.sleep(1000)
        opt.step()
        time.sleep(0.01)
print("the loop ended", flush=True)
"""

EXIT_BOUND = 60.0
"""Generous: the stopped process ends in well under a second; the rest is a loaded machine."""


POLLING = """
import time, otelprof, torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
session = otelprof.get_session()
while not session.should_stop():  # a program that handles stops itself
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.01)
time.sleep(1.5)  # a checkpoint written after the loop: longer than the grace period
print("left the loop", flush=True)
"""


@contextmanager
def training(tmp_path: Path, env: dict[str, str] | None = None,
             source: str = TRAIN) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``otelprof run -- python train.py`` with its control endpoint on a free port: the process and the
    endpoint's URL. Killed at the end if it still runs."""
    script = tmp_path / "train.py"
    script.write_text(source)
    port = free_port()
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                              if p),
                   "OTELPROF_RECORD_DIR": str(tmp_path / "runs"), "OTELPROF_RUN_ID": "run",
                   "OTELPROF_JOB_NAME": "train", "OTELPROF_SYSTEM_METRICS": "false",
                   "OTELPROF_CONTROL_PORT": str(port), "OTELPROF_CONTROL_TOKEN": CONTROL_TOKEN, **(env or {})}
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_METRICS_EXPORTER", "OTEL_TRACES_EXPORTER"):
        environment.pop(name, None)
    process = subprocess.Popen([sys.executable, "-m", "otelprof", "run", "--", sys.executable, str(script),
                                str(tmp_path / "stuck")], env=environment, cwd=tmp_path, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield process, f"http://127.0.0.1:{port}"
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def control(url: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    request = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(),
                                     method="GET" if body is None else "POST",
                                     headers={"Authorization": f"Bearer {CONTROL_TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.load(response)
        return answer


def wait_for_steps(process: subprocess.Popen[str], url: str, steps: int = 5, timeout: float = 120.0) -> None:
    """Until the script has run ``steps`` steps (its control endpoint's status says so)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1][-4000:]
        try:
            if control(url, "/v1/status")["next_step"] >= steps:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"fewer than {steps} steps in {timeout} s")


def ended(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    """The exit status, stdout and stderr of ``process``, which must end within :data:`EXIT_BOUND`."""
    try:
        out, err = process.communicate(timeout=EXIT_BOUND)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"still running {EXIT_BOUND} s after the stop; stderr:\n{err[-4000:]}") from None
    return process.returncode, out, err


def assert_stopped(tmp_path: Path, status: int, out: str, err: str, how: str) -> None:
    """Ended with the stop's status, quietly, with its recording finished: steps recorded, the stop noted."""
    assert status == STOP_EXIT_STATUS, err[-4000:]
    assert "Traceback" not in err, err[-4000:]
    assert "the loop ended" not in out
    assert all(line.startswith("otelprof") for line in err.splitlines()), err[-4000:]
    recording = read_recording(tmp_path / "runs" / "run")
    rank = recording.ranks[0]
    assert rank.manifest["status"] == "finished"
    assert len(rank.steps) >= 5
    assert rank.manifest["stop"]["exit"] == how and rank.manifest["stop"]["exit_status"] == STOP_EXIT_STATUS
    assert otelprof_lines(err)[-1] == "otelprof: run run recorded; report: otelprof report runs/run"


def test_a_stop_on_the_control_endpoint_ends_an_unmodified_script(tmp_path: Path) -> None:
    with training(tmp_path) as (process, url):
        wait_for_steps(process, url)
        answer = control(url, "/v1/stop", {"reason": "test"})
        assert answer["stopping"] is True
        status, out, err = ended(process)
    assert_stopped(tmp_path, status, out, err, "step boundary")
    assert "stopping at the next step boundary" in err


@contextmanager
def webhook_for(job: str, url: str) -> Iterator[Webhook]:
    """``otelprof webhook``'s receiver over HTTP, mapping ``job`` to the control endpoint ``url``."""
    targets = actions.TargetMap([actions.parse_target(f"{job}={url}")])
    server = actions.WebhookServer(actions.WebhookReceiver(TOKEN, targets, CONTROL_TOKEN))
    host, port = server.start_background("127.0.0.1", 0)
    try:
        yield Webhook(f"http://{host}:{port}", server)
    finally:
        server.stop()


def test_a_stop_alert_through_the_webhook_ends_an_unmodified_script(tmp_path: Path) -> None:
    with training(tmp_path) as (process, url), webhook_for("train", url) as webhook:
        wait_for_steps(process, url)
        status, answer = webhook.post(payload(alert("OtelprofNonFiniteValues", "train", rank="0")))
        assert status == 202, answer
        status, out, err = ended(process)
    assert_stopped(tmp_path, status, out, err, "step boundary")
    assert "alert OtelprofNonFiniteValues" in err


def test_a_step_stuck_after_the_stop_is_ended_after_the_grace_period(tmp_path: Path) -> None:
    with training(tmp_path, env={"OTELPROF_STOP_GRACE_SECONDS": "2"}) as (process, url):
        wait_for_steps(process, url)
        (tmp_path / "stuck").touch()
        deadline = time.monotonic() + EXIT_BOUND
        while not (tmp_path / "stuck.in").exists():  # the step is in its sleep
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
        control(url, "/v1/stop", {"reason": "test"})
        status, out, err = ended(process)
    assert_stopped(tmp_path, status, out, err, "grace period")
    assert "no step boundary within 2 s of the stop request" in err


def test_a_script_that_asks_for_stops_itself_leaves_on_its_own(tmp_path: Path) -> None:
    """``should_stop()`` in the loop: as without ``otelprof run``, the program leaves its loop and exits as it
    chooses; the grace period (short here) does not cut what it does after the stop."""
    with training(tmp_path, env={"OTELPROF_STOP_GRACE_SECONDS": "0.5"}, source=POLLING) as (process, url):
        wait_for_steps(process, url)
        control(url, "/v1/stop", {"reason": "test"})
        status, out, err = ended(process)
    assert status == 0, err[-4000:]
    assert out == "left the loop\n" and "Traceback" not in err
    manifest = read_recording(tmp_path / "runs" / "run").ranks[0].manifest
    assert manifest["status"] == "finished" and "exit" not in manifest["stop"]


def test_the_grace_period_setting_argument_over_variable_over_default() -> None:
    from otelprof.config import Config, ConfigError

    assert Config.from_env({}).stop_grace == 300.0
    assert Config.from_env({"OTELPROF_STOP_GRACE_SECONDS": "2.5"}).stop_grace == 2.5
    assert Config.from_env({"OTELPROF_STOP_GRACE_SECONDS": "2.5"}, stop_grace=7).stop_grace == 7.0
    assert Config.from_env({"OTELPROF_STOP_GRACE_SECONDS": "0"}).stop_grace == 0.0  # wait for ever
    for bad in ("-1", "abc", "1e9"):
        assert Config.from_env({"OTELPROF_STOP_GRACE_SECONDS": bad}).stop_grace == 300.0
        with pytest.raises(ConfigError):
            Config.from_env({"OTELPROF_STOP_GRACE_SECONDS": bad}, strict=True)
    assert Config.from_env({}, stop_grace=-3).stop_grace == 300.0
