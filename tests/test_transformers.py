"""The Hugging Face ``Trainer`` callback on real (CPU) runs of a tiny BERT built from its config (no download)."""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch


def _require(module: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is not installed; .ci/run must install it (pip install -e '.[hf]')",
                        pytrace=False)
        pytest.skip(f"{module} not installed (pip install -e '.[hf]')", allow_module_level=True)


_require("transformers")
_require("accelerate")

from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import otelprof  # noqa: E402
from otelprof import semconv as sc  # noqa: E402
from otelprof.integrations import torch as otorch  # noqa: E402
from otelprof.integrations.transformers import OtelprofCallback  # noqa: E402
from otelprof.recording.ranks import RankRecording  # noqa: E402
from otelprof.recording.reader import read_recording  # noqa: E402
from tests.trainer_loops import Sentences  # noqa: E402

torch.set_num_threads(1)
_BACKWARD = torch.Tensor.backward
TRAIN_REGIONS = [sc.REGION_FORWARD, sc.REGION_BACKWARD, sc.REGION_OPTIMIZER]


@pytest.fixture(autouse=True)
def _uninstrument() -> Iterator[None]:
    yield
    otorch.uninstrument()


def _model() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, num_labels=2)
    return BertForSequenceClassification(config)


class Plain(torch.nn.Module):
    """Not a transformers model: no ``**kwargs``, so the Trainer divides its loss by the accumulation steps."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.EmbeddingBag(50, 16)
        self.head = torch.nn.Linear(16, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.head(self.embed(input_ids))
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def _trainer(tmp_path: Path, callback: OtelprofCallback, n: int = 64, model: torch.nn.Module | None = None,
             **kwargs: Any) -> Trainer:
    options: dict[str, Any] = {"per_device_train_batch_size": 8, "per_device_eval_batch_size": 8,
                               "num_train_epochs": 1, "learning_rate": 1e-3, "lr_scheduler_type": "constant",
                               "logging_steps": 1, "save_strategy": "no", "report_to": [], "use_cpu": True,
                               "disable_tqdm": True, "dataloader_num_workers": 0}
    options.update(kwargs)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), **options)
    return Trainer(model=model if model is not None else _model(), args=args, train_dataset=Sentences(n),
                   eval_dataset=Sentences(24, seed=1), callbacks=[callback])


def _only_run(record_dir: Path) -> RankRecording:
    [run_dir] = list(record_dir.iterdir())
    return read_recording(run_dir).ranks[0]


def _logged_losses(trainer: Trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_train_records_steps_regions_and_scalars(tmp_path: Path) -> None:
    callback = OtelprofCallback(record_dir=str(tmp_path / "runs"), system_metrics=False)
    trainer = _trainer(tmp_path, callback)
    trainer.train()
    assert otelprof.get_session() is None  # the callback started the session, so it shut it down
    assert torch.Tensor.backward is _BACKWARD  # and removed the otelprof.torch hooks it added
    rank = _only_run(tmp_path / "runs")
    assert [(s.phase, s.number) for s in rank.steps] == [("train", i) for i in range(8)]
    logged = _logged_losses(trainer)
    assert len(logged) == 8
    for step, loss in zip(rank.steps, logged):
        names = [a.name for a in step.annotations]
        assert [n for n in names if n != sc.REGION_DATALOADER] == TRAIN_REGIONS
        assert step.scalars["loss"] == pytest.approx(loss, rel=1e-4)  # what the Trainer logged for the step
        assert step.scalars["learning_rate"] == pytest.approx(1e-3)
        assert step.scalars["samples"] == 8
        assert step.scalars["grad_norm"] > 0
    # accelerate's loader runs one batch ahead: two fetches in the first step, none in the last
    assert [[a.name for a in s.annotations].count(sc.REGION_DATALOADER) for s in rank.steps] == [2] + [1] * 6 + [0]
    first = {a.name: a for a in rank.steps[1].annotations}
    assert rank.steps[1].start_ns == first["dataloader"].start_ns < first["forward"].start_ns


@pytest.mark.parametrize("kind", ["bert", "plain"])
def test_gradient_accumulation_is_one_step_per_optimizer_step(tmp_path: Path, kind: str) -> None:
    callback = OtelprofCallback(record_dir=str(tmp_path / "runs"), system_metrics=False)
    trainer = _trainer(tmp_path, callback, model=Plain() if kind == "plain" else None, gradient_accumulation_steps=4)
    trainer.train()
    assert trainer.model_accepts_loss_kwargs == (kind == "bert")  # then the Trainer does not divide its loss
    rank = _only_run(tmp_path / "runs")
    assert len(rank.steps) == 2 == trainer.state.global_step == len(_logged_losses(trainer))
    for step, loss in zip(rank.steps, _logged_losses(trainer)):
        names = [a.name for a in step.annotations]
        assert names.count(sc.REGION_FORWARD) == names.count(sc.REGION_BACKWARD) == 4
        assert names.count(sc.REGION_OPTIMIZER) == 1
        assert step.scalars["samples"] == 32
        assert step.scalars["loss"] == pytest.approx(loss, rel=1e-4)


def test_evaluation_during_and_after_training_gives_eval_steps(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path / "runs"), system_metrics=False)
    trainer = _trainer(tmp_path, OtelprofCallback(), n=32, eval_strategy="epoch")
    trainer.train()
    assert otelprof.get_session() is session  # a session the user started is left running
    metrics = trainer.evaluate()
    otelprof.shutdown()
    rank = _only_run(tmp_path / "runs")
    assert [(s.phase, s.number) for s in rank.steps] == [("train", i) for i in range(4)] + [
        ("eval", i) for i in range(6)]  # 24 / 8 batches, twice
    evals = rank.steps[4:]
    for i, step in enumerate(evals):
        # the first batch of an evaluation starts at its forward; later ones at the previous batch's end
        expected = [sc.REGION_FORWARD] if i % 3 == 0 else [sc.REGION_DATALOADER, sc.REGION_FORWARD]
        assert [a.name for a in step.annotations] == expected
        assert step.scalars["loss"] > 0 and step.scalars["samples"] == 8
    mean = sum(s.scalars["loss"] for s in evals[3:]) / 3
    assert metrics["eval_loss"] == pytest.approx(mean, rel=1e-4)
    eval_losses = [value for _, phase, name, value in rank.scalars if name == "loss" and phase == "eval"]
    assert eval_losses[-1] == pytest.approx(metrics["eval_loss"])
    assert [phase for _, phase in rank.phases] == ["train", "eval", "train", "eval", "train"]


def test_evaluate_alone_records_its_own_run(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, OtelprofCallback(record_dir=str(tmp_path / "runs"), system_metrics=False))
    metrics = trainer.evaluate()
    assert otelprof.get_session() is None  # started for the evaluation, shut down at its end
    rank = _only_run(tmp_path / "runs")
    assert [(s.phase, s.number) for s in rank.steps] == [("eval", i) for i in range(3)]
    assert [[a.name for a in s.annotations] for s in rank.steps] == [
        [sc.REGION_FORWARD], [sc.REGION_DATALOADER, sc.REGION_FORWARD], [sc.REGION_DATALOADER, sc.REGION_FORWARD]]
    assert sum(s.scalars["loss"] for s in rank.steps) / 3 == pytest.approx(metrics["eval_loss"], rel=1e-4)


def test_a_stop_request_stops_the_trainer(tmp_path: Path) -> None:
    callback = OtelprofCallback(record_dir=str(tmp_path / "runs"), system_metrics=False)
    trainer = _trainer(tmp_path, callback)

    class Stop(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 2:
                session = otelprof.get_session()
                assert session is not None
                session.request_stop("test")

    trainer.add_callback(Stop)
    trainer.train()
    assert trainer.state.global_step == 3
    assert len(_only_run(tmp_path / "runs").steps) == 3


def test_a_failing_callback_is_counted_turned_off_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    session = otelprof.init(record_dir=str(tmp_path / "runs"), system_metrics=False)
    assert isinstance(session, otelprof.Session)
    callback = OtelprofCallback()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("callback bug")

    monkeypatch.setattr(callback.tracker, "open", broken)
    trainer = _trainer(tmp_path, callback)
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        trainer.train()
    assert trainer.state.global_step == 8  # training went on
    assert not trainer.model._forward_pre_hooks and torch.Tensor.backward is _BACKWARD  # its hooks removed
    assert caplog.text.count("transformers callback failed in its callback part") == 1
    [errors] = [m for m in session.registry.collect() if m.name == sc.INTEGRATION_ERRORS.name]
    assert [(p.attributes["hook"], p.value) for p in errors.data.data_points] == [("transformers.callback", 1)]


def test_importing_otelprof_imports_no_framework() -> None:
    code = ("import sys, otelprof, otelprof.torch, otelprof.integrations\n"
            "frameworks = ('lightning', 'pytorch_lightning', 'transformers', 'accelerate')\n"
            "loaded = [m for m in frameworks if m in sys.modules]\n"
            "assert not loaded, loaded\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_instrument_takes_accelerate_prepared_objects(tmp_path: Path) -> None:
    """``accelerator.prepare()``'s optimizer (an Optimizer without Optimizer's state) and loader (whose
    ``__class__`` is a read-only property) are timed like plain ones; with gradient accumulation a step is
    one update, its samples summed over the micro-batches; uninstrument() gives the loader back its class."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = torch.nn.Linear(4, 2)
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 2)), batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
    prepared_type = type(loader)
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    otorch.uninstrument()
    assert type(loader) is prepared_type
    run_dir = session.run_dir
    otelprof.shutdown()
    steps = list(read_recording(run_dir).ranks[0].steps)
    assert len(steps) == 4
    micro = [sc.REGION_DATALOADER, sc.REGION_FORWARD, sc.REGION_BACKWARD]
    assert [[a.name for a in s.annotations] for s in steps] == [micro * 2 + [sc.REGION_OPTIMIZER]] * 4
    assert [s.scalars["samples"] for s in steps] == [16] * 4


def test_on_cuda_the_callbacks_regions_get_device_times(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward (the callback's hooks), backward and optimizer (through ``otelprof.torch``) get CUDA-event
    device times when the model is on the GPU (a fake GPU here); host times are as before."""
    from tests.test_cuda_timing import FakeGPU, _fake_cuda, device_times_by_step, queue_forward, train_device_times

    gpu = FakeGPU()
    _fake_cuda(monkeypatch, gpu)

    class OnGpu(Plain):
        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    labels: torch.Tensor) -> dict[str, torch.Tensor]:
            out = super().forward(input_ids, attention_mask, labels)
            queue_forward(gpu, out["loss"])
            return out

    class Finish(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            gpu.finish()  # as a loss.item() would make it

    callback = OtelprofCallback(record_dir=str(tmp_path / "runs"), system_metrics=False)
    trainer = _trainer(tmp_path, callback, model=OnGpu())
    trainer.add_callback(Finish())
    trainer.train()
    rank = _only_run(tmp_path / "runs")
    assert device_times_by_step(rank) == train_device_times(8, optimizer_ms=0)  # no kernel in the optimizer
    assert gpu.blocking == []  # never waited for the GPU
    for step in rank.steps:
        assert [a.name for a in step.annotations if a.name != sc.REGION_DATALOADER] == TRAIN_REGIONS
