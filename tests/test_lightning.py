"""The Lightning callback on real (CPU) ``Trainer.fit`` runs of a tiny module."""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset


def _require(module: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is not installed; .ci/run must install it (pip install -e '.[lightning]')",
                        pytrace=False)
        pytest.skip(f"{module} not installed (pip install -e '.[lightning]')", allow_module_level=True)


_require("lightning.pytorch")

import lightning.pytorch as pl  # noqa: E402

import otelprof  # noqa: E402
from otelprof import semconv as sc  # noqa: E402
from otelprof.integrations import torch as otorch  # noqa: E402
from otelprof.integrations.lightning import OtelprofCallback  # noqa: E402
from otelprof.recording.ranks import RankRecording  # noqa: E402
from otelprof.recording.reader import read_recording  # noqa: E402

torch.set_num_threads(1)
_DATALOADER_ITER = DataLoader.__iter__
_BACKWARD = torch.Tensor.backward
TRAIN_REGIONS = [sc.REGION_DATALOADER, sc.REGION_FORWARD, sc.REGION_BACKWARD, sc.REGION_OPTIMIZER]
EVAL_REGIONS = [sc.REGION_DATALOADER, sc.REGION_FORWARD]


@pytest.fixture(autouse=True)
def _uninstrument() -> Iterator[None]:
    yield
    otorch.uninstrument()


class Tiny(pl.LightningModule):
    def __init__(self, stop_at: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        self.losses: list[float] = []
        self.val_losses: list[float] = []
        self.stop_at = stop_at

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == self.stop_at:
            session = otelprof.get_session()
            assert session is not None
            session.request_stop("test")
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.val_losses.append(float(loss))
        return loss

    def test_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.validation_step(batch, batch_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _loader(n: int, batch: int = 16) -> DataLoader[Any]:
    generator = torch.Generator().manual_seed(n)
    return DataLoader(TensorDataset(torch.randn(n, 8, generator=generator), torch.randint(0, 2, (n,),
                                                                                          generator=generator)),
                      batch_size=batch)


def _trainer(tmp_path: Path, callback: OtelprofCallback, **kwargs: Any) -> pl.Trainer:
    options: dict[str, Any] = {"max_epochs": 1, "accelerator": "cpu", "devices": 1, "logger": False,
                               "enable_checkpointing": False, "enable_progress_bar": False,
                               "enable_model_summary": False, "num_sanity_val_steps": 0,
                               "default_root_dir": str(tmp_path / "lightning")}
    options.update(kwargs)
    return pl.Trainer(callbacks=[callback], **options)


def _only_run(record_dir: Path) -> RankRecording:
    [run_dir] = list(record_dir.iterdir())
    return read_recording(run_dir).ranks[0]


def test_fit_records_train_and_eval_steps_regions_and_scalars(tmp_path: Path) -> None:
    callback = OtelprofCallback(record_dir=str(tmp_path / "runs"), system_metrics=False)
    module = Tiny()
    _trainer(tmp_path, callback, num_sanity_val_steps=2).fit(module, _loader(128), _loader(64))
    assert otelprof.get_session() is None  # the callback started the session, so it shut it down
    assert DataLoader.__iter__ is _DATALOADER_ITER and torch.Tensor.backward is _BACKWARD  # hooks removed
    rank = _only_run(tmp_path / "runs")
    train = [s for s in rank.steps if s.phase == "train"]
    evals = [s for s in rank.steps if s.phase == "eval"]
    assert [s.number for s in train] == list(range(8))  # 128 / 16, one step per optimizer step
    assert [s.number for s in evals] == list(range(4))  # the sanity check's batches are not steps
    for step, loss in zip(train, module.losses):
        assert [a.name for a in step.annotations] == TRAIN_REGIONS
        assert step.scalars["loss"] == pytest.approx(loss, rel=1e-6)
        assert step.scalars["learning_rate"] == 0.05
        assert step.scalars["samples"] == 16
        a = {x.name: x for x in step.annotations}
        assert step.start_ns == a["dataloader"].start_ns  # the step starts at its fetch
        assert a["dataloader"].start_ns < a["forward"].start_ns < a["backward"].start_ns < a["optimizer"].start_ns
        assert a["optimizer"].start_ns + a["optimizer"].duration_ns <= step.end_ns
    for step, loss in zip(evals, module.val_losses[2:]):
        assert [a.name for a in step.annotations] == EVAL_REGIONS
        assert step.scalars["loss"] == pytest.approx(loss, rel=1e-6)
        assert step.scalars["samples"] == 16
    assert train[-1].end_ns <= evals[0].start_ns  # validation runs after the last training step
    assert [a.name for a in rank.annotations] == ["sanity_check"]
    assert [phase for _, phase in rank.phases] == ["train", "eval", "train"]


def test_gradient_accumulation_is_one_step_per_optimizer_step(tmp_path: Path) -> None:
    callback = OtelprofCallback(record_dir=str(tmp_path / "runs"), system_metrics=False, grad_norm=True)
    module = Tiny()
    _trainer(tmp_path, callback, accumulate_grad_batches=4, limit_val_batches=0).fit(module, _loader(128))
    rank = _only_run(tmp_path / "runs")
    assert len(rank.steps) == 2
    for i, step in enumerate(rank.steps):
        names = [a.name for a in step.annotations]
        assert names.count(sc.REGION_DATALOADER) == names.count(sc.REGION_FORWARD) == 4
        assert names.count(sc.REGION_BACKWARD) == 4 and names.count(sc.REGION_OPTIMIZER) == 1
        assert step.scalars["samples"] == 64
        # Lightning's own accounting: each batch's loss / accumulate_grad_batches, summed.
        assert step.scalars["loss"] == pytest.approx(sum(module.losses[4 * i: 4 * i + 4]) / 4, rel=1e-5)
        assert step.scalars["grad_norm"] > 0


def test_a_session_the_user_started_is_used_and_left_running(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path / "runs"), system_metrics=False)
    _trainer(tmp_path, OtelprofCallback(), limit_val_batches=0).fit(Tiny(), _loader(64))
    assert otelprof.get_session() is session
    otelprof.shutdown()
    assert len(_only_run(tmp_path / "runs").steps) == 4


def test_validate_and_test_outside_fit_are_eval_and_test_steps(tmp_path: Path) -> None:
    callback = OtelprofCallback(record_dir=str(tmp_path / "runs"), system_metrics=False, shutdown=False)
    trainer = _trainer(tmp_path, callback)
    module = Tiny()
    trainer.validate(module, _loader(32))
    trainer.test(module, _loader(48))
    otelprof.shutdown()
    rank = _only_run(tmp_path / "runs")
    assert [(s.phase, s.number) for s in rank.steps] == [("eval", 0), ("eval", 1), ("test", 0), ("test", 1),
                                                         ("test", 2)]
    assert all([a.name for a in s.annotations] == EVAL_REGIONS for s in rank.steps)


def test_a_stop_request_stops_the_trainer_at_the_step_boundary(tmp_path: Path) -> None:
    callback = OtelprofCallback(record_dir=str(tmp_path / "runs"), system_metrics=False)
    module = Tiny(stop_at=2)
    _trainer(tmp_path, callback, limit_val_batches=0).fit(module, _loader(128))
    assert len(module.losses) == 3
    assert len(_only_run(tmp_path / "runs").steps) == 3


def test_a_failing_callback_is_counted_turned_off_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    session = otelprof.init(record_dir=str(tmp_path / "runs"), system_metrics=False)
    assert isinstance(session, otelprof.Session)
    callback = OtelprofCallback()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("callback bug")

    monkeypatch.setattr(callback.tracker, "begin", broken)
    module = Tiny()
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        _trainer(tmp_path, callback, limit_val_batches=0).fit(module, _loader(64))
    assert len(module.losses) == 4  # training went on
    assert DataLoader.__iter__ is _DATALOADER_ITER and torch.Tensor.backward is _BACKWARD  # all undone
    assert caplog.text.count("lightning callback failed in its callback part") == 1
    [errors] = [m for m in session.registry.collect() if m.name == sc.INTEGRATION_ERRORS.name]
    assert [(p.attributes["hook"], p.value) for p in errors.data.data_points] == [("lightning.callback", 1)]
    otelprof.shutdown()
    assert len(_only_run(tmp_path / "runs").steps) == 1  # the step open at the failure is closed, no more


def test_eval_batches_from_a_plain_iterable_get_the_wait_before_them(tmp_path: Path) -> None:
    callback = OtelprofCallback(record_dir=str(tmp_path / "runs"), system_metrics=False)
    class Batches:  # an iterable that is not a DataLoader: nothing to time
        def __init__(self) -> None:
            self.batches = list(_loader(48))

        def __iter__(self) -> Iterator[Any]:
            return iter(self.batches)

        def __len__(self) -> int:
            return len(self.batches)

    _trainer(tmp_path, callback).validate(Tiny(), Batches())
    rank = _only_run(tmp_path / "runs")
    assert [(s.phase, [a.name for a in s.annotations]) for s in rank.steps] == [("eval", EVAL_REGIONS)] * 3
    for step in rank.steps:
        assert step.start_ns == step.annotations[0].start_ns  # from the previous batch's end


def test_combining_with_torch_hooks_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    otelprof.init(record_dir=str(tmp_path / "runs"), system_metrics=False)
    module = Tiny()
    otorch.instrument(model=module)
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        _trainer(tmp_path, OtelprofCallback(), limit_val_batches=0).fit(module, _loader(32))
    assert "the lightning callback both time this run" in caplog.text
    otelprof.shutdown()
    assert len(_only_run(tmp_path / "runs").steps) == 2  # steps are never counted twice


def test_on_cuda_the_callbacks_regions_get_device_times(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The callback's forward and optimizer regions, and the backward it times through ``otelprof.torch``,
    get CUDA-event device times once ``on_train_start`` shows a model on the GPU (a fake GPU here)."""
    from tests.test_cuda_timing import FakeGPU, _fake_cuda, device_times_by_step, queue_forward, train_device_times

    gpu = FakeGPU()
    _fake_cuda(monkeypatch, gpu)

    class OnGpu(Tiny):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return queue_forward(gpu, self.net(x))

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            gpu.finish()  # as a loss.item() would make it

    callback = OtelprofCallback(record_dir=str(tmp_path / "runs"), system_metrics=False)
    _trainer(tmp_path, callback).fit(OnGpu(), _loader(64))
    rank = _only_run(tmp_path / "runs")
    assert device_times_by_step(rank) == train_device_times(4, optimizer_ms=0)  # no kernel in the optimizer
    assert gpu.blocking == []  # never waited for the GPU
    assert [[a.name for a in s.annotations] for s in rank.steps] == [TRAIN_REGIONS] * 4  # host times as before
