"""torch.profiler and the FLOP counter never outlive a profiling window's session or thread.

torch.profiler's RecordFunction callbacks belong to the thread that started it; left enabled at exit, the
process dies in torch's teardown ("Requested callback is not found", then SIGSEGV, exit 139) — what a short
training process did when it ended while a periodic window waited for its last steps. A window is stopped on
its own thread: as its last step ends, when the session shuts down there, when that thread ends, at exit.
The stress test runs many short sessions ending every such way in real processes (tests/crash_stress_job.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import torch

import otelprof
from otelprof.integrations import torch as otorch
from otelprof.integrations.torch_profiler import windows
from otelprof.recording.reader import read_recording

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "crash_stress_job.py"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _profiler_enabled() -> bool:
    """torch.profiler enabled on this thread."""
    return bool(torch.autograd.profiler._is_profiler_enabled)


def _steps(count: int) -> None:
    for _ in range(count):
        with otelprof.step():
            torch.mm(torch.randn(4, 4), torch.randn(4, 4))


def _profiles(session: Any) -> list[dict[str, Any]]:
    return list(read_recording(session.run_dir.parent).ranks[0].profiles())


def _init(tmp_path: Path, **options: Any) -> Any:
    return otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0, **options)


def test_a_window_still_running_at_shutdown_is_stopped(tmp_path: Path) -> None:
    session = _init(tmp_path / "a")
    otorch.profile_window(2, 5)
    _steps(4)  # the window's steps 2..6: two ran
    assert _profiler_enabled()
    otelprof.shutdown()
    assert not _profiler_enabled() and not windows.busy
    assert _profiles(session) == []  # a window cut short is dropped
    session = _init(tmp_path / "b")  # the next session's window runs (no profiler is left in its way)
    otorch.profile_window(1, 2)
    _steps(4)
    otelprof.shutdown()
    [window] = _profiles(session)
    assert (window["start_step"], window["num_steps"]) == (1, 2) and window["operators"]["operators"] > 0


def test_a_window_ends_on_the_thread_that_started_it(tmp_path: Path) -> None:
    session = _init(tmp_path)
    otorch.profile_window(0, 1)
    with otelprof.step():  # step 0 starts the window here
        torch.mm(torch.randn(4, 4), torch.randn(4, 4))
        other = threading.Thread(target=_steps, args=(1,))  # its step ends first: the window's end is due
        other.start()
        other.join()
        assert windows._running is not None and _profiler_enabled()  # but not stopped from there
    assert windows._running is None and not _profiler_enabled()  # stopped as this thread's step ended
    otelprof.shutdown()
    [window] = _profiles(session)
    assert window["start_step"] == 0 and window["operators"]["operators"] > 0


def test_a_thread_that_ends_mid_window_stops_its_profiler(tmp_path: Path) -> None:
    session = _init(tmp_path)
    otorch.profile_window(1, 10)
    worker = threading.Thread(target=_steps, args=(3,))  # the window starts there and its thread ends
    worker.start()
    worker.join()
    assert windows._running is None
    otorch.profile_window(3, 2)  # a profiler left on the ended thread would keep this one from starting
    _steps(4)
    otelprof.shutdown()
    [window] = _profiles(session)
    assert (window["start_step"], window["num_steps"]) == (3, 2)


def test_a_flop_counter_still_counting_at_shutdown_is_popped(tmp_path: Path) -> None:
    _init(tmp_path, profile_flops=True)
    otorch.profile_window(0, 1)
    _steps(1)
    step = otelprof.step()
    step.__enter__()  # the step after the window: its FLOPs are being counted
    assert torch._C._len_torch_dispatch_stack() == 1
    otelprof.shutdown()
    assert torch._C._len_torch_dispatch_stack() == 0
    step.__exit__(None, None, None)


def test_many_short_sessions_end_cleanly_in_real_processes(tmp_path: Path) -> None:
    """Sessions ending mid-window on their thread, on another thread, after a thread ended, while FLOPs are
    counted, and at interpreter exit, with evaluation passes and captures in between: the process exits 0 with
    nothing on stderr, every round leaves no profiler and no dispatch mode behind, and the windows that did
    finish were recorded (with their FLOPs when the step after them ran)."""
    rounds = 12
    for seed in (0, 1):
        result = subprocess.run([sys.executable, str(JOB), str(seed), str(rounds), str(tmp_path / str(seed))],
                                env=_env(), capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
        assert result.stderr == ""
        report = [json.loads(line) for line in result.stdout.splitlines()]
        assert len(report) == rounds and report[-1]["ending"] == "left"
        assert {r["ending"] for r in report} == {"shutdown", "thread", "foreign", "flops", "left"}
        for r in report[:-1]:
            assert not r["left"], r
            assert all(start + steps <= r["steps"] for start, steps, _ in r["profiles"]), r
        for r in report:
            if r["ending"] == "flops":  # the window ended a step before the last, which counted FLOPs
                assert any(counted for _, _, counted in r["profiles"]), r
        assert sum(r["evaluated"] for r in report) > 0


def test_otelprof_run_exits_cleanly_with_a_window_waiting_for_steps(tmp_path: Path) -> None:
    """The reported case: ``otelprof run`` of a short loop with periodic evaluation, its last training steps inside
    a window that wants more of them; the process ends after its last step."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        from otelprof.integrations.torch_profiler import windows

        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        windows.arm(4, 10, trigger="periodic", phase="train")  # as the schedule arms one: steps 4..13
        for step in range(6):
            loss = nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 3 == 2:
                model.eval()
                with torch.no_grad():
                    model(torch.randn(4, 8))
                model.train()
        print("trained", flush=True)
    """))
    env = _env() | {"OTELPROF_RECORD_DIR": str(tmp_path / "runs"), "OTELPROF_SYSTEM_METRICS": "false",
                    "OTELPROF_PROFILE_EVERY": "0"}
    result = subprocess.run([sys.executable, "-m", "otelprof", "run", "--", sys.executable, str(script)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert "trained" in result.stdout and "Requested callback" not in result.stderr
