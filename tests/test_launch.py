"""``otelprof run`` inside the program: which processes it instruments, and what it says (rank 0 only: where
the recording goes, at the start; how to report it, at the exit; nothing when asked to be quiet)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from otelprof.recording.reader import read_recording

ROOT = Path(__file__).resolve().parents[1]
BOOTSTRAP = ROOT / "otelprof" / "_bootstrap" / "sitecustomize.py"

TRAIN = """
import subprocess, sys, torch
from torch.utils.data import DataLoader, TensorDataset
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
# a Python helper process, as torch.compile's compile workers are: not a training process of its own
subprocess.run([sys.executable, "-c", "import otelprof; assert otelprof.get_session() is None"], check=True)
# a forked child that exits normally runs the exit handlers it inherited: it says nothing
import os
child = os.fork()
if child == 0:
    sys.exit(0)
os.waitpid(child, 0)
"""


def otelprof_run(tmp_path: Path, *command: str, env: dict[str, str] | None = None,
                 run_options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``otelprof run [OPTIONS] -- COMMAND`` in ``tmp_path``, recording into ``tmp_path/runs`` (run id ``run``
    unless ``env`` says otherwise), without system metrics."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                              if p),
                   "OTELPROF_RECORD_DIR": str(tmp_path / "runs"), "OTELPROF_RUN_ID": "run",
                   "OTELPROF_SYSTEM_METRICS": "false", **(env or {})}
    result = subprocess.run([sys.executable, "-m", "otelprof", "run", *run_options, "--", *command], env=environment,
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def otelprof_lines(stderr: str) -> list[str]:
    """What otelprof printed on stderr."""
    return [line for line in stderr.splitlines() if line.startswith("otelprof")]


def _script(tmp_path: Path) -> str:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    return str(script)


def test_rank_0_says_where_the_recording_goes_and_how_to_report_it(tmp_path: Path) -> None:
    result = otelprof_run(tmp_path, sys.executable, _script(tmp_path), env={"OTELPROF_RUN_ID": ""})
    [run] = list((tmp_path / "runs").iterdir())  # one run: the helper process recorded none
    assert otelprof_lines(result.stderr) == [
        f"otelprof: recording run {run.name} to runs/{run.name}",
        f"otelprof: run {run.name} recorded; report: otelprof report runs/{run.name}"]
    assert len(read_recording(run).ranks[0].steps) == 4
    report = subprocess.run([sys.executable, "-m", "otelprof", "report", f"runs/{run.name}", "-q", "-o", "r.html"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert report.returncode == 0 and (tmp_path / "r.html").stat().st_size > 0, report.stderr[-2000:]


@pytest.mark.parametrize(("option", "env"), [("--quiet", {}), ("", {"OTELPROF_QUIET": "true"}),
                                             ("", {"RANK": "1", "WORLD_SIZE": "2"})],
                         ids=["--quiet", "OTELPROF_QUIET", "rank-1"])
def test_quiet_when_asked_and_on_other_ranks(tmp_path: Path, option: str, env: dict[str, str]) -> None:
    result = otelprof_run(tmp_path, sys.executable, "-c", "pass", env=env,
                          run_options=("--no-torch", option) if option else ("--no-torch",))
    assert otelprof_lines(result.stderr) == []
    assert (tmp_path / "runs" / "run").is_dir()


def test_without_a_local_recording_it_says_so_once(tmp_path: Path) -> None:
    result = otelprof_run(tmp_path, sys.executable, "-c", "pass", env={"OTELPROF_RECORD": "false"},
                          run_options=("--no-torch",))
    assert otelprof_lines(result.stderr) == ["otelprof: run run, not recorded locally (OTELPROF_RECORD=false)"]


def _bootstrap() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_otelprof_bootstrap_under_test", BOOTSTRAP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # OTELPROF_RUN is not set here: defines its functions, starts nothing
    return module


@pytest.mark.parametrize(("argv", "role"), [
    ("python train.py accelerate launch", "training"),  # a launcher's name as an argument
    ("python -W ignore -u train.py", "training"),
    ("python -X dev -c pass", "training"),
    ("/venv/bin/python /venv/bin/torchrun --nproc_per_node=2 train.py", "launcher"),
    ("python -m torch.distributed.run --nproc_per_node=2 train.py", "launcher"),
    ("python /venv/bin/accelerate launch train.py", "launcher"),
    ("python -u -m deepspeed.launcher.launch --world_info=x train.py", "launcher"),
    ("python -c from multiprocessing.spawn import spawn_main; spawn_main() --multiprocessing-fork", "helper"),
    ("python -c from multiprocessing.resource_tracker import main;main(5)", "helper"),
])
def test_which_processes_are_training_processes(argv: str, role: str) -> None:
    assert _bootstrap()._role(argv.split()) == role
