"""Object storage within bounds whatever the store does: the spool stays within its cap while the store refuses
connections or accepts them and never answers; ``otelprof check|report s3://...`` on such a store is a one-line
error (exit 2) bounded by ``OTELPROF_STORAGE_TIMEOUT_SECONDS``; an object name that would leave the download
directory refuses the run; a large object is downloaded in bounded chunks. Real jobs, a real S3-compatible server
(moto's, on 127.0.0.1) and real sockets."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from otelprof import semconv as sc
from otelprof.recording import remote
from tests.test_object_storage import S3, Lines, _env, _otelprof
from tests.test_object_storage import s3 as s3  # the fixture, used by name

CAP = 256 * 2**10
"""The spool's bound in these tests (OTELPROF_RECORD_SPOOL_MAX_BYTES)."""
ONE_PART = 128 * 2**10
"""Room above the cap for one part: what the job below writes between two take-overs (an upload interval of
0.2 s, a flush interval of 0.1 s, at ~180 KB/s: 35-55 KB measured) waits in the writer's file."""


class Silent:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers (nor reads)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(connection)

    def close(self) -> None:
        self.sock.close()
        for connection in self.held:
            connection.close()


def _closed_port() -> int:
    """A port nothing listens on: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(params=["refuses", "never-answers"])
def dead_store(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(how, the endpoint) of an S3 store that refuses connections, or accepts them and never answers."""
    if request.param == "refuses":
        yield request.param, f"http://127.0.0.1:{_closed_port()}"
        return
    server = Silent()
    yield request.param, f"http://127.0.0.1:{server.port}"
    server.close()


def _dead_env(endpoint: str, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTELPROF_", "AWS_"))}
    env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
               AWS_ENDPOINT_URL=endpoint, OTELPROF_STORAGE_TIMEOUT_SECONDS="1", **settings)
    return env


WRITING_JOB = """
import os, sys, time, otelprof
otelprof.init(profile_every=0)
number = 0
while number % 100 or not os.path.exists(sys.argv[1]):  # until the test says stop
    with otelprof.step():
        otelprof.record("loss", 1.0 / (number + 1))
    if number % 2 == 0:
        time.sleep(0.001)
    number += 1
print("steps", number, flush=True)
"""


def _spool_bytes(rank: Path) -> int:
    """The bytes of a rank's spool folder: the waiting parts first, then the writer's files (a file taken over
    between the two listings is missed once, never counted twice)."""
    total = 0
    for folder in (rank / remote.PENDING, rank):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            try:
                stat = os.lstat(folder / name)
            except OSError:  # taken over or deleted meanwhile
                continue
            total += stat.st_size if not os.path.isdir(folder / name) else 0
    return total


def test_the_spool_stays_within_its_cap_whatever_the_store_does(dead_store: tuple[str, str],
                                                                 tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(WRITING_JOB)
    spool = tmp_path / "spool"
    env = _dead_env(dead_store[1], OTELPROF_RECORD_DIR="s3://runs/team", OTELPROF_RECORD_SPOOL_DIR=str(spool),
                    OTELPROF_RECORD_SPOOL_MAX_BYTES=str(CAP), OTELPROF_RECORD_UPLOAD_INTERVAL="0.2",
                    OTELPROF_RUN_ID="bounded", OTELPROF_SYSTEM_METRICS="false", OTELPROF_SHUTDOWN_TIMEOUT="1",
                    OTELPROF_FLUSH_INTERVAL="0.1")
    stop = tmp_path / "stop"
    job = subprocess.Popen([sys.executable, str(script), str(stop)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=env, cwd=tmp_path)
    assert job.stdout is not None and job.stderr is not None
    out, err = Lines(job.stdout), Lines(job.stderr)
    largest, samples, after = 0, 0, 0
    pause = threading.Event()
    deadline = time.monotonic() + 120  # a bound on waiting, not a timed assertion
    try:
        while job.poll() is None and not pause.wait(0.02):  # sampled while the job writes
            largest = max(largest, _spool_bytes(spool / "bounded" / "rank-0"))
            samples += 1
            assert largest <= CAP + ONE_PART, f"the spool held {largest} bytes, its cap is {CAP}"
            seen = "".join(err.seen)
            if "uploading the run recording" in seen and "its oldest parts are deleted" in seen:
                after += 1  # both said: 2 s more of writing, then the job stops
                if after == 100:
                    stop.touch()
            assert time.monotonic() < deadline, f"no upload failure told: {seen!r}"
        assert job.wait(120) == 0, err.text()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    stderr = err.text()
    written = int(out.text().split()[-1])
    assert samples > 50 and written > 1000
    assert largest <= CAP + ONE_PART, f"the spool held {largest} bytes, its cap is {CAP}"
    assert "Traceback" not in stderr, stderr
    assert stderr.count("uploading the run recording to s3://runs/team failed") == 1, stderr
    assert "its oldest parts are deleted" in stderr, stderr
    manifest = json.loads((spool / "bounded" / "rank-0" / "manifest.json").read_text())
    assert manifest["dropped"][sc.DROPPED_RECORDING_UPLOAD] > 0, manifest["dropped"]


@pytest.mark.parametrize("command", ["check", "report"])
def test_check_and_report_on_a_dead_store_end_with_one_line(dead_store: tuple[str, str], command: str,
                                                            tmp_path: Path) -> None:
    """OTELPROF_STORAGE_TIMEOUT_SECONDS=1: each request has 1 s to connect and 1 s per read, 2 attempts; the
    command ends in a few seconds (it waited for ever on a store that never answers)."""
    args = [command, "s3://runs/team"] + (["-o", str(tmp_path / "r.html")] if command == "report" else [])
    result = subprocess.run([sys.executable, "-m", "otelprof", *args], capture_output=True, text=True,
                            timeout=60, env=_dead_env(dead_store[1]), cwd=tmp_path)  # a bound on waiting
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "cannot list s3://runs/team" in result.stderr, result.stderr
    if dead_store[0] == "never-answers":
        assert "no answer within the storage timeout (OTELPROF_STORAGE_TIMEOUT_SECONDS=1, 2 attempts)" \
            in result.stderr, result.stderr
    else:
        assert "Could not connect" in result.stderr, result.stderr


def test_the_storage_timeout_is_a_checked_setting(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTELPROF_")}
    for bad in ("0", "-1", "nan", "soon", "601"):
        result = _otelprof("check", "s3://runs/team", env={**env, "OTELPROF_STORAGE_TIMEOUT_SECONDS": bad},
                           cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert "OTELPROF_STORAGE_TIMEOUT_SECONDS" in result.stderr, result.stderr
    from otelprof.config import Config

    assert Config.from_env({}).storage_timeout == remote.TIMEOUT == 10.0
    assert Config.from_env({"OTELPROF_STORAGE_TIMEOUT_SECONDS": "2.5"}).storage_timeout == 2.5


def _manifest() -> bytes:
    return json.dumps({"status": "finished"}).encode()


@pytest.mark.parametrize("run", ["..", "."])
def test_a_run_folder_named_dot_or_dot_dot_is_refused(s3: S3, tmp_path: Path, run: str) -> None:
    s3.client().create_bucket(Bucket="hostile")
    s3.client().put_object(Bucket="hostile", Key=f"team/{run}/rank-0/manifest.json", Body=_manifest())
    s3.client().put_object(Bucket="hostile", Key=f"team/{run}/rank-0/steps.jsonl.parts/00000000000000000001",
                           Body=b'{"k":"s","n":0}\n')
    assert f"team/{run}/rank-0/manifest.json" in s3.keys("hostile")  # stored under that very name
    temp = tmp_path / "tmp"
    temp.mkdir()
    for url in ("s3://hostile/team", f"s3://hostile/team/{run}"):
        for command in (["report", url, "-o", str(tmp_path / "r.html")], ["check", url]):
            result = _otelprof(*command, env={**_env(s3), "TMPDIR": str(temp)}, cwd=tmp_path)
            assert result.returncode == 2, result.stderr
            assert result.stderr.count("\n") == 1 and "is refused" in result.stderr, result.stderr
            assert "would leave the download directory" in result.stderr
            assert list(temp.iterdir()) == [], "nothing written, nothing left in the temp dir"
    assert not (tmp_path / "rank-0").exists() and not (tmp_path / "r.html").exists()


def test_a_key_that_would_leave_its_run_is_refused(s3: S3, tmp_path: Path) -> None:
    s3.client().create_bucket(Bucket="keys")
    s3.client().put_object(Bucket="keys", Key="runs/good/rank-0/manifest.json", Body=_manifest())
    s3.client().put_object(Bucket="keys", Key="runs/good/rank-0/../../../escaped.txt", Body=b"x")
    with pytest.raises(remote.RemoteError, match="would leave the download directory"):
        remote.local_copy("s3://keys/runs/good")
    s3.client().put_object(Bucket="keys", Key="runs/fine/rank-0/manifest.json", Body=_manifest())
    s3.client().put_object(Bucket="keys", Key="runs/fine/rank-0/folder-marker/", Body=b"")
    local = remote.local_copy("s3://keys/runs/fine")  # a key with an empty component is passed over
    assert json.loads((local / "rank-0" / "manifest.json").read_text()) == {"status": "finished"}


DOWNLOAD = """
import hashlib, json, resource, sys
from otelprof.recording import remote

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

remote.local_copy(sys.argv[1])  # the client's imports made
first = peak()
remote.local_copy(sys.argv[1])  # what a copy costs whatever it holds (a new client and its service model)
second = peak()
run = remote.local_copy(sys.argv[2])
third = peak()
digest = hashlib.sha256()
with open(run / "rank-0" / "steps.jsonl", "rb") as handle:
    for block in iter(lambda: handle.read(1 << 20), b""):
        digest.update(block)
print(json.dumps({"small": second - first, "large": third - second, "sha256": digest.hexdigest()}))
"""
SPAWN = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"
"""A small process between the test and the measuring one: a process inherits the peak RSS (ru_maxrss) of the
process it was forked from, the test's (which holds the objects moto serves) here."""


def test_a_large_object_is_downloaded_in_bounded_chunks(s3: S3, tmp_path: Path) -> None:
    """The peak RSS growth of a run with a 64 MiB part over that of a run without: bounded by the ranges (8
    MiB) it is read in, not the object (the whole object was held three times)."""
    import hashlib

    size = 64 * 2**20
    line = b'{"k":"s","n":0}\n'
    body = line * (size // len(line))
    s3.client().create_bucket(Bucket="large")
    for run, parts in (("small", [line]), ("big", [line, body])):
        s3.client().put_object(Bucket="large", Key=f"runs/{run}/rank-0/manifest.json", Body=_manifest())
        for number, part in enumerate(parts):
            s3.client().put_object(Bucket="large", Key=f"runs/{run}/rank-0/steps.jsonl.parts/{number:020d}",
                                   Body=part)
    result = subprocess.run([sys.executable, "-c", SPAWN, sys.executable, "-c", DOWNLOAD, "s3://large/runs/small",
                             "s3://large/runs/big"], capture_output=True, text=True, timeout=300, env=_env(s3),
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout)
    assert measured["sha256"] == hashlib.sha256(line + body).hexdigest()  # every byte, in order
    extra = measured["large"] - measured["small"]
    assert extra < size // 4, f"the peak RSS grew by {extra} bytes more for a {size}-byte object ({measured})"
