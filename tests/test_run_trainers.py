"""Trainers run unchanged under ``otelprof run`` record what their explicit integration records: a Hugging Face
``Trainer``, a Lightning ``Trainer`` (each gets otelprof's callback, once, and the global PyTorch hooks hand
steps over to it) and an ``accelerate`` loop with gradient accumulation. Each recording is checked against
what the loop itself counted and logged (the loops: ``tests/trainer_loops.py``): step counts and numbers,
the regions of each step, samples, learning rate and loss — under ``otelprof run`` (the trainers' scripts
unchanged, in a subprocess; the accelerate loop, and the trainers given the callback as well, with what
``otelprof run`` does in this process), and with the explicit callback / API (the accelerate loop on the C and
the Python hooks)."""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _require(module: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is not installed; .ci/run must install it (pip install -e '.[hf,lightning]')",
                        pytrace=False)
        pytest.skip(f"{module} not installed (pip install -e '.[hf,lightning]')", allow_module_level=True)


for _module in ("transformers", "accelerate", "lightning.pytorch", "pytorch_lightning"):
    _require(_module)

import otelprof  # noqa: E402
from otelprof import semconv as sc  # noqa: E402
from otelprof.integrations import autoattach  # noqa: E402
from otelprof.integrations import torch as otorch  # noqa: E402
from otelprof.recording.ranks import RankRecording  # noqa: E402
from otelprof.recording.reader import read_recording  # noqa: E402
from otelprof.recording.records import Step  # noqa: E402
from tests import trainer_loops as loops  # noqa: E402
from tests.test_launch import otelprof_lines, otelprof_run  # noqa: E402
from tests.test_torch import require_native  # noqa: E402

CALLBACK = {"hf": "otelprof.integrations.transformers.OtelprofCallback",
            "lightning": "otelprof.integrations.lightning.OtelprofCallback"}


@pytest.fixture(autouse=True)
def _uninstrument() -> Iterator[None]:
    yield
    otorch.uninstrument()


@pytest.fixture
def zero_code(tmp_path: Path) -> Iterator[Path]:
    """What ``otelprof run`` does in the program it starts, in this process (see otelprof.cli.launch.start): a session,
    the global PyTorch hooks, the trainer and accelerate patches. Yields the recording's directory."""
    session = otelprof.init(record_dir=str(tmp_path / "runs"), system_metrics=False)
    assert isinstance(session, otelprof.Session) and session.run_dir is not None
    otorch.auto_instrument()
    autoattach.install()
    try:
        yield session.run_dir
    finally:
        autoattach.uninstall()
        otorch.uninstrument()
        otelprof.shutdown()


def _run_loop(tmp_path: Path, loop: str, mode: str) -> tuple[RankRecording, dict[str, Any]]:
    result = otelprof_run(tmp_path, sys.executable, str(Path(loops.__file__)), loop, mode, str(tmp_path / "out"))
    # Rank 0 says where the recording goes and how to report it; nothing else of otelprof's (no warning that
    # the callback and the global hooks both time the run, no NVML warning without a GPU).
    assert otelprof_lines(result.stderr) == ["otelprof: recording run run to runs/run",
                                             "otelprof: run run recorded; report: otelprof report runs/run"]
    return read_recording(tmp_path / "runs" / "run").ranks[0], json.loads(result.stdout.strip().splitlines()[-1])


def _names(step: Step) -> list[str]:
    return [a.name for a in step.annotations]


def _count(step: Step, region: str) -> int:
    return _names(step).count(region)


def _phase(rank: RankRecording, phase: str) -> list[Step]:
    return [s for s in rank.steps if s.phase == phase]


# ---------------------------------------------------------------------- Hugging Face Trainer
def check_hf(rank: RankRecording, result: dict[str, Any]) -> None:
    logged = [entry for entry in result["log_history"] if "loss" in entry]
    evaluations = [entry["eval_loss"] for entry in result["log_history"] if "eval_loss" in entry]
    assert len(evaluations) == 2 and evaluations[-1] == result["final_eval_loss"]  # after the epoch, at the end
    assert result["callbacks"].count(CALLBACK["hf"]) == 1  # attached once, whoever attached it

    train = _phase(rank, "train")
    steps = loops.HF_TRAIN // (loops.HF_BATCH * loops.HF_ACCUMULATION)
    assert result["global_step"] == steps == len(logged)
    assert [s.number for s in train] == list(range(steps))  # one step per optimizer step, not per fetch
    for step, entry in zip(train, logged):
        assert _count(step, sc.REGION_FORWARD) == _count(step, sc.REGION_BACKWARD) == loops.HF_ACCUMULATION
        assert _count(step, sc.REGION_OPTIMIZER) == 1
        assert step.scalars["loss"] == pytest.approx(entry["loss"], rel=1e-4)  # what the Trainer logged
        assert step.scalars["grad_norm"] == pytest.approx(entry["grad_norm"], rel=1e-4)
        assert step.scalars["learning_rate"] == pytest.approx(entry["learning_rate"])
        assert step.scalars["samples"] == loops.HF_BATCH * loops.HF_ACCUMULATION
    assert sum(_count(s, sc.REGION_DATALOADER) for s in train) == loops.HF_TRAIN // loops.HF_BATCH  # each batch once

    per_evaluation = loops.HF_EVAL // loops.HF_BATCH
    evals = _phase(rank, "eval")
    assert [s.number for s in evals] == list(range(per_evaluation * len(evaluations)))
    for i, expected in enumerate(evaluations):
        batches = evals[i * per_evaluation:(i + 1) * per_evaluation]
        assert all(_count(s, sc.REGION_FORWARD) == 1 and not _count(s, sc.REGION_BACKWARD) for s in batches)
        assert all(s.scalars["samples"] == loops.HF_BATCH for s in batches)
        assert sum(s.scalars["loss"] for s in batches) / per_evaluation == pytest.approx(expected, rel=1e-4)


def test_hf_trainer_under_otelprof_run(tmp_path: Path) -> None:
    check_hf(*_run_loop(tmp_path, "hf", "plain"))


def test_hf_trainer_given_the_callback_under_otelprof_run(tmp_path: Path, zero_code: Path) -> None:
    from otelprof.integrations.transformers import OtelprofCallback

    result = loops.hf_trainer(str(tmp_path / "out"), [OtelprofCallback()])  # not attached a second time
    otelprof.shutdown()
    check_hf(read_recording(zero_code).ranks[0], result)


def test_hf_trainer_with_the_explicit_callback(tmp_path: Path) -> None:
    from otelprof.integrations.transformers import OtelprofCallback

    session = otelprof.init(record_dir=str(tmp_path / "runs"), system_metrics=False)
    result = loops.hf_trainer(str(tmp_path / "out"), [OtelprofCallback()])
    run_dir = session.run_dir
    otelprof.shutdown()
    check_hf(read_recording(run_dir).ranks[0], result)


# ---------------------------------------------------------------------- Lightning Trainer
def check_lightning(rank: RankRecording, result: dict[str, Any]) -> None:
    assert result["callbacks"].count(CALLBACK["lightning"]) == 1
    train = _phase(rank, "train")
    steps = loops.PL_TRAIN // (loops.PL_BATCH * loops.PL_ACCUMULATION)
    assert result["global_step"] == steps
    assert [s.number for s in train] == list(range(steps))
    losses, n = result["losses"], loops.PL_ACCUMULATION
    for i, step in enumerate(train):
        assert _names(step) == [sc.REGION_DATALOADER, sc.REGION_FORWARD, sc.REGION_BACKWARD] * n + [
            sc.REGION_OPTIMIZER]
        # Lightning's own accounting: each batch's loss / accumulate_grad_batches, summed over the step
        assert step.scalars["loss"] == pytest.approx(sum(losses[n * i:n * i + n]) / n, rel=1e-5)
        assert step.scalars["learning_rate"] == 0.05
        assert step.scalars["samples"] == loops.PL_BATCH * n
    evals = _phase(rank, "eval")
    assert [s.number for s in evals] == list(range(loops.PL_EVAL // loops.PL_BATCH))  # not the sanity check's
    for step, loss in zip(evals, result["val_losses"], strict=True):
        assert _names(step) == [sc.REGION_DATALOADER, sc.REGION_FORWARD]
        assert step.scalars["loss"] == pytest.approx(loss, rel=1e-5)
        assert step.scalars["samples"] == loops.PL_BATCH
    assert [a.name for a in rank.annotations] == ["sanity_check"]


def test_lightning_trainer_under_otelprof_run(tmp_path: Path) -> None:
    check_lightning(*_run_loop(tmp_path, "lightning", "plain"))


def test_lightning_trainer_given_the_callback_under_otelprof_run(tmp_path: Path, zero_code: Path) -> None:
    from otelprof.integrations.lightning import OtelprofCallback

    result = loops.lightning_trainer(str(tmp_path / "out"), [OtelprofCallback()])
    otelprof.shutdown()
    check_lightning(read_recording(zero_code).ranks[0], result)


def test_pytorch_lightning_trainer_under_otelprof_run(tmp_path: Path, zero_code: Path) -> None:
    """The standalone package's Trainer (``lightning`` installs it) gets the callback too."""
    result = loops.lightning_trainer(str(tmp_path / "out"), [], package="pytorch_lightning")
    otelprof.shutdown()
    check_lightning(read_recording(zero_code).ranks[0], result)


def test_lightning_trainer_with_the_explicit_callback(tmp_path: Path) -> None:
    from otelprof.integrations.lightning import OtelprofCallback

    session = otelprof.init(record_dir=str(tmp_path / "runs"), system_metrics=False)
    result = loops.lightning_trainer(str(tmp_path / "out"), [OtelprofCallback()])
    run_dir = session.run_dir
    otelprof.shutdown()
    check_lightning(read_recording(run_dir).ranks[0], result)


# ---------------------------------------------------------------------- accelerate
def check_accelerate(rank: RankRecording, result: dict[str, Any]) -> None:
    n = loops.ACC_ACCUMULATION
    assert result["updates"] == loops.ACC_SAMPLES // (loops.ACC_BATCH * n)
    assert [s.number for s in rank.steps] == list(range(result["updates"]))
    assert all(s.phase == "train" for s in rank.steps)
    losses = result["losses"]
    for i, step in enumerate(rank.steps):
        assert _names(step) == [sc.REGION_DATALOADER, sc.REGION_FORWARD, sc.REGION_BACKWARD] * n + [
            sc.REGION_OPTIMIZER]
        assert step.scalars["samples"] == loops.ACC_BATCH * n  # its own batches, not the one read ahead
        # the losses passed to accelerator.backward() (which divides them by n), averaged over the step
        assert step.scalars["loss"] == pytest.approx(sum(losses[n * i:n * i + n]) / n, rel=1e-6)
        assert step.scalars["learning_rate"] == 0.1


def test_accelerate_loop_under_otelprof_run(zero_code: Path) -> None:
    result = loops.accelerate_loop(explicit=False)  # (the subprocess runs above import accelerate under the hooks)
    otorch.uninstrument()
    otelprof.shutdown()
    check_accelerate(read_recording(zero_code).ranks[0], result)


@pytest.mark.parametrize("native", [True, False], ids=["c-hooks", "python-hooks"])
def test_accelerate_loop_with_the_explicit_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    if native:
        require_native()
    monkeypatch.setenv("OTELPROF_TORCH_NATIVE", "true" if native else "false")
    session = otelprof.init(record_dir=str(tmp_path / "runs"), system_metrics=False)
    result = loops.accelerate_loop(explicit=True)
    assert result["native_held_steps"] is native
    otorch.uninstrument()
    run_dir = session.run_dir
    otelprof.shutdown()
    check_accelerate(read_recording(run_dir).ranks[0], result)
