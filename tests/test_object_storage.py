"""Recordings to object storage: real jobs under ``otelprof run`` upload to a real S3-compatible server (moto's
server mode on 127.0.0.1); ``otelprof report|timeline|check|compare s3://...`` read them back."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from otelprof import semconv as sc
from otelprof.recording import remote
from otelprof.recording.reader import read_recording

logging.getLogger("werkzeug").setLevel(logging.ERROR)


class S3:
    """A moto server in this process; its buckets outlive a stop() and start() on the same port."""

    def __init__(self) -> None:
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        self.host, self.port = self.server.get_host_and_port()
        self.endpoint = f"http://{self.host}:{self.port}"
        self.env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint}

    def client(self) -> Any:
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    def keys(self, bucket: str) -> list[str]:
        return sorted(o["Key"] for o in self.client().list_objects_v2(Bucket=bucket).get("Contents", []))

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    server = S3()
    for key, value in server.env.items():
        monkeypatch.setenv(key, value)
    yield server
    server.stop()


def _env(s3: S3, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTELPROF_")}
    return {**env, **s3.env, **settings}


def _otelprof(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otelprof", *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=cwd)


TORCH_LOOP = """
import json, sys
import torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(96, 8), torch.randint(0, 2, (96,))),
                                   batch_size=4)
steps = 0
for epoch in range(2):
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
json.dump({"steps": steps}, open(sys.argv[1], "w"))
"""


def test_torch_run_uploads_and_every_command_reads_the_url(s3: S3, tmp_path: Path) -> None:
    s3.client().create_bucket(Bucket="runs")
    script, mine = tmp_path / "loop.py", tmp_path / "loop.json"
    script.write_text(TORCH_LOOP)
    spool = tmp_path / "spool"
    env = _env(s3, OTELPROF_RECORD_DIR="s3://runs/team/a", OTELPROF_RECORD_SPOOL_DIR=str(spool),
               OTELPROF_RECORD_UPLOAD_INTERVAL="0.2", OTELPROF_RUN_ID="torch-run", OTELPROF_SYSTEM_METRICS="false")
    job = _otelprof("run", "--", sys.executable, str(script), str(mine), env=env, cwd=tmp_path)
    assert job.returncode == 0, job.stderr
    assert "Traceback" not in job.stderr and "failed" not in job.stderr, job.stderr
    assert "otelprof: recording run torch-run to s3://runs/team/a/torch-run" in job.stderr
    assert "otelprof: run torch-run uploaded; report: otelprof report s3://runs/team/a/torch-run" in job.stderr
    steps = json.loads(mine.read_text())["steps"]
    keys = s3.keys("runs")
    assert "team/a/torch-run/rank-0/manifest.json" in keys
    assert any(k.startswith("team/a/torch-run/rank-0/steps.jsonl.parts/") for k in keys)
    assert not any(spool.rglob("*.jsonl")), job.stderr

    local = remote.local_copy("s3://runs/team/a")  # a folder of runs: its newest
    assert local.name == "torch-run"
    recording = read_recording(local)
    numbers = [s.number for s in recording.ranks[0].steps if s.phase == "train"]
    assert numbers == list(range(steps))
    manifest = json.loads((local / "rank-0" / "manifest.json").read_text())
    assert manifest["status"] == "finished"

    check = _otelprof("check", "--json", "s3://runs/team/a/torch-run", env=env, cwd=tmp_path)
    assert check.returncode in (0, 1), check.stderr
    rows = {r["alert"]: r for r in json.loads(check.stdout)["checks"]}
    assert rows["OtelprofTrainingStalled"]["datapoints"] == steps
    report = _otelprof("report", "s3://runs/team/a/torch-run/rank-0", "-o", str(tmp_path / "r.html"), "--quiet",
                       env=env, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "r.html").stat().st_size > 0
    timeline = _otelprof("timeline", "s3://runs/team/a", "-o", str(tmp_path / "t.json"), "--quiet", env=env,
                         cwd=tmp_path)
    assert timeline.returncode == 0, timeline.stderr
    trace = json.loads((tmp_path / "t.json").read_text())
    assert trace["otherData"]["steps_in_run"] == steps
    compare = _otelprof("compare", "s3://runs/team/a/torch-run", "s3://runs/team/a", "--format", "json",
                        env=env, cwd=tmp_path)
    assert compare.returncode == 0, compare.stderr
    assert [r["steps"] for r in json.loads(compare.stdout)["runs"]] == [steps, steps]


PLAIN_LOOP = """
import sys
import otelprof
number = 0
def steps(count, regions):
    global number
    for _ in range(count):
        with otelprof.step():
            for _ in range(regions):
                with otelprof.annotate("load"):
                    pass
            otelprof.record("loss", 1.0 / (number + 1))
        number += 1
steps(20, 1)
print("A", number, flush=True)
sys.stdin.readline()
steps(300, 40)
print("B", number, flush=True)
sys.stdin.readline()
steps(20, 1)
print("C", number, flush=True)
"""


class Lines:
    """Lines of a pipe, read on a thread (so that the job never blocks on a full pipe)."""

    def __init__(self, pipe: IO[str]) -> None:
        self.seen: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            self.seen.append(line)

    def wait_for(self, text: str, timeout: float = 120.0) -> str:
        """The first line holding ``text`` (waiting for it)."""
        found: list[str] = []
        _wait(lambda: found.extend(line for line in list(self.seen) if text in line) or bool(found),
              f"a line with {text!r}", timeout)
        return found[0]

    def text(self) -> str:
        self._thread.join(30)
        return "".join(self.seen)


def _wait(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:  # a bound on waiting, not a timed assertion
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_storage_going_away_mid_run_costs_counted_lines_not_the_job(s3: S3, tmp_path: Path) -> None:
    s3.client().create_bucket(Bucket="outage")
    script = tmp_path / "loop.py"
    script.write_text(PLAIN_LOOP)
    spool = tmp_path / "spool"
    env = _env(s3, OTELPROF_RECORD_DIR="s3://outage/runs", OTELPROF_RECORD_SPOOL_DIR=str(spool),
               OTELPROF_RECORD_UPLOAD_INTERVAL="0.2", OTELPROF_RECORD_SPOOL_MAX_BYTES="65536",
               OTELPROF_RUN_ID="outage-run", OTELPROF_SYSTEM_METRICS="false", OTELPROF_SHUTDOWN_TIMEOUT="30")
    job = subprocess.Popen([sys.executable, "-m", "otelprof", "run", "--", sys.executable, str(script)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           cwd=tmp_path)
    assert job.stdin is not None and job.stdout is not None and job.stderr is not None
    out, err = Lines(job.stdout), Lines(job.stderr)
    try:
        assert out.wait_for("A ") == "A 20\n"
        _wait(lambda: any(".parts/" in k and "steps" in k for k in s3.keys("outage")), "the first upload")
        s3.stop()  # the storage goes away
        job.stdin.write("go\n")
        job.stdin.flush()
        assert out.wait_for("B ") == "B 320\n"  # the steps went on
        err.wait_for("uploading the run recording")
        err.wait_for("its oldest parts are deleted")  # the spool stayed bounded
        s3.restart()
        job.stdin.write("go\n")
        job.stdin.flush()
        assert out.wait_for("C ") == "C 340\n"
        assert job.wait(120) == 0
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    stderr = err.text()
    assert "Traceback" not in stderr, stderr
    assert stderr.count("uploading the run recording to s3://outage/runs failed") == 1, stderr
    assert not any(spool.rglob("*.jsonl")), "everything left was uploaded after the storage came back"

    local = remote.local_copy("s3://outage/runs/outage-run")
    manifest = json.loads((local / "rank-0" / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    assert manifest["dropped"][sc.DROPPED_RECORDING_UPLOAD] > 0, manifest["dropped"]
    numbers = [s.number for s in read_recording(local).ranks[0].steps]
    assert numbers[:20] == list(range(20))  # uploaded before the outage
    assert numbers[-20:] == list(range(320, 340))  # written after the storage came back
    assert numbers == sorted(set(numbers)) and len(numbers) < 340  # parts kept their order; what went is gone


SIGTERM_LOOP = """
import time
import otelprof
number = 0
while True:
    with otelprof.step():
        time.sleep(0.002)
    print(number, flush=True)
    number += 1
"""


def test_sigterm_uploads_what_was_recorded(s3: S3, tmp_path: Path) -> None:
    s3.client().create_bucket(Bucket="preempted")
    script = tmp_path / "loop.py"
    script.write_text(SIGTERM_LOOP)
    env = _env(s3, OTELPROF_RECORD_DIR="s3://preempted", OTELPROF_RECORD_SPOOL_DIR=str(tmp_path / "spool"),
               OTELPROF_RECORD_UPLOAD_INTERVAL="3600", OTELPROF_RUN_ID="pod", OTELPROF_SYSTEM_METRICS="false",
               OTELPROF_SHUTDOWN_TIMEOUT="20")
    job = subprocess.Popen([sys.executable, "-m", "otelprof", "run", "--", sys.executable, str(script)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    assert job.stdout is not None and job.stderr is not None
    out, err = Lines(job.stdout), Lines(job.stderr)
    try:
        out.wait_for("50\n")
        assert s3.keys("preempted") == [], "nothing before the (hour-long) upload interval"
        job.send_signal(signal.SIGTERM)
        assert job.wait(120) == -signal.SIGTERM  # killed by the signal, as it would be without otelprof
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert "Traceback" not in err.text()
    last = int(out.text().split()[-1])
    local = remote.local_copy("s3://preempted")
    manifest = json.loads((local / "rank-0" / "manifest.json").read_text())
    assert manifest["status"] == "finished" and "sigterm" in manifest
    numbers = [s.number for s in read_recording(local).ranks[0].steps]
    assert numbers[: last + 1] == list(range(last + 1))


def test_unusable_url_warns_once_and_keeps_the_local_recording(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTELPROF_")}
    env.update(OTELPROF_RECORD_DIR="nosuchstore://bucket/x", OTELPROF_RECORD_SPOOL_DIR=str(tmp_path / "spool"),
               OTELPROF_RUN_ID="kept", OTELPROF_SYSTEM_METRICS="false")
    code = "import otelprof\nfor _ in range(7):\n    with otelprof.step():\n        pass\n"
    job = subprocess.run([sys.executable, "-m", "otelprof", "run", "--", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert job.returncode == 0, job.stderr
    assert job.stderr.count("cannot be used") == 1 and "Traceback" not in job.stderr, job.stderr
    recording = read_recording(tmp_path / "spool" / "kept")
    assert len(recording.ranks[0].steps) == 7


@pytest.mark.parametrize("url, message", [
    ("s3://no-such-bucket-here/runs", "cannot list"),
    ("nosuchstore://bucket/x", "cannot be used"),
])
def test_bad_urls_are_one_line_errors(s3: S3, tmp_path: Path, url: str, message: str) -> None:
    for command in (["check"], ["report", "-o", str(tmp_path / "r.html")], ["timeline", "-o", str(tmp_path / "t")],
                    ["compare", url, url]):
        result = _otelprof(*command[:1], url, *command[1:], env=_env(s3), cwd=tmp_path) if command[0] != "compare" \
            else _otelprof(*command, env=_env(s3), cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_an_empty_prefix_is_not_a_recording(s3: S3, tmp_path: Path) -> None:
    s3.client().create_bucket(Bucket="empty")
    s3.client().put_object(Bucket="empty", Key="other/readme.txt", Body=b"x")
    result = _otelprof("check", "s3://empty/other", env=_env(s3), cwd=tmp_path)
    assert result.returncode == 2
    assert "not an otelprof recording" in result.stderr and result.stderr.count("\n") == 1


def test_kubernetes_overlay_records_to_object_storage() -> None:
    from otelprof.config import Config
    from tests.test_deploy import build

    docs = build("overlays/object-storage")
    [job] = [d for d in docs if d["kind"] == "Job"]
    [trainer] = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in trainer["env"]}
    assert remote.is_url(env["OTELPROF_RECORD_DIR"]["value"])
    secret_keys = {e["valueFrom"]["secretKeyRef"]["key"] for e in env.values()
                   if "secretKeyRef" in e.get("valueFrom", {}) and e["valueFrom"]["secretKeyRef"]["name"]
                   == "otelprof-storage"}
    [secret] = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "otelprof-storage"]
    assert secret_keys == {"access-key-id", "secret-access-key"} and secret_keys <= set(secret["data"])
    config = Config.from_env({k: e["value"] for k, e in env.items() if "value" in e}, strict=True)
    [mount] = [m for m in trainer["volumeMounts"] if m["mountPath"] == config.record_spool_dir]
    [volume] = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["emptyDir"]["sizeLimit"] == "2Gi"
    ranks = sum(1 for p in trainer["ports"] if p["name"].startswith("metrics-"))
    assert ranks * config.record_spool_max_bytes < 2 * 2**30  # every rank's spool fits the volume
    assert config.shutdown_timeout < job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]


def test_parts_an_unreachable_storage_left_go_up_with_the_next_process(s3: S3, tmp_path: Path) -> None:
    s3.client().create_bucket(Bucket="restart")
    spool = tmp_path / "spool"
    code = ("import sys, otelprof\nfor _ in range(int(sys.argv[1])):\n    with otelprof.step():\n"
            "        otelprof.record('loss', 1.0)\n")
    settings = {"OTELPROF_RECORD_DIR": "s3://restart/runs", "OTELPROF_RECORD_SPOOL_DIR": str(spool),
                "OTELPROF_RUN_ID": "resumed", "OTELPROF_SYSTEM_METRICS": "false", "AWS_MAX_ATTEMPTS": "1",
                "OTELPROF_SHUTDOWN_TIMEOUT": "30"}
    s3.stop()  # the first process never reaches the storage
    first = subprocess.run([sys.executable, "-m", "otelprof", "run", "--", sys.executable, "-c", code, "30"],
                           capture_output=True, text=True, timeout=120, env=_env(s3, **settings), cwd=tmp_path)
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr
    assert first.stderr.count("uploading the run recording to s3://restart/runs failed") == 1, first.stderr
    left = list((spool / "resumed" / "rank-0" / remote.PENDING).glob("*"))
    assert any(p.name.endswith(".steps.jsonl") for p in left), "the parts wait in the spool"
    s3.restart()
    assert s3.keys("restart") == []
    second = subprocess.run([sys.executable, "-m", "otelprof", "run", "--", sys.executable, "-c", code, "12"],
                            capture_output=True, text=True, timeout=120, env=_env(s3, **settings), cwd=tmp_path)
    assert second.returncode == 0 and "failed" not in second.stderr, second.stderr
    assert second.stderr.count(f"uploading {len(left)} parts a previous process left in") == 1, second.stderr
    # A restart records as a new run (resumed-2: the writer's claim) and uploads its predecessor's parts to the
    # predecessor's run.
    local = remote.local_copy("s3://restart/runs/resumed-2")
    lines = [json.loads(line) for line in (local / "rank-0" / "steps.jsonl").read_text().splitlines()]
    assert [d["n"] for d in lines if d["k"] == "s"] == list(range(12))
    earlier = remote.local_copy("s3://restart/runs/resumed")
    assert json.loads((earlier / "rank-0" / "manifest.json").read_text())["status"] == "finished"
    assert [s.number for s in read_recording(earlier).ranks[0].steps] == list(range(30))
    assert not list((spool / "resumed" / "rank-0").glob("*.jsonl")), "nothing is left to upload"


def test_an_outage_leaves_a_few_parts_not_one_per_interval(s3: S3, tmp_path: Path) -> None:
    """Uploads every 0.2 s with the storage away for the whole run: the lines wait in one part per file (up to
    an eighth of the spool's bound each), then all go up, in order, with the next process."""
    s3.client().create_bucket(Bucket="merged")
    spool = tmp_path / "spool"
    code = ("import sys, time, otelprof\nfor _ in range(int(sys.argv[1])):\n    with otelprof.step():\n"
            "        time.sleep(0.02)\n")
    settings = {"OTELPROF_RECORD_DIR": "s3://merged/runs", "OTELPROF_RECORD_SPOOL_DIR": str(spool),
                "OTELPROF_RUN_ID": "outage", "OTELPROF_SYSTEM_METRICS": "false", "AWS_MAX_ATTEMPTS": "1",
                "OTELPROF_RECORD_UPLOAD_INTERVAL": "0.2", "OTELPROF_SHUTDOWN_TIMEOUT": "30"}
    s3.stop()
    first = subprocess.run([sys.executable, "-m", "otelprof", "run", "--", sys.executable, "-c", code, "150"],
                           capture_output=True, text=True, timeout=120, env=_env(s3, **settings), cwd=tmp_path)
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr
    left = sorted(p.name for p in (spool / "outage" / "rank-0" / remote.PENDING).glob("*"))
    steps = [name for name in left if name.endswith(".steps.jsonl")]
    assert 1 <= len(steps) <= 2, left  # a part per round without merging (6 here)
    s3.restart()
    second = subprocess.run([sys.executable, "-m", "otelprof", "run", "--", sys.executable, "-c", code, "3"],
                            capture_output=True, text=True, timeout=120, env=_env(s3, **settings), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    earlier = remote.local_copy("s3://merged/runs/outage")
    assert [s.number for s in read_recording(earlier).ranks[0].steps] == list(range(150))


GRACEFUL_LOOP = """
import signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))  # the application's graceful stop
import otelprof
otelprof.init(system_metrics=False, profile_every=0)
number = 0
while not stop:
    with otelprof.step():
        time.sleep(0.002)
    print(number, flush=True)
    number += 1
print("stopping", flush=True)
sys.stdin.readline()
otelprof.shutdown()
"""


def test_sigterm_to_a_graceful_job_uploads_at_once(s3: S3, tmp_path: Path) -> None:
    s3.client().create_bucket(Bucket="graceful")
    script = tmp_path / "loop.py"
    script.write_text(GRACEFUL_LOOP)
    env = _env(s3, OTELPROF_RECORD_DIR="s3://graceful", OTELPROF_RECORD_SPOOL_DIR=str(tmp_path / "spool"),
               OTELPROF_RECORD_UPLOAD_INTERVAL="3600", OTELPROF_RUN_ID="graceful")
    job = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    assert job.stdin is not None and job.stdout is not None and job.stderr is not None
    out, err = Lines(job.stdout), Lines(job.stderr)
    try:
        out.wait_for("20\n")
        job.send_signal(signal.SIGTERM)
        out.wait_for("stopping")
        _wait(lambda: any(".parts/" in k and "steps" in k for k in s3.keys("graceful")), "the upload on SIGTERM")
        assert job.poll() is None  # uploaded while the job still runs, not at its exit
        job.stdin.write("\n")
        job.stdin.flush()
        assert job.wait(120) == 0
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert err.text() == ""
    manifest = json.loads((remote.local_copy("s3://graceful") / "rank-0" / "manifest.json").read_text())
    assert "sigterm" in manifest and manifest["status"] == "finished"


LOST_TASKS = '''
import asyncio, sys
from otelprof.recording import remote

fs, _ = remote.filesystem("s3://outage/runs")  # construction only: nothing is sent
remote.filesystem("s3://outage/runs")  # a second filesystem on the same loop: the handler not wrapped twice
handler = fs.loop.get_exception_handler()
assert type(handler).__name__ == "_QuietHandler" and handler.previous is None, handler

async def fail(exc):
    raise exc

async def leave(exc):  # a task that fails and that nobody awaits, as an async client leaves one in an outage
    asyncio.ensure_future(fail(exc))
    await asyncio.sleep(0.05)

for exc in (ConnectionResetError("lost-connection"), ValueError("a-real-bug")):
    asyncio.run_coroutine_threadsafe(leave(exc), fs.loop).result(10)
print("done", flush=True)
'''


def test_tasks_lost_with_the_connection_are_not_printed_on_the_jobs_stderr(tmp_path: Path) -> None:
    """The storage client's event loop drops unawaited tasks that failed on a lost connection (asyncio would print
    each as "Task exception was never retrieved" with a traceback on the job's stderr); any other such task is
    still reported."""
    done = subprocess.run([sys.executable, "-c", LOST_TASKS], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    assert "lost-connection" not in done.stderr
    assert "never retrieved" in done.stderr and "a-real-bug" in done.stderr
