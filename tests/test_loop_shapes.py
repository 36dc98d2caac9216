"""The loop-shape corpus (``tests/loop_shapes``): each loop run under ``otelprof run`` (global hooks, a subprocess)
and with the explicit API (``otelprof.torch.instrument``, in this process), with the hooks in C and in Python;
its recording must hold the steps the loop itself accounts for — phases in order, numbers from 0 per phase, the
regions each step holds, its samples and its loss (the loop's own combination of its micro-batch losses)."""

from __future__ import annotations

import importlib
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import otelprof
from otelprof import semconv as sc
from otelprof.integrations import torch as otorch
from otelprof.integrations import torch_state
from otelprof.recording.ranks import RankRecording
from otelprof.recording.reader import read_recording
from tests.loop_shapes import OTHER_FORWARD
from tests.test_torch import require_native

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]
REGIONS = (sc.REGION_DATALOADER, sc.REGION_FORWARD, sc.REGION_BACKWARD, sc.REGION_OPTIMIZER)
RUN, EXPLICIT = "run", "explicit"
PATHS = ("native", "python")

SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "minimal": ("minimal", {}),
    "nanogpt": ("nanogpt", {}),
    "nanogpt-compiled": ("nanogpt", {"compile": True}),
    "amp": ("amp", {}),
    "sharded-scaler": ("sharded_scaler", {}),
    "peek-and-zip": ("peek_and_zip", {}),
    "iterable": ("iterable", {}),
    "gan": ("gan", {}),
    "evaluation-loader": ("evaluation_loader", {}),
    "evaluation-inline": ("evaluation_inline", {}),
    "manual-sgd": ("manual_sgd", {}),
    "seq2seq": ("seq2seq", {}),
    "loader-error": ("loader_error", {}),
    "lbfgs": ("lbfgs", {}),
    "sgd-closure": ("sgd_closure", {}),
    "running-loss": ("running_loss", {}),
}
"""Shape id: (module in tests/loop_shapes, options for its main())."""
PYTHON_ONLY = {"nanogpt-compiled", "manual-sgd", "gan", "seq2seq", "lbfgs"}
"""Shapes the C hooks leave to the Python ones: a torch.compile'd model is timed by module hooks, the C hooks
keep steps ended by the step() of one optimizer only, and an evaluation step open in Python is ended there (the
L-BFGS loop's train steps after the first)."""


@pytest.fixture(autouse=True)
def _uninstrument() -> Iterator[None]:
    yield
    otorch.uninstrument()


def _expected_regions(regions: list[str], mode: str) -> list[str]:
    if mode == RUN:
        return [sc.REGION_FORWARD if r == OTHER_FORWARD else r for r in regions]
    return [r for r in regions if r != OTHER_FORWARD]


def check(rank: RankRecording, account: dict[str, Any], mode: str) -> None:
    """The recording holds the loop's steps: phases in order, numbered from 0 per phase, with the loop's regions,
    samples and loss; and the regions it says stand outside steps."""
    assert account["steps"], "the loop accounted for no step"
    assert sorted(a.name for a in rank.annotations if a.name in REGIONS) == account["outside"]
    steps, account = rank.steps, account["steps"]
    assert [s.phase for s in steps] == [a["phase"] for a in account]
    for phase in {a["phase"] for a in account}:
        numbers = [s.number for s in steps if s.phase == phase]
        assert numbers == list(range(len(numbers))), phase
    for step, expected in zip(steps, account):
        where = f"{step.phase} step {step.number}"
        assert [a.name for a in step.annotations if a.name in REGIONS] == \
            _expected_regions(expected["regions"], mode), where
        loss = expected["loss"] if expected.get("loss_from") != OTHER_FORWARD or mode == RUN else None
        if loss is None:
            assert sc.SCALAR_LOSS not in step.scalars, where
        else:
            assert step.scalars.get(sc.SCALAR_LOSS) == pytest.approx(loss, rel=1e-6), where
        if expected["samples"] is None:
            assert sc.SCALAR_SAMPLES not in step.scalars, where
        else:
            assert step.scalars.get(sc.SCALAR_SAMPLES) == expected["samples"], where
        updates = {sc.optimizer_loss(int(index)): value for index, value in expected.get("updates", {}).items()}
        assert {name for name in step.scalars if name.startswith(sc.optimizer_loss(0)[:-1])} == set(updates), where
        for name, value in [*updates.items(), *expected.get("recorded", {}).items()]:
            assert step.scalars[name] == pytest.approx(value, rel=1e-6), (where, name)
        assert all(step.start_ns <= a.start_ns and a.start_ns + a.duration_ns <= step.end_ns
                   for a in step.annotations), where  # also a step that ended before the event that ended it
    for step, after in itertools.pairwise(steps):
        assert step.end_ns <= after.start_ns, f"{step.phase} step {step.number} ends after the next one starts"


def launch(tmp_path: Path, module: str, options: dict[str, Any], env: dict[str, str], *, under_run: bool,
           launcher: tuple[str, ...] = ()) -> tuple[list[RankRecording], list[dict[str, Any]]]:
    """``[otelprof run --] [launcher] python -m tests.loop_shapes.<module>`` (``launcher`` torchrun: ``torchrun ...
    -m tests.loop_shapes.<module>``, torchrun starting Python itself): the recording's ranks and the loop's
    accounts of them."""
    out = tmp_path / "account.json"
    env = {**os.environ, "OTELPROF_RECORD_DIR": str(tmp_path / "runs"), "OTELPROF_RUN_ID": "shape",
           "OTELPROF_SYSTEM_METRICS": "false", "LOOP_SHAPE_OUT": str(out), "LOOP_SHAPE_OPTIONS": json.dumps(options),
           "OTELPROF_PROFILE_EVERY": "0", **env}  # no periodic window: whether one starts depends on the machine's pace
    python = () if launcher and "--no-python" not in launcher else (sys.executable,)
    command = [*launcher, *python, "-m", f"tests.loop_shapes.{module}"]
    if under_run:
        command = [sys.executable, "-m", "otelprof", "run", "--", *command]
    result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Traceback" not in result.stderr and "Warning" not in result.stderr, result.stderr[-4000:]
    ranks = read_recording(tmp_path / "runs" / "shape").ranks
    if launcher:
        accounts = [json.loads(Path(f"{out}.{r.rank}").read_text()) for r in ranks]
    else:
        accounts = [json.loads(out.read_text())]
    return ranks, accounts


def explicit_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, options: dict[str, Any],
                   path: str, c_holds_steps: bool) -> tuple[RankRecording, dict[str, Any]]:
    """The loop in this process, its objects given to ``otelprof.torch.instrument``."""
    monkeypatch.setenv("OTELPROF_TORCH_NATIVE", "true" if path == "native" else "false")
    session = otelprof.init(record_dir=str(tmp_path / "runs"), system_metrics=False, profile_every=0)
    shape = importlib.import_module(f"tests.loop_shapes.{module}")
    account = shape.main(otorch.instrument, **options)
    inst = torch_state._active[-1]
    if c_holds_steps:  # and were still on at the end
        assert inst.native.enabled and inst.native.number > 0
    otorch.uninstrument()
    run_dir = session.run_dir
    otelprof.shutdown()
    return read_recording(run_dir).ranks[0], json.loads(json.dumps(account.dump()))  # as a subprocess's


_bare: dict[str, dict[str, Any]] = {}


def bare_facts(module: str, options: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """The facts the loop gives without otelprof: ``python -m tests.loop_shapes.<module>`` alone (once per module)."""
    if module not in _bare:
        out = tmp_path / "bare.json"
        env = {**os.environ, "LOOP_SHAPE_OUT": str(out), "LOOP_SHAPE_OPTIONS": json.dumps(options)}
        result = subprocess.run([sys.executable, "-m", f"tests.loop_shapes.{module}"], env=env, cwd=REPO,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-4000:]
        _bare[module] = json.loads(out.read_text())["facts"]
    return _bare[module]


def _cases() -> list[tuple[str, str, str]]:
    """Every shape with the explicit API on both hook paths, and under ``otelprof run`` once, on the C and the Python
    path in turn: ``otelprof run``'s global hooks keep the C path off (only ``Tensor.backward`` is then a C
    wrapper, which hands every call to the Python hook), and each run is a process that imports torch."""
    cases = []
    for index, shape in enumerate(SHAPES):
        cases += [(shape, EXPLICIT, path) for path in PATHS]
        cases.append((shape, RUN, PATHS[index % 2]))
    return cases


@pytest.mark.parametrize(("shape", "mode", "path"), _cases())
def test_the_recording_holds_the_loops_own_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str,
                                                 mode: str, path: str) -> None:
    if path == "native":
        require_native()
    module, options = SHAPES[shape]
    if mode == RUN:
        native = "true" if path == "native" else "false"
        [rank], [account] = launch(tmp_path, module, options, {"OTELPROF_TORCH_NATIVE": native}, under_run=True)
    else:
        rank, account = explicit_shape(tmp_path, monkeypatch, module, options, path,
                                       c_holds_steps=path == "native" and shape not in PYTHON_ONLY)
    check(rank, account, mode)
    if account["facts"]:
        assert account["facts"] == bare_facts(module, options, tmp_path)


TORCHRUN = (str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node=2")
PATH_PER_RANK = ("--no-python", "sh", "-c", 'if [ "$RANK" = 0 ]; then export OTELPROF_TORCH_NATIVE=true; '
                 'else export OTELPROF_TORCH_NATIVE=false; fi; exec "$@"', "sh")
"""torchrun starts ``sh``, which starts Python with the C hooks on rank 0 and the Python hooks on rank 1."""


@pytest.mark.parametrize("mode", [RUN, EXPLICIT])
def test_each_ddp_rank_records_its_own_steps_and_loss(tmp_path: Path, mode: str) -> None:
    """torchrun, 2 ranks (gloo): rank 0 with the C hooks, rank 1 with the Python hooks."""
    require_native()
    if mode == RUN:
        ranks, accounts = launch(tmp_path, "ddp", {}, {}, under_run=True, launcher=TORCHRUN + PATH_PER_RANK)
    else:
        ranks, accounts = launch(tmp_path, "ddp", {}, {"LOOP_SHAPE_EXPLICIT": "1", "LOOP_SHAPE_NATIVE_RANKS": "0"},
                                 under_run=False, launcher=TORCHRUN)
    assert [r.rank for r in ranks] == [0, 1]
    for rank, account in zip(ranks, accounts):
        check(rank, account, mode)
    assert accounts[0]["steps"][0]["loss"] != accounts[1]["steps"][0]["loss"]  # each rank its own micro-batches
