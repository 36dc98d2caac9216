"""What a process left in the upload spool is uploaded by the next one: real jobs under ``otelprof run``,
killed with SIGKILL while a real S3-compatible server (moto's server mode) is down, restarted with it up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from otelprof import semconv as sc
from otelprof.recording import remote, spool
from otelprof.recording.reader import read_recording
from tests.test_object_storage import S3, Lines, _env, _wait


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    server = S3()
    for key, value in server.env.items():
        monkeypatch.setenv(key, value)
    yield server
    server.stop()


KILLED_LOOP = """
import sys
import torch
import otelprof
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))),
                                   batch_size=4)
steps = 0
def epoch():
    global steps
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
    otelprof.get_session().flush_recording()  # what the recording holds on disk now
epoch()
print("A", steps, flush=True)
sys.stdin.readline()
epoch()
epoch()
print("B", steps, flush=True)
sys.stdin.readline()  # killed here
"""

SHORT_LOOP = "import otelprof\nfor _ in range(5):\n    with otelprof.step():\n        pass\n"


def _metric(rank_dir: Path, name: str) -> float:
    """The last value of counter ``name`` in a rank's metrics.jsonl (OTLP JSON), 0 when absent."""
    value = 0.0
    for line in (rank_dir / "metrics.jsonl").read_text().splitlines():
        for resource in json.loads(line)["resourceMetrics"]:
            for scope in resource["scopeMetrics"]:
                for metric in scope["metrics"]:
                    if metric["name"] == name:
                        value = sum(float(p.get("asInt", p.get("asDouble", 0))) for p in metric["sum"]["dataPoints"])
    return value


def test_a_restart_uploads_what_a_killed_process_left(store: S3, tmp_path: Path) -> None:
    store.client().create_bucket(Bucket="kills")
    script = tmp_path / "loop.py"
    script.write_text(KILLED_LOOP)
    spool_dir = tmp_path / "spool"
    env = _env(store, OTELPROF_RECORD_DIR="s3://kills/runs", OTELPROF_RECORD_SPOOL_DIR=str(spool_dir),
               OTELPROF_RECORD_UPLOAD_INTERVAL="0.2", OTELPROF_RUN_ID="killed", OTELPROF_SYSTEM_METRICS="false",
               AWS_MAX_ATTEMPTS="1")
    rank_dir = spool_dir / "killed" / "rank-0"
    store.stop()  # the storage is down for the whole life of the first process
    job = subprocess.Popen([sys.executable, "-m", "otelprof", "run", "--", sys.executable, str(script)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           cwd=tmp_path)
    assert job.stdin is not None and job.stdout is not None and job.stderr is not None
    out, err = Lines(job.stdout), Lines(job.stderr)
    try:
        first = int(out.wait_for("A ").split()[1])
        _wait(lambda: any((rank_dir / remote.PENDING).glob("*.steps.jsonl")), "a part waiting for the storage")
        job.stdin.write("\n")
        job.stdin.flush()
        steps = int(out.wait_for("B ").split()[1])
        job.send_signal(signal.SIGKILL)
        assert job.wait(60) == -signal.SIGKILL
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert "Traceback" not in err.text()
    assert first == 16 and steps == 48
    manifest = json.loads((rank_dir / "manifest.json").read_text())
    assert manifest["status"] == "running"  # it never closed
    left = [p for p in (rank_dir / remote.PENDING).iterdir()] + [
        p for p in rank_dir.glob("*.jsonl") if p.stat().st_size > 0]
    assert left

    store.restart()
    assert store.keys("kills") == []
    second = subprocess.run([sys.executable, "-m", "otelprof", "run", "--", sys.executable, "-c", SHORT_LOOP],
                            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "Traceback" not in second.stderr and "failed" not in second.stderr, second.stderr
    assert "this process records it as run killed-2" in second.stderr
    assert second.stderr.count(f"uploading {len(left)} parts a previous process left in {spool_dir}") == 1, \
        second.stderr
    keys = store.keys("kills")
    own_parts = [k for k in keys if k.startswith("runs/killed/rank-0/") and ".parts/" in k]
    assert len(own_parts) == len(left)  # one object per part: none twice, none missing
    assert "runs/killed/rank-0/manifest.json" in keys and "runs/killed-2/rank-0/manifest.json" in keys

    # The killed process's run reads back with every step it wrote, and the report says it never closed.
    local = remote.local_copy("s3://kills/runs/killed")
    numbers = [s.number for s in read_recording(local).ranks[0].steps if s.phase == "train"]
    assert numbers == list(range(steps))
    report = subprocess.run([sys.executable, "-m", "otelprof", "report", "s3://kills/runs/killed", "-o",
                             str(tmp_path / "r.html"), "--quiet"], capture_output=True, text=True, timeout=300,
                            env=env, cwd=tmp_path)
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr
    html = (tmp_path / "r.html").read_text()
    assert "Rank(s) 0 never recorded a clean shutdown: the process was killed or is still running" in html
    # The restart's own run is whole, and it counted what it adopted.
    restarted = remote.local_copy("s3://kills/runs/killed-2")
    assert [s.number for s in read_recording(restarted).ranks[0].steps] == list(range(5))
    assert _metric(restarted / "rank-0", sc.RECORDING_ADOPTED_PARTS.name) == len(left)
    # The adopted folder keeps only its manifest (a restart of the rank still records as a new run); no part is left.
    assert sorted(p.name for p in rank_dir.iterdir()) == sorted(
        [spool.LOCK, spool.DESTINATION, spool.UPLOADED, "manifest.json"])
    assert not (spool_dir / "killed-2").exists()
