"""SIGTERM with real processes and real signals: otelprof flushes, then the signal takes its own course.

* the application's handler installed before ``init()``: it runs, the steps and the checkpoint after the
  signal are recorded, the exit code is the application's;
* a handler installed after ``init()`` that chains to the one it found (Lightning's signal connector, ...):
  the application's graceful stop runs; otelprof does not end the process under it;
* no handler: the process dies of SIGTERM as it would, the recording flushed first, bounded by the
  shutdown timeout even with a collector that never answers; a second SIGTERM ends it at once;
* SIG_IGN: still ignored, by the process and by the programs it starts;
* torchrun: SIGTERM to one worker while it trains; the agent tears the other down; both recordings are whole;
* Lightning, whose signal connector chains to the handler it finds: its graceful stop (finish the batch,
  ``OnExceptionCheckpoint``) runs, every batch is a recorded step.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from otelprof.recording import schema
from otelprof.recording.reader import read_recording
from tests.otlp_receiver import BlackHole
from tests.test_never_harm import _wait_for_file, child_env, rank_of, script

LOOP = """
    import json, pathlib, signal, sys, time
    import otelprof

    record_dir, marker, checkpoint = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    stop = []

    def train(after_signal):
        steps = after = 0
        while not (stop and after >= after_signal):
            with otelprof.step():
                with otelprof.annotate("forward"):
                    time.sleep(0.002)
                otelprof.record("loss", 1.0 / (steps + 1))
            steps += 1
            after += bool(stop)
            if steps == 20:
                marker.write_text("go")
        with otelprof.annotate("checkpoint"):
            checkpoint.write_text(str(steps))
        print(json.dumps({"steps": steps, "after": after}), flush=True)
"""


def run_until_marker(source: str, tmp_path: Path, signals: int = 1, gap: float = 0.0, timeout: float = 20.0,
                     **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Start the child, send SIGTERM once it wrote the marker (``signals`` times, ``gap`` apart); the result
    and the seconds from the first signal to the child's exit."""
    marker = tmp_path / "marker"
    args = [*script(source), str(tmp_path / "rec"), str(marker), str(tmp_path / "checkpoint")]
    proc = subprocess.Popen(args, env=child_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_file(marker, proc, timeout=timeout)
        began = time.monotonic()
        for i in range(signals):
            if i:
                time.sleep(gap)
            os.kill(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=timeout)
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr), took


def result_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the child printed no result (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    return dict(json.loads(lines[-1]))


def check_whole_recording(tmp_path: Path, steps: int | None = None) -> None:
    """Every step the child ran is recorded, in order; the manifest says finished and when SIGTERM came."""
    rank = rank_of(tmp_path / "rec", "term")
    numbers = [s.number for s in rank.steps]
    assert numbers == list(range(len(numbers)))
    if steps is not None:
        assert len(numbers) == steps, "every step, those after the signal too"
        assert [s.scalars["loss"] for s in rank.steps] == [1.0 / (i + 1) for i in range(steps)]
    assert len(numbers) >= 20
    assert rank.skipped_lines == 0
    assert rank.manifest["status"] == schema.STATUS_FINISHED
    assert rank.manifest["lifecycle"]["init"] < rank.manifest["sigterm"] <= rank.manifest["lifecycle"]["shutdown"]


def test_the_applications_handler_installed_before_init_runs_and_its_graceful_stop_is_recorded(
        tmp_path: Path) -> None:
    source = LOOP + """
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    otelprof.init(run_id="term", record_dir=record_dir, system_metrics=False)
    train(after_signal=5)
    sys.exit(3)
"""
    proc, _ = run_until_marker(source, tmp_path)
    assert proc.returncode == 3, proc.stderr[-3000:]
    result = result_of(proc)
    assert result["after"] == 5
    assert (tmp_path / "checkpoint").read_text() == str(result["steps"])
    check_whole_recording(tmp_path, result["steps"])
    rank = rank_of(tmp_path / "rec", "term")
    [checkpoint] = rank.annotations
    assert checkpoint.name == "checkpoint" and checkpoint.start_ns > rank.steps[-1].end_ns
    assert "Traceback" not in proc.stderr


def test_a_handler_installed_after_init_that_chains_to_ours_keeps_its_graceful_stop(tmp_path: Path) -> None:
    """The framework pattern: keep the handler found, call it from one's own. Ours used to end the process
    there, before the application's graceful stop (finish the steps, checkpoint, exit 0) could run."""
    source = LOOP + """
    otelprof.init(run_id="term", record_dir=record_dir, system_metrics=False)
    found = signal.getsignal(signal.SIGTERM)

    def framework(signum, frame):
        stop.append(signum)
        if callable(found) and found not in (signal.SIG_DFL, signal.SIG_IGN):
            found(signum, frame)

    signal.signal(signal.SIGTERM, framework)
    train(after_signal=5)
"""
    proc, _ = run_until_marker(source, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_of(proc)
    assert result["after"] == 5
    assert (tmp_path / "checkpoint").read_text() == str(result["steps"])
    check_whole_recording(tmp_path, result["steps"])
    assert [a.name for a in rank_of(tmp_path / "rec", "term").annotations] == ["checkpoint"]


NO_HANDLER = LOOP + """
    otelprof.init(run_id="term", record_dir=record_dir, system_metrics=False, otlp_protocol="http/protobuf",
                  shutdown_timeout=float(sys.argv[4]))
    train(after_signal=10**9)
"""


def test_without_a_handler_the_process_dies_of_sigterm_flushed_within_the_shutdown_timeout(tmp_path: Path) -> None:
    """With a collector that accepts connections and never answers, the flush costs at most the timeout."""
    shutdown_timeout = 1.0
    with BlackHole() as hole:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{hole.port}"}
        proc, took = run_until_marker(NO_HANDLER.replace("sys.argv[4]", str(shutdown_timeout)), tmp_path, **env)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-3000:]
    assert took < shutdown_timeout + 2.0, f"died {took:.1f}s after SIGTERM"
    assert not (tmp_path / "checkpoint").exists()
    check_whole_recording(tmp_path)


def test_a_second_sigterm_ends_the_process_at_once(tmp_path: Path) -> None:
    with BlackHole() as hole:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{hole.port}"}
        proc, took = run_until_marker(NO_HANDLER.replace("sys.argv[4]", "20.0"), tmp_path, signals=2, gap=0.5,
                                      **env)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-3000:]
    assert took < 5.0, f"a second SIGTERM waited for the 20 s flush: {took:.1f}s"
    rank = rank_of(tmp_path / "rec", "term")
    assert len(rank.steps) >= 20 and rank.skipped_lines == 0


def test_an_ignored_sigterm_stays_ignored_in_the_process_and_the_programs_it_starts(tmp_path: Path) -> None:
    source = LOOP + """
    import subprocess
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    otelprof.init(run_id="term", record_dir=record_dir, system_metrics=False)
    stop.append("never")  # SIGTERM is ignored: the loop ends on its own
    train(after_signal=400)
    child = subprocess.run([sys.executable, "-c", "import signal; print(int(signal.getsignal(signal.SIGTERM)))"],
                           capture_output=True, text=True)
    print(json.dumps({"child": int(child.stdout), "handler": signal.getsignal(signal.SIGTERM) == signal.SIG_IGN}))
"""
    proc, _ = run_until_marker(source.replace("if steps == 20:", "if steps == 1:"), tmp_path, signals=3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result_of(proc) == {"child": int(signal.SIG_IGN), "handler": True}
    rank = rank_of(tmp_path / "rec", "term")
    assert len(rank.steps) == 400 and "sigterm" not in rank.manifest


TORCHRUN = """
import os, pathlib, sys, time
import otelprof

out = pathlib.Path(sys.argv[1])
otelprof.init(run_id="torchrun", record_dir=str(out / "rec"), system_metrics=False)
rank = int(os.environ["RANK"])
steps = 0
while True:
    with otelprof.step():
        with otelprof.annotate("forward"):
            time.sleep(0.005)
    steps += 1
    if steps == 20:
        (out / f"pid-{rank}").write_text(str(os.getpid()))
"""


def test_torchrun_sigterm_to_one_worker_while_it_trains(tmp_path: Path) -> None:
    """The agent sees the worker die of SIGTERM and sends SIGTERM to the other: both recordings are flushed."""
    (tmp_path / "train.py").write_text(TORCHRUN)
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.Popen([str(torchrun), "--standalone", "--nproc_per_node=2", "--monitor-interval=0.2",
                             str(tmp_path / "train.py"), str(tmp_path)], env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for rank in (0, 1):
            _wait_for_file(tmp_path / f"pid-{rank}", proc, timeout=60)
        os.kill(int((tmp_path / "pid-1").read_text()), signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0, "a worker died: torchrun reports the failure"
    assert "Signals.SIGTERM" in stderr or "SIGTERM" in stderr, stderr[-3000:]
    recording = read_recording(tmp_path / "rec" / "torchrun")
    assert [r.rank for r in recording.ranks] == [0, 1]
    for rank in recording.ranks:
        numbers = [s.number for s in rank.steps]
        assert len(numbers) >= 20 and numbers == list(range(len(numbers))), rank.rank
        assert rank.skipped_lines == 0
        assert rank.manifest["status"] == schema.STATUS_FINISHED, rank.rank
        assert rank.manifest["sigterm"] <= rank.manifest["lifecycle"]["shutdown"]


LIGHTNING = """
import json, pathlib, sys, time
import torch
import lightning.pytorch as pl
from lightning.pytorch.callbacks import OnExceptionCheckpoint
from torch.utils.data import DataLoader, TensorDataset
import otelprof
from otelprof.integrations.lightning import OtelprofCallback

out = pathlib.Path(sys.argv[1])
torch.set_num_threads(1)
otelprof.init(run_id="term", record_dir=str(out / "rec"), system_metrics=False)  # before the Trainer's handler


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)
        self.batches = 0

    def training_step(self, batch, batch_idx):
        time.sleep(0.01)
        self.batches += 1
        if self.batches == 10:
            (out / "marker").write_text("go")
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


generator = torch.Generator().manual_seed(0)
data = DataLoader(TensorDataset(torch.randn(8000, 8, generator=generator),
                                torch.randint(0, 2, (8000,), generator=generator)), batch_size=8)
module = Tiny()
trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=str(out / "pl"),
                     callbacks=[OtelprofCallback(), OnExceptionCheckpoint(dirpath=str(out / "checkpoints"))])
try:
    trainer.fit(module, data)
finally:
    print(json.dumps({"batches": module.batches, "status": str(trainer.state.status)}), flush=True)
"""


def test_lightning_graceful_stop_on_sigterm_runs_and_is_recorded(tmp_path: Path) -> None:
    if importlib.util.find_spec("lightning") is None:
        if os.environ.get("CI"):
            pytest.fail("lightning is not installed; .ci/run must install it", pytrace=False)
        pytest.skip("lightning not installed")
    (tmp_path / "train.py").write_text(LIGHTNING)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "train.py"), str(tmp_path)], env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_file(tmp_path / "marker", proc, timeout=60)
        os.kill(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]  # Lightning's SIGTERMException is a SystemExit without a code
    result = result_of(subprocess.CompletedProcess([], 0, stdout, stderr))
    assert result["status"] == "TrainerStatus.INTERRUPTED" and result["batches"] < 1000
    assert (tmp_path / "checkpoints" / "on_exception.ckpt").is_file(), "Lightning's graceful stop ran"
    rank = rank_of(tmp_path / "rec", "term")
    assert [s.number for s in rank.steps if s.phase == "train"] == list(range(result["batches"]))
    assert rank.manifest["status"] == schema.STATUS_FINISHED and "sigterm" in rank.manifest


def test_a_forked_child_dies_of_sigterm_at_once_and_leaves_the_parents_recording_alone(tmp_path: Path) -> None:
    """A DataLoader worker started with fork inherits the handler: there it only hands the signal on."""
    source = """
    import json, os, signal, sys, time
    import otelprof

    otelprof.init(run_id="term", record_dir=sys.argv[1], system_metrics=False)
    for _ in range(3):
        with otelprof.step():
            pass
    pid = os.fork()
    if pid == 0:
        while True:
            time.sleep(0.01)
    time.sleep(0.2)
    began = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    took = time.monotonic() - began
    for _ in range(3):
        with otelprof.step():
            pass
    otelprof.shutdown()
    print(json.dumps({"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, "took": took}))
"""
    proc = subprocess.run([*script(source), str(tmp_path / "rec")], env=child_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_of(proc)
    assert result["signal"] == signal.SIGTERM and result["took"] < 2.0
    rank = rank_of(tmp_path / "rec", "term")
    assert [s.number for s in rank.steps] == list(range(6))
    assert rank.manifest["status"] == schema.STATUS_FINISHED and "sigterm" not in rank.manifest
