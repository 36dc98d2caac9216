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
from tests.test_object_storage import S3, Lines, _otelprof, _wait
from tests.test_object_storage import _env as _base_env


def _env(s3: S3, **settings: str) -> dict[str, str]:
    """A job's environment; a shutdown timeout long enough for the last uploads on a busy machine."""
    return _base_env(s3, **{"OTELPROF_SHUTDOWN_TIMEOUT": "60", **settings})


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
WAIT_FOR = ("import os, time\ndeadline = time.monotonic() + 120\n"
            "while not os.path.exists({marker!r}) and time.monotonic() < deadline:\n    time.sleep(0.05)\n")
"""Appended to a job's script: it ends once a folder it adopts is uploaded (as any job longer than that would)."""


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
    second = _otelprof("run", "--", sys.executable, "-c", SHORT_LOOP, env=env, cwd=tmp_path)
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
    report = _otelprof("report", "s3://kills/runs/killed", "-o",
                             str(tmp_path / "r.html"), "--quiet", env=env, cwd=tmp_path)
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


IDLE_LOOP = """
import sys
import otelprof
def steps(count):
    for _ in range(count):
        with otelprof.step():
            otelprof.record("loss", 1.0)
    otelprof.get_session().flush_recording()
steps(int(sys.argv[1]))
print("A", flush=True)
sys.stdin.readline()
steps(3)
print("B", flush=True)
"""


def _start(script: Path, count: int, env: dict[str, str], cwd: Path) -> tuple[subprocess.Popen[str], Lines, Lines]:
    job = subprocess.Popen([sys.executable, "-m", "otelprof", "run", "--", sys.executable, str(script), str(count)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           cwd=cwd)
    assert job.stdout is not None and job.stderr is not None
    return job, Lines(job.stdout), Lines(job.stderr)


def _go_on(job: subprocess.Popen[str]) -> None:
    assert job.stdin is not None
    job.stdin.write("\n")
    job.stdin.flush()


def _steps(url: str) -> list[int]:
    return [s.number for s in read_recording(remote.local_copy(url)).ranks[0].steps]


def test_a_folder_a_live_process_holds_is_never_touched(store: S3, tmp_path: Path) -> None:
    """A live process whose storage is unreachable keeps its parts; another process sharing the spool passes
    them over; once the first ended, a third uploads them to the first one's own destination."""
    store.client().create_bucket(Bucket="present")
    script = tmp_path / "loop.py"
    script.write_text(IDLE_LOOP)
    spool_dir = tmp_path / "spool"
    common = dict(OTELPROF_RECORD_SPOOL_DIR=str(spool_dir), OTELPROF_RECORD_UPLOAD_INTERVAL="0.2",
                  OTELPROF_SYSTEM_METRICS="false", AWS_MAX_ATTEMPTS="1")
    held = spool_dir / "alive" / "rank-0"
    job, out, err = _start(script, 25, _env(store, OTELPROF_RECORD_DIR="s3://later/runs", OTELPROF_RUN_ID="alive",
                                            **common), tmp_path)
    try:
        out.wait_for("A")
        err.wait_for("uploading the run recording to s3://later/runs failed")  # no such bucket (yet)
        _wait(lambda: any((held / remote.PENDING).glob("*.steps.jsonl")), "a part waiting for the storage")
        before = {p.name for p in (held / remote.PENDING).iterdir()}
        other = _otelprof("run", "--", sys.executable, "-c", SHORT_LOOP, cwd=tmp_path,
                               env=_env(store, OTELPROF_RECORD_DIR="s3://present/runs", OTELPROF_RUN_ID="other",
                                        **common))
        assert other.returncode == 0 and "previous process" not in other.stderr, other.stderr
        assert before <= {p.name for p in (held / remote.PENDING).iterdir()}, "the live process's parts stay"
        assert not any("alive" in k for k in store.keys("present"))
        assert _steps("s3://present/runs/other") == list(range(5))
        _go_on(job)
        out.wait_for("B")
        assert job.wait(120) == 0
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert "Traceback" not in err.text() and "previous process" not in err.text()
    assert any((held / remote.PENDING).glob("*.steps.jsonl")), "its storage never came: the parts wait"

    store.client().create_bucket(Bucket="later")
    waiting = SHORT_LOOP + WAIT_FOR.format(marker=str(held / spool.UPLOADED))  # a job outlives the adoption
    third = _otelprof("run", "--", sys.executable, "-c", waiting, cwd=tmp_path,
                           env=_env(store, OTELPROF_RECORD_DIR="s3://present/runs", OTELPROF_RUN_ID="third", **common))
    assert third.returncode == 0 and third.stderr.count("a previous process left in") == 1, third.stderr
    assert _steps("s3://later/runs/alive") == list(range(28))  # its own destination, every step
    assert not any("alive" in k for k in store.keys("present"))


def test_live_ranks_sharing_a_spool_never_take_each_others_folder(store: S3, tmp_path: Path) -> None:
    """Two ranks of one pod, started together on one spool, their storage unreachable at first: each uploads
    exactly its own steps once it is there, and neither adopts anything."""
    script = tmp_path / "loop.py"
    script.write_text(IDLE_LOOP)
    spool_dir = tmp_path / "spool"
    jobs = []
    try:
        for rank, count in ((0, 17), (1, 9)):
            env = _env(store, OTELPROF_RECORD_DIR="s3://pod/runs", OTELPROF_RECORD_SPOOL_DIR=str(spool_dir),
                       OTELPROF_RECORD_UPLOAD_INTERVAL="0.2", OTELPROF_SYSTEM_METRICS="false", AWS_MAX_ATTEMPTS="1",
                       OTELPROF_RUN_ID="shared", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
            jobs.append(_start(script, count, env, tmp_path))
        for rank, (_, out, err) in enumerate(jobs):
            out.wait_for("A")
            err.wait_for("uploading the run recording to s3://pod/runs failed")
            _wait(lambda r=rank: any((spool_dir / "shared" / f"rank-{r}" / remote.PENDING).glob("*.steps.jsonl")),
                  "parts waiting for the storage")
        store.client().create_bucket(Bucket="pod")
        _wait(lambda: {k.split("/")[2] for k in store.keys("pod") if "steps.jsonl.parts" in k} == {"rank-0", "rank-1"},
              "both ranks' uploads")
        for job, out, _ in jobs:
            _go_on(job)
            out.wait_for("B")
            assert job.wait(120) == 0
    finally:
        for job, _, _ in jobs:
            if job.poll() is None:
                job.kill()
                job.wait()
    for _, _, err in jobs:
        assert "Traceback" not in err.text() and "previous process" not in err.text(), err.text()
    local = remote.local_copy("s3://pod/runs/shared")
    recording = read_recording(local)
    assert {r.rank: [s.number for s in r.steps] for r in recording.ranks} == {0: list(range(20)),
                                                                             1: list(range(12))}
    for rank in (0, 1):
        assert _metric(local / f"rank-{rank}", sc.RECORDING_ADOPTED_PARTS.name) == 0
    assert not (spool_dir / "shared").exists()


def _orphan(directory: Path, url: str, lines: list[str], stamp: int = 1) -> None:
    """A rank folder as a killed process leaves it: its destination, a manifest, one part waiting."""
    (directory / remote.PENDING).mkdir(parents=True)
    spool.record_destination(directory, url)
    (directory / "manifest.json").write_text(json.dumps({"status": "running", "resource": {}}))
    (directory / remote.PENDING / f"{stamp:020d}.steps.jsonl").write_text("".join(f"{x}\n" for x in lines))


def test_hostile_spool_contents_never_reach_the_training_or_leave_the_spool(store: S3, tmp_path: Path) -> None:
    store.client().create_bucket(Bucket="hostile")
    spool_dir, outside = tmp_path / "spool", tmp_path / "outside"
    spool_dir.mkdir()
    outside.mkdir()
    secret = outside / "secret.steps.jsonl"
    secret.write_text("SECRET\n")
    _orphan(outside / "linked-run" / "rank-0", "s3://hostile/runs", ["OUTSIDE"])
    (spool_dir / "a-file").write_text("not a run folder")
    (spool_dir / "run-with-file").mkdir()
    (spool_dir / "run-with-file" / "rank-0").write_text("not a rank folder")
    (spool_dir / "linked-run").symlink_to(outside / "linked-run")  # a run folder that is a link out
    (spool_dir / "run-with-link").mkdir()
    (spool_dir / "run-with-link" / "rank-0").symlink_to(outside / "linked-run" / "rank-0")
    lock_dir = spool_dir / "lock-is-a-dir" / "rank-0"
    _orphan(lock_dir, "s3://hostile/runs", ["LOCKDIR"])
    (lock_dir / spool.LOCK).mkdir()
    linked_destination = spool_dir / "linked-destination" / "rank-0"
    linked_destination.mkdir(parents=True)
    (linked_destination / "manifest.json").write_text("{}")
    (outside / "destination.json").write_text(json.dumps({"url": "s3://hostile/stolen"}))
    (linked_destination / spool.DESTINATION).symlink_to(outside / "destination.json")
    (linked_destination / remote.PENDING).mkdir()
    (linked_destination / remote.PENDING / f"{1:020d}.steps.jsonl").write_text("NODEST\n")
    mixed = spool_dir / "mixed" / "rank-3"
    _orphan(mixed, "s3://hostile/runs", ["GOOD"])
    pending = mixed / remote.PENDING
    (pending / f"{2:020d}.steps.jsonl").symlink_to(secret)  # a part that is a link out
    os.mkfifo(pending / f"{3:020d}.steps.jsonl")  # a part that would block a reader
    (pending / f"{4:020d}.spans.jsonl").mkdir()  # a part that is a folder
    (pending / "not-a-part").write_text("JUNK\n")
    unreadable = pending / f"{5:020d}.steps.jsonl"
    unreadable.write_text("LOCKED\n")
    unreadable.chmod(0)
    (mixed / "samples.jsonl").symlink_to(secret)  # a writer's file that is a link out
    (mixed / "extra.json").symlink_to(secret)
    (mixed / "bad-url").mkdir()
    bad_url = spool_dir / "bad-url" / "rank-0"
    _orphan(bad_url, "nosuchstore://x/y", ["BADURL"])
    before = sorted((str(p.relative_to(outside)), p.is_file() and p.read_text()) for p in outside.rglob("*"))

    env = _env(store, OTELPROF_RECORD_DIR="s3://hostile/runs", OTELPROF_RECORD_SPOOL_DIR=str(spool_dir),
               OTELPROF_RUN_ID="job", OTELPROF_SYSTEM_METRICS="false")
    job = _otelprof("run", "--", sys.executable, "-c", SHORT_LOOP, env=env, cwd=tmp_path)
    assert job.returncode == 0 and "Traceback" not in job.stderr, job.stderr
    assert _steps("s3://hostile/runs/job") == list(range(5))
    # Nothing outside the spool was read, uploaded, moved or deleted.
    assert sorted((str(p.relative_to(outside)), p.is_file() and p.read_text())
                  for p in outside.rglob("*")) == before
    client = store.client()
    bodies = {k: client.get_object(Bucket="hostile", Key=k)["Body"].read() for k in store.keys("hostile")}
    assert not any(b"SECRET" in b or b"OUTSIDE" in b or b"NODEST" in b for b in bodies.values())
    assert not any(k.startswith("stolen/") for k in bodies)
    # The one good folder went up to its destination; what could not be used stays, said once.
    assert bodies[f"runs/mixed/rank-3/steps.jsonl.parts/{1:020d}"] == b"GOOD\n"
    assert "runs/mixed/rank-3/manifest.json" in bodies and not any("extra.json" in k for k in bodies)
    readable_as_root = os.geteuid() == 0  # root reads a file whatever its mode
    assert (f"runs/mixed/rank-3/steps.jsonl.parts/{5:020d}" in bodies) == readable_as_root
    assert not any(k.startswith(("runs/lock-is-a-dir", "runs/bad-url", "runs/linked")) for k in bodies)
    assert job.stderr.count("a previous process left in") == 1, job.stderr
    assert job.stderr.count("stays in the spool (") == 1, job.stderr  # the nosuchstore:// folder
    assert job.stderr.count("no upload destination recorded") == 1, job.stderr
    assert (bad_url / remote.PENDING / f"{1:020d}.steps.jsonl").read_text() == "BADURL\n"
    assert (lock_dir / remote.PENDING / f"{1:020d}.steps.jsonl").read_text() == "LOCKDIR\n"
    assert (spool_dir / "a-file").read_text() == "not a run folder"


def test_a_huge_spool_is_looked_at_within_bounds(store: S3, tmp_path: Path) -> None:
    """Thousands of orphaned folders: one start takes at most MAX_FOLDERS of them, the next ones the rest."""
    store.client().create_bucket(Bucket="huge")
    spool_dir = tmp_path / "spool"
    count = 3 * spool.MAX_FOLDERS + 5
    for index in range(count):
        _orphan(spool_dir / f"old-{index:05d}" / "rank-0", "s3://huge/runs", [f"L{index}"])
    for index in range(2000):  # and a crowd of empty run folders
        (spool_dir / f"empty-{index:05d}").mkdir()
    env = _env(store, OTELPROF_RECORD_DIR="s3://huge/runs", OTELPROF_RECORD_SPOOL_DIR=str(spool_dir),
               OTELPROF_SYSTEM_METRICS="false")
    uploaded: list[int] = []
    for start in range(5):
        job = _otelprof("run", "--", sys.executable, "-c", SHORT_LOOP, env={**env, "OTELPROF_RUN_ID": f"s{start}"},
                             cwd=tmp_path)
        assert job.returncode == 0 and "Traceback" not in job.stderr, job.stderr
        assert job.stderr.count("a previous process left in") <= 1, job.stderr
        old = {k.split("/")[1] for k in store.keys("huge") if k.startswith("runs/old-") and ".parts/" in k}
        uploaded.append(len(old))
    assert all(0 <= b - a <= spool.MAX_FOLDERS for a, b in zip([0, *uploaded], uploaded)), uploaded
    assert uploaded[-1] == count, uploaded  # none twice, none lost


def test_the_spool_bound_counts_adopted_parts(store: S3, tmp_path: Path) -> None:
    """With the storage unreachable, what a restart adopts and what it writes stay within
    OTELPROF_RECORD_SPOOL_MAX_BYTES together: the oldest parts go first, their lines counted as dropped."""
    spool_dir = tmp_path / "spool"
    left = spool_dir / "before" / "rank-0"
    sizes = {}
    for index in range(10):  # 10 parts of 200 lines, ~20 KiB each: 200 KiB, three times the bound
        stamp = 10**18 + index
        _orphan(left, "s3://nowhere/runs", [f"{index:03d}-{n:04d}-" + "x" * 90 for n in range(200)], stamp) \
            if index == 0 else (left / remote.PENDING / f"{stamp:020d}.steps.jsonl").write_text(
                "".join(f"{index:03d}-{n:04d}-" + "x" * 90 + "\n" for n in range(200)))
        sizes[f"{stamp:020d}.steps.jsonl"] = (left / remote.PENDING / f"{stamp:020d}.steps.jsonl").stat().st_size
    env = _env(store, OTELPROF_RECORD_DIR="s3://nowhere/runs", OTELPROF_RECORD_SPOOL_DIR=str(spool_dir),
               OTELPROF_RECORD_SPOOL_MAX_BYTES="65536", OTELPROF_RUN_ID="after", OTELPROF_SYSTEM_METRICS="false",
               AWS_MAX_ATTEMPTS="1", OTELPROF_SHUTDOWN_TIMEOUT="10")
    script = tmp_path / "loop.py"
    script.write_text(IDLE_LOOP)
    job, out, err = _start(script, 5, env, tmp_path)
    try:
        out.wait_for("A")
        err.wait_for("its oldest parts are deleted")
        _wait(lambda: sum(p.stat().st_size for p in (left / remote.PENDING).iterdir()) <= 65536, "the bound")
        gone_at_once = set(sizes) - {p.name for p in (left / remote.PENDING).iterdir()}
        _go_on(job)
        assert job.wait(120) == 0
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    stderr = err.text()
    assert "Traceback" not in stderr, stderr
    assert stderr.count("uploading 10 parts a previous process left in") == 1, stderr
    assert stderr.count("its oldest parts are deleted") == 1, stderr
    kept = sorted(p.name for p in (left / remote.PENDING).iterdir())
    gone = sorted(set(sizes) - set(kept))
    assert gone and kept and max(gone) < min(kept), "the oldest went first"
    own = spool_dir / "after" / "rank-0"
    spooled = sum(p.stat().st_size for p in [*(left / remote.PENDING).iterdir(), *(own / remote.PENDING).iterdir()])
    assert spooled <= 65536
    manifest = json.loads((own / "manifest.json").read_text())
    # Counted in the manifest: all dropped before the shutdown (the last upload round comes after it is written).
    assert 200 * len(gone_at_once) <= manifest["dropped"][sc.DROPPED_RECORDING_UPLOAD] <= 200 * len(gone)
    assert len(gone_at_once) >= 7  # at once: 10 parts of ~20 KiB within 64 KiB


def test_a_forked_child_never_keeps_a_folder_its_parent_took(tmp_path: Path) -> None:
    """A DataLoader worker is forked with the parent's descriptors: the lock must end with the parent."""
    spool_dir = tmp_path / "spool"
    _orphan(spool_dir / "left" / "rank-0", "s3://bucket/runs", ["L"])
    [orphan] = spool.find(spool_dir, tmp_path / "own").orphans
    assert spool.find(spool_dir, tmp_path / "own").orphans == [], "taken: nobody else gets it"
    wait, done = os.pipe()
    started, ready = os.pipe()
    child = os.fork()
    if child == 0:  # the worker outlives the parent's hold on the folder
        os.write(ready, b"r")  # its fork hooks ran
        os.read(wait, 1)
        os._exit(0)
    try:
        assert os.read(started, 1) == b"r"
        spool.release(orphan)
        [again] = spool.find(spool_dir, tmp_path / "own").orphans  # free although the child still runs
        assert again.directory == orphan.directory
        spool.release(again)
    finally:
        os.write(done, b"x")
        os.waitpid(child, 0)
        for fd in (wait, done, started, ready):
            os.close(fd)


def test_a_process_still_uploading_at_its_exit_keeps_its_folder(store: S3, tmp_path: Path) -> None:
    """The writer is closed (its manifest says finished) but the last upload still runs, against a storage
    endpoint that takes connections and never answers: the folder stays its process's until that ends."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # connections complete in the backlog; nothing ever answers
    store.client().create_bucket(Bucket="present")
    spool_dir = tmp_path / "spool"
    script = tmp_path / "loop.py"
    script.write_text(IDLE_LOOP)
    common = dict(OTELPROF_RECORD_SPOOL_DIR=str(spool_dir), OTELPROF_SYSTEM_METRICS="false", AWS_MAX_ATTEMPTS="1")
    env = _env(store, OTELPROF_RECORD_DIR="s3://present/runs", OTELPROF_RUN_ID="slow", OTELPROF_SHUTDOWN_TIMEOUT="60",
               AWS_ENDPOINT_URL=f"http://127.0.0.1:{silent.getsockname()[1]}", **common)
    held = spool_dir / "slow" / "rank-0"
    job, out, err = _start(script, 11, env, tmp_path)
    try:
        out.wait_for("A")
        _go_on(job)
        out.wait_for("B")
        _wait(lambda: json.loads((held / "manifest.json").read_text())["status"] == "finished", "the writer's close")
        other = _otelprof("run", "--", sys.executable, "-c", SHORT_LOOP, cwd=tmp_path,
                               env=_env(store, OTELPROF_RECORD_DIR="s3://present/runs", OTELPROF_RUN_ID="other",
                                        **common))
        assert job.poll() is None, "the first process was still in its last upload"
        assert other.returncode == 0 and "previous process" not in other.stderr, other.stderr
        assert not any("slow" in k for k in store.keys("present"))
        assert (held / "steps.jsonl").exists() or any((held / remote.PENDING).glob("*.steps.jsonl"))
    finally:
        job.kill()
        job.wait()
        silent.close()
    assert "Traceback" not in err.text()


def test_what_was_left_goes_up_at_once_not_at_the_first_interval(store: S3, tmp_path: Path) -> None:
    """In a crash loop each process may die before its first upload interval: the adopted parts go up at once."""
    store.client().create_bucket(Bucket="loop")
    spool_dir = tmp_path / "spool"
    _orphan(spool_dir / "crashed" / "rank-0", "s3://loop/runs", ["x"], 7)
    script = tmp_path / "loop.py"
    script.write_text(IDLE_LOOP)
    env = _env(store, OTELPROF_RECORD_DIR="s3://loop/runs", OTELPROF_RECORD_SPOOL_DIR=str(spool_dir),
               OTELPROF_RECORD_UPLOAD_INTERVAL="3600", OTELPROF_RUN_ID="again", OTELPROF_SYSTEM_METRICS="false")
    job, out, err = _start(script, 4, env, tmp_path)
    try:
        out.wait_for("A")
        _wait(lambda: "runs/crashed/rank-0/manifest.json" in store.keys("loop"), "the adopted folder's upload")
        assert job.poll() is None  # uploaded while the job runs, long before its first interval
        job.send_signal(signal.SIGKILL)
        job.wait(60)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert f"runs/crashed/rank-0/steps.jsonl.parts/{7:020d}" in store.keys("loop")
    assert "Traceback" not in err.text()
