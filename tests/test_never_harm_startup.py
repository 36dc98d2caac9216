"""otelprof never harms the job at start-up, through its settings and names, its files, what it prints, and its
offline tools: real processes, file descriptors, sockets and recordings.

* ``otelprof run`` starts the job when stderr is closed, full (``/dev/full``) or a pipe nobody reads;
* a base port + ``LOCAL_RANK`` past 65535 costs that endpoint (one warning), not the run;
* a byte that is not UTF-8 in the job name (or a lone surrogate given to ``init()``) is written as ``?``:
  ``/metrics`` answers, the recording reads, stderr stays quiet;
* a script that changes directory still finishes its recording;
* two processes given one run id never write into one rank directory;
* what comes from outside (a stop reason, a recorded phase name) is escaped on the terminal;
* ``otelprof check`` judges a recording whose process start is after its shutdown;
* analyses go through the phases in one pass: the work grows with steps + phases, not their product;
* a misspelt ``OTELPROF_*`` variable is named once, with the closest setting.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import otelprof
from otelprof.analysis.checks import evaluate
from otelprof.analysis.report import build_report
from otelprof.analysis.run import MAX_PHASES, RunView
from otelprof.analysis.summary import job_summary
from otelprof.recording import schema
from otelprof.recording.reader import read_recording
from tests.servers import free_port

REPO = Path(__file__).resolve().parents[1]
_OUTER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "KUBERNETES_SERVICE_HOST")

STEPS_SCRIPT = """
import otelprof
for i in range(5):
    with otelprof.step():
        pass
print(1)
"""


def env_for(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_")) and k not in _OUTER}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def manifest(rank_dir: Path) -> dict[str, Any]:
    return dict(json.loads((rank_dir / schema.MANIFEST).read_text(encoding="utf-8")))


def step_lines(rank_dir: Path) -> list[dict[str, Any]]:
    """The step records of a rank's steps.jsonl (not its phase switches)."""
    lines = (rank_dir / schema.STEPS).read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [r for r in records if r.get("k") == schema.KIND_STEP]


def python(source: str, cwd: Path, env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60, **kwargs)


# ---------------------------------------------------------------------- 2. stderr that cannot be written
@pytest.mark.parametrize("stderr", ["closed", "dev-full", "unread-pipe"])
def test_run_starts_the_job_when_stderr_cannot_be_written(stderr: str, tmp_path: Path) -> None:
    # A misspelt variable makes both otelprof run and the job warn: those writes fail too.
    env = env_for(OTELPROF_RECORD_DIR=str(tmp_path / "runs"), OTELPROF_RUN_ID="blind", OTELPROF_PROFIL_EVERY="0")
    command = [sys.executable, "-m", "otelprof", "run", "--no-torch", "--", sys.executable, "-c", STEPS_SCRIPT]
    if stderr == "closed":
        proc = subprocess.run(["sh", "-c", 'exec "$@" 2>&-', "sh", *command], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, text=True, timeout=60)
    elif stderr == "dev-full":
        with open("/dev/full", "w") as full:
            proc = subprocess.run(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=full, text=True,
                                  timeout=60)
    else:
        read_end, write_end = os.pipe()
        os.close(read_end)  # nobody will ever read: every write fails with EPIPE
        try:
            proc = subprocess.run(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=write_end,
                                  text=True, timeout=60)
        finally:
            os.close(write_end)
    assert (proc.returncode, proc.stdout) == (0, "1\n")  # what bare python does
    rank_dir = tmp_path / "runs" / "blind" / "rank-0"
    assert manifest(rank_dir)["status"] == schema.STATUS_FINISHED
    assert len(step_lines(rank_dir)) == 5


# ---------------------------------------------------------------------- 3. a port past 65535
def test_a_port_past_65535_costs_the_endpoint_not_the_run(tmp_path: Path) -> None:
    env = env_for(OTELPROF_CONTROL_PORT="65535", OTEL_EXPORTER_PROMETHEUS_PORT="65534", LOCAL_RANK="3",
                  OTEL_METRICS_EXPORTER="prometheus", OTELPROF_RECORD_DIR=str(tmp_path / "runs"),
                  OTELPROF_RUN_ID="ports")
    proc = python("""
        import otelprof
        session = otelprof.init()
        for i in range(200):
            with otelprof.step():
                pass
        print(session.metrics_address, session.control_address)
        otelprof.shutdown()
    """, tmp_path, env)
    assert proc.returncode == 0 and proc.stdout == "None None\n"
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert any("OTELPROF_CONTROL_PORT=65535 + local rank 3 is port 65538" in line for line in lines)
    assert any("OTEL_EXPORTER_PROMETHEUS_PORT=65534 + local rank 3 is port 65537" in line for line in lines)
    rank_dir = tmp_path / "runs" / "ports" / "rank-0"
    assert manifest(rank_dir)["status"] == schema.STATUS_FINISHED
    assert len(step_lines(rank_dir)) == 200


def test_an_init_that_fails_half_way_leaves_no_running_rank_directory(record_dir: Path, tmp_path: Path) -> None:
    """Past the recording directory, /metrics and the control endpoint, the recorder thread cannot start: one
    warning line, the job trains, and nothing is left behind (no directory marked running, no port held)."""
    metrics_port, control_port = free_port(), free_port()
    proc = python(f"""
        import socket, threading
        import otelprof
        original = threading.Thread.start
        def refuse(self):
            if self.name == "otelprof-recorder":
                raise RuntimeError("can't start new thread\x1b[31m")
            original(self)
        threading.Thread.start = refuse
        session = otelprof.init(record_dir={str(record_dir)!r}, run_id="half", control_port={control_port},
                                metrics_exporters=("prometheus",), prometheus_port={metrics_port})
        threading.Thread.start = original
        for i in range(10):
            with otelprof.step():
                pass
        for port in ({metrics_port}, {control_port}):
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))  # free again
        print(type(session).__name__)
    """, tmp_path, env_for())
    assert proc.returncode == 0 and proc.stdout == "_DisabledSession\n", proc.stderr
    assert proc.stderr.splitlines() == ["otelprof: init() failed (RuntimeError(\"can't start new thread\\x1b[31m\")); "
                                        "training goes on without otelprof"]
    assert not (record_dir / "half").exists() or not any((record_dir / "half").iterdir())


# ---------------------------------------------------------------------- 4. names that are not UTF-8
def test_a_job_name_that_is_not_utf8_is_scraped_recorded_and_reported(tmp_path: Path) -> None:
    # "caf\xe9" as bytes in the environment reaches Python as "caf\udce9"; so do the resource attributes.
    env = env_for(OTELPROF_JOB_NAME="caf\udce9", OTEL_RESOURCE_ATTRIBUTES="team=na\udcefve,a=b,",
                  OTELPROF_POD_NAME="pod-\udcff", OTEL_METRICS_EXPORTER="prometheus",
                  OTEL_EXPORTER_PROMETHEUS_PORT=str(free_port()), OTELPROF_RECORD_DIR=str(tmp_path / "runs"),
                  OTELPROF_RUN_ID="names")
    proc = python("""
        import urllib.request
        import otelprof
        session = otelprof.init()
        with otelprof.phase("ph\\udc80ase"):
            for i in range(30):
                with otelprof.step():
                    otelprof.record("lo\\ud800ss", 1.0)
        session.flush()
        host, port = session.metrics_address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
            body = response.read().decode("utf-8")
        print(response.status)
        print([line for line in body.splitlines() if line.startswith("target_info{")][0])
        print(sum(1 for line in body.splitlines() if 'phase="ph?ase"' in line) > 0)
        otelprof.shutdown()
    """, tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no encoder traceback, no SDK warning about the trailing comma
    status, target_info, phase_found = proc.stdout.splitlines()
    assert status == "200" and phase_found == "True"
    assert 'service_name="caf?"' in target_info and 'team="na?ve"' in target_info
    assert 'k8s_pod_name="pod-?"' in target_info
    report = subprocess.run([sys.executable, "-m", "otelprof", "report", "runs/names", "-q", "-o", "r.html"],
                            cwd=tmp_path, env=env_for(), capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    recording = read_recording(tmp_path / "runs" / "names")
    assert recording.ranks[0].manifest["resource"]["service.name"] == "caf?"
    assert recording.skipped_lines == 0


def test_a_lone_surrogate_given_to_init_is_written_as_a_question_mark(record_dir: Path) -> None:
    session = otelprof.init(job_name="bad\ud800name", run_id="surrogate", record_dir=str(record_dir),
                            system_metrics=False)
    assert session.config.job_name == "bad?name"
    for _ in range(3):
        with otelprof.step():
            pass
    otelprof.shutdown()
    rank = read_recording(record_dir / "surrogate").ranks[0]
    assert rank.manifest["resource"]["service.name"] == "bad?name" and len(rank.step_columns) == 3


# ---------------------------------------------------------------------- 7. a script that changes directory
def test_a_script_that_changes_directory_finishes_its_recording(tmp_path: Path) -> None:
    (tmp_path / "outputs").mkdir()
    proc = python("""
        import os
        import otelprof
        otelprof.init(run_id="moved")  # the default, relative recording directory
        for i in range(4):
            with otelprof.step():
                pass
        os.chdir("outputs")  # what Hydra's job.chdir does
        for i in range(4):
            with otelprof.step():
                pass
        otelprof.shutdown()
    """, tmp_path, env_for())
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert not (tmp_path / "outputs" / "otelprof-runs").exists()
    rank_dir = tmp_path / "otelprof-runs" / "moved" / "rank-0"
    assert manifest(rank_dir)["status"] == schema.STATUS_FINISHED
    assert len(step_lines(rank_dir)) == 8
    assert job_summary(RunView(read_recording(rank_dir.parent))).killed_ranks == ()


# ---------------------------------------------------------------------- 8. one run id, two jobs
def test_two_processes_given_one_run_id_never_share_a_rank_directory(tmp_path: Path) -> None:
    env = env_for(OTELPROF_RUN_ID="fixed", OTELPROF_RECORD_DIR=str(tmp_path / "runs"))
    go = tmp_path / "go"
    first = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, time
        import otelprof
        session = otelprof.init()
        for i in range(7):
            with otelprof.step():
                pass
        session.flush()
        print("ready", flush=True)
        while not os.path.exists({str(go)!r}):
            time.sleep(0.02)
        otelprof.shutdown()
    """)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None and first.stdout.readline() == "ready\n"
        second = python("""
            import otelprof
            session = otelprof.init()
            for i in range(3):
                with otelprof.step():
                    pass
            print(session.config.run_id)
            otelprof.shutdown()
        """, tmp_path, env)
    finally:
        go.touch()
        _, first_err = first.communicate(timeout=60)
    assert first.returncode == 0 and first_err == ""
    assert second.returncode == 0 and second.stdout == "fixed-2\n"
    warnings = second.stderr.splitlines()
    assert len(warnings) == 1 and "run fixed rank 0 is recorded" in warnings[0] and "as run fixed-2" in warnings[0]
    runs = tmp_path / "runs"
    assert len(step_lines(runs / "fixed" / "rank-0")) == 7
    assert manifest(runs / "fixed" / "rank-0")["resource"]["process.pid"] == first.pid
    assert len(step_lines(runs / "fixed-2" / "rank-0")) == 3
    assert manifest(runs / "fixed-2" / "rank-0")["run_id"] == "fixed-2"
    # A later job given the same id again (a reused job id) does not append to either.
    third = python(STEPS_SCRIPT.replace("import otelprof", "import otelprof; otelprof.init()"), tmp_path, env)
    assert third.returncode == 0 and len(third.stderr.splitlines()) == 1
    assert len(step_lines(runs / "fixed-3" / "rank-0")) == 5
    assert [len(step_lines(runs / run / "rank-0")) for run in ("fixed", "fixed-2")] == [7, 3]


def test_a_restarted_process_with_the_same_pid_gets_its_own_run(record_dir: Path) -> None:
    """In a restarted container the training process often has the pid of the one before it."""
    earlier = record_dir / "pod-job" / "rank-0"
    earlier.mkdir(parents=True)
    (earlier / schema.MANIFEST).write_text(json.dumps({"resource": {"process.pid": os.getpid()},
                                                       "lifecycle": {"process_start": 1000.0}}))
    assert otelprof.init(run_id="pod-job", record_dir=str(record_dir)).config.run_id == "pod-job-2"
    otelprof.shutdown()
    # The same process starting again under its run id keeps its directory.
    for _ in range(2):
        session = otelprof.init(run_id="again", record_dir=str(record_dir), system_metrics=False)
        with otelprof.step():
            pass
        otelprof.shutdown()
        assert session.config.run_id == "again"
    assert len(step_lines(record_dir / "again" / "rank-0")) == 2
    assert not (record_dir / "again-2").exists()


def test_a_forked_child_does_not_keep_the_rank_directory_locked(tmp_path: Path) -> None:
    """A DataLoader worker forked while the session runs may outlive its shutdown: it holds no copy of the lock,
    so the process starting again under its run id keeps its directory."""
    proc = python("""
        import os, time
        import otelprof
        otelprof.init(run_id="forked", system_metrics=False)
        child = os.fork()
        if child == 0:
            time.sleep(2.0)  # alive through the parent's shutdown and its next init()
            os._exit(0)
        otelprof.shutdown()
        print(otelprof.init(run_id="forked", system_metrics=False).config.run_id)
        otelprof.shutdown()
        os.waitpid(child, 0)
    """, tmp_path, env_for())
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout == "forked\n"


def test_a_child_forked_by_native_code_does_not_keep_the_rank_directory_locked(tmp_path: Path) -> None:
    """A child forked by C code (no Python fork hooks, like a child not yet scheduled to run them) shares the
    lock's open file: the shutdown unlocks it for both, so the next init() keeps the run id."""
    proc = python("""
        import ctypes, os, time
        import otelprof
        otelprof.init(run_id="native", system_metrics=False)
        child = ctypes.CDLL(None, use_errno=True).fork()
        if child == 0:
            time.sleep(3.0)
            os._exit(0)
        otelprof.shutdown()
        print(otelprof.init(run_id="native", system_metrics=False).config.run_id)
        otelprof.shutdown()
        os.waitpid(child, 0)
    """, tmp_path, env_for())
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout == "native\n"


# ---------------------------------------------------------------------- 9. outside text on the terminal
FORGED = "\x1b[2K\x1b[31mreason\r\notelprof: run 1 recorded; report: otelprof report /tmp/evil\x07"


def test_a_stop_reason_is_escaped_in_the_jobs_stderr(tmp_path: Path) -> None:
    port = free_port()
    env = env_for(OTELPROF_CONTROL_PORT=str(port), OTELPROF_RECORD="false", OTELPROF_SYSTEM_METRICS="false")
    job = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import time
        import otelprof
        session = otelprof.init()
        print("ready", flush=True)
        while not session.should_stop():
            with otelprof.step():
                time.sleep(0.01)
        otelprof.shutdown()
        print("stopped", flush=True)
    """)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert job.stdout is not None and job.stdout.readline() == "ready\n"
        body = json.dumps({"reason": FORGED, "alert": "A\x1b[0m\nB"}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/stop", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 202
        out, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert out == "stopped\n"
    lines = err.splitlines()
    assert len(lines) == 1, err  # one warning line: the newline in the reason forged none
    assert "\x1b" not in err and "\x07" not in err and "\r" not in err
    assert "\\x1b[31mreason\\r\\notelprof: run 1 recorded" in lines[0] and "alert A\\x1b[0m\\nB" in lines[0]


def test_a_recorded_phase_name_is_escaped_on_the_report_progress_line(record_dir: Path, tmp_path: Path) -> None:
    otelprof.init(run_id="hostile", record_dir=str(record_dir), system_metrics=False)
    with otelprof.phase(FORGED):
        for _ in range(5):
            with otelprof.step():
                pass
    otelprof.shutdown()
    proc = subprocess.run([sys.executable, "-m", "otelprof", "report", str(record_dir / "hostile"), "-o",
                           str(tmp_path / "r.html")], cwd=tmp_path, env=env_for(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "step times over the run, rank 0 \\x1b[2K\\x1b[31mreason\\r\\notelprof: run 1" in proc.stderr
    for control in ("\x1b", "\x07", "\r"):
        assert control not in proc.stderr + proc.stdout
    assert not any(line.startswith("otelprof: run 1 recorded") for line in proc.stderr.splitlines())


# ---------------------------------------------------------------------- 10. offline tools
def _recording(record_dir: Path, run_id: str, phases: int, steps_per_phase: int = 1) -> Path:
    otelprof.init(run_id=run_id, record_dir=str(record_dir), system_metrics=False, max_label_values=1)
    for p in range(phases):
        for _ in range(steps_per_phase):
            with otelprof.step(phase=f"p{p}"):
                otelprof.record("loss", 1.0 / (p + 1))
                otelprof.record("samples", 8)
    otelprof.shutdown()
    return record_dir / run_id


def test_check_judges_a_recording_whose_process_started_after_its_shutdown(record_dir: Path,
                                                                           tmp_path: Path) -> None:
    run = _recording(record_dir, "stepped", 1, 30)
    path = run / "rank-0" / schema.MANIFEST
    data = json.loads(path.read_text())
    data["lifecycle"]["process_start"] = data["lifecycle"]["shutdown"] + 3600.0  # the clock stepped back
    path.write_text(json.dumps(data))
    for command in (["check", str(run)], ["report", str(run), "-q", "-o", str(tmp_path / "r.html")]):
        proc = subprocess.run([sys.executable, "-m", "otelprof", *command], env=env_for(), capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode in (0, 1) and "error" not in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "otelprof", "check", "--json", str(run)], env=env_for(),
                          capture_output=True, text=True, timeout=120)
    rows = json.loads(proc.stdout)["checks"]
    assert rows and all(row["evaluations"] >= 1 for row in rows)


class _Counted(list):  # type: ignore[type-arg]
    """A step column that counts the elements read from it."""

    reads = 0

    def __iter__(self) -> Any:
        for value in list.__iter__(self):
            _Counted.reads += 1
            yield value

    def __getitem__(self, index: Any) -> Any:
        value = list.__getitem__(self, index)
        _Counted.reads += len(value) if isinstance(index, slice) else 1
        return value


def _reads(record_dir: Path, phases: int) -> int:
    """Elements of the step columns the report's analyses and the offline checks read, for a run of ``phases``
    phases of two steps each."""
    recording = read_recording(_recording(record_dir, f"phases-{phases}", phases, 2), samples=True, regions=True)
    columns = recording.ranks[0].step_columns
    assert len(columns.phase_names) == phases
    for name in ("phase", "number", "start_ns", "duration_ns"):
        setattr(columns, name, _Counted(getattr(columns, name)))
    scalar = columns.scalar  # a scalar's (step indexes, values): counted too
    columns.scalar = lambda name: tuple(map(_Counted, scalar(name)))  # type: ignore[method-assign]
    import otelprof.analysis.steps as steps_module

    slowed_steps = steps_module.slowed_steps  # per step: did otelprof slow it (a column too)
    steps_module.slowed_steps = lambda rank: _Counted(slowed_steps(rank))  # type: ignore[assignment]
    try:
        _Counted.reads = 0
        report = build_report(recording, checks=False)
        evaluate(recording)
    finally:
        steps_module.slowed_steps = slowed_steps
    assert len(report.steps.rows) == MAX_PHASES  # the phases shown are capped
    assert report.framework.phases[MAX_PHASES][0] == f"{phases - MAX_PHASES:,} other phases"
    return _Counted.reads


def test_analyses_read_the_steps_a_bounded_number_of_times_whatever_the_phase_count(record_dir: Path) -> None:
    small, large = _reads(record_dir, 300), _reads(record_dir, 1200)
    # Steps + phases: four times the phases read at most about four times as much (steps x phases: sixteen).
    assert large <= 4.5 * small, (small, large)
    assert large / 2400 < 100  # reads per step: a few dozen passes, not one per phase


def test_many_phases_give_the_checks_the_same_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past a few phases the step checks look only at the phases with a step in each window: the same verdicts,
    an outlier and a straggler included, with 60 short eval phases between the training steps."""
    import otelprof.analysis.check_context as check_context
    import otelprof.analysis.checks as checks
    from otelprof.analysis.check_tables import RankData, StepRecord

    def steps(slow_every: int, stretch: float) -> list[StepRecord]:
        out, t, n = [], 5.0, 0
        while t < 890.0:
            d = 0.5 * (stretch if n % slow_every == slow_every - 1 and t > 600 else 1.0)
            slow = n % slow_every == slow_every - 1 and t > 600
            out.append(StepRecord("train", t, t + d, outlier=slow, excess=d - 0.5 if slow else 0.0))
            t, n = t + d, n + 1
            if n % 30 == 0:  # an eval pass of its own phase every 30 steps
                out.append(StepRecord(f"eval-{n // 30}", t, t + 0.1))
                t += 0.1
        return out

    ranks = [RankData("many", 0, "n1", 0.0, 900.0, steps=steps(10, 4.0)),
             RankData("many", 1, "n1", 0.0, 900.0, steps=[dataclasses.replace(s, end=s.start + 1.4 * (s.end - s.start))
                                                          for s in steps(10**9, 1.0)])]
    assert len({s.phase for s in ranks[0].steps}) > check_context.FEW_PHASES * 3
    verdicts = []
    for few in (10**9, 0):  # every phase in every window; only the phases with a step in the window
        monkeypatch.setattr(check_context, "FEW_PHASES", few)
        verdicts.append(checks.evaluate_ranks(ranks, interval=5.0))
    assert verdicts[0] == verdicts[1]
    fired = {r.alert: r.subjects for r in verdicts[1] if r.triggered}
    assert "rank 0 train" in fired.get("OtelprofStepOutliers", ()), fired
    assert "rank 1 train" in fired.get("OtelprofRankStraggler", ()), fired


def test_twenty_thousand_phases_are_reported(record_dir: Path, tmp_path: Path) -> None:
    run = _recording(record_dir, "many", 20_000)
    proc = subprocess.run([sys.executable, "-m", "otelprof", "report", str(run), "-q", "-o",
                           str(tmp_path / "r.html")], env=env_for(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "other phases" in html and html.count("p19999") == 0  # 10,000 phases read (the reader's limit)
    assert "10,000 truncated, corrupt or oversized lines" in proc.stdout


# ---------------------------------------------------------------------- 11. settings
def test_a_misspelt_variable_is_named_once_with_the_closest_setting(tmp_path: Path) -> None:
    env = env_for(OTELPROF_PROFIL_EVERY="0", OTELPROF_RECORD="false")
    proc = python("""
        import otelprof
        for _ in range(2):
            otelprof.init()
            otelprof.shutdown()
    """, tmp_path, env)
    assert proc.returncode == 0
    assert proc.stderr.splitlines() == [
        "otelprof: OTELPROF_PROFIL_EVERY is not an otelprof setting and is ignored; did you mean "
        "OTELPROF_PROFILE_EVERY? (otelprof env lists them)"] * 2  # once per init(): shutdown forgets warnings
    listed = subprocess.run([sys.executable, "-m", "otelprof", "env"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0
    assert listed.stdout.splitlines()[-1] == ("OTELPROF_PROFIL_EVERY  is not an otelprof setting: ignored "
                                              "(did you mean OTELPROF_PROFILE_EVERY?)")


def test_internal_variables_are_not_misspellings(tmp_path: Path) -> None:
    env = env_for(OTELPROF_RUN_TORCH="0", OTELPROF_RECORD="false", OTELPROF_NOT_A_SETTING_AT_ALL="1")
    proc = python("import otelprof; otelprof.init(); otelprof.shutdown()", tmp_path, env)
    assert proc.returncode == 0
    assert proc.stderr == ("otelprof: OTELPROF_NOT_A_SETTING_AT_ALL is not an otelprof setting and is ignored "
                           "(otelprof env lists them)\n")


def test_malformed_resource_attributes_give_one_prefixed_warning(tmp_path: Path) -> None:
    proc = python("import otelprof; print(dict(otelprof.init().resource.attributes)['a']); otelprof.shutdown()",
                  tmp_path, env_for(OTEL_RESOURCE_ATTRIBUTES="a=b,,junk,", OTELPROF_RECORD="false"))
    assert proc.returncode == 0 and proc.stdout == "b\n"
    assert proc.stderr == "otelprof: OTEL_RESOURCE_ATTRIBUTES has an entry that is not key=value (junk); it is " \
                          "ignored\n"

