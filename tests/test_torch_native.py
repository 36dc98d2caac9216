"""The PyTorch integration's C hot path (``_torch_native.c``): the same recording as the Python hooks in every
loop shape, the hand-over to Python when something else needs the step, and failures that never reach
the training loop."""

from __future__ import annotations

import copy
import inspect
import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import otelprof
from otelprof import semconv as sc
from otelprof.integrations import torch as otorch
from otelprof.integrations import torch_backward, torch_state
from otelprof.recording.ranks import RankRecording
from otelprof.runtime import hotpath
from tests.test_torch import REGIONS, _recording, require_native

torch.set_num_threads(1)
Parts = tuple[torch.nn.Module, torch.optim.Optimizer, DataLoader[Any]]


@pytest.fixture(autouse=True)
def _uninstrument() -> Iterator[None]:
    yield
    otorch.uninstrument()


def _parts(n: int = 64) -> Parts:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(TensorDataset(torch.randn(n, 8), torch.randint(0, 2, (n,))), batch_size=16)
    return model, optimizer, loader


def _iteration(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def plain(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader[Any]) -> None:
    for _ in range(2):
        for x, y in loader:
            _iteration(model, optimizer, x, y)


def evaluation(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader[Any]) -> None:
    plain(model, optimizer, loader)
    model.eval()
    with torch.no_grad():
        for x, _ in loader:
            model(x)
    model.train()
    plain(model, optimizer, loader)


def accumulation(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader[Any]) -> None:
    for i, (x, y) in enumerate(loader):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if i % 2 == 1:
            optimizer.step()
            optimizer.zero_grad()


def user_calls(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader[Any]) -> None:
    """The hot-path API inside automatic steps: each call hands the step over first."""
    for i, (x, y) in enumerate(loader):
        if i == 0:
            otelprof.record("tokens", 128)
        with otelprof.annotate("loss") if i == 1 else _nothing():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        if i == 2:
            otelprof.annotation_begin("custom")
        optimizer.zero_grad()
        loss.backward()
        if i == 2:
            otelprof.annotation_end("custom")
        optimizer.step()
    for x, y in loader:  # a step the user marks inside an automatic one (opened by the fetch)
        with otelprof.step():
            _iteration(model, optimizer, x, y)


def phases_and_windows(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader[Any]) -> None:
    """A phase switch, and a profiler window (step-begin callbacks) over two steps."""
    with otelprof.phase("warmup"):
        plain(model, optimizer, loader)
    otorch.profile_window(hotpath.next_step_number() + 1, 2)
    plain(model, optimizer, loader)


def forward_inside_forward(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                           loader: DataLoader[Any]) -> None:
    """Two instrumented models, one calling the other: nested regions."""
    outer = _Outer(model)
    otorch.instrument(model=outer)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(outer(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


class _Outer(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 1.0


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _shape(rank: RankRecording) -> Any:
    """What the recording holds, without times: steps (phase, number, regions with depths, scalars)."""
    steps = [(s.phase, s.number, [(a.name, a.depth) for a in s.annotations],
              {k: (round(v, 4) if isinstance(v, float) else v) for k, v in sorted(s.scalars.items())})
             for s in rank.steps]
    return steps, sorted(a.name for a in rank.annotations)


def _record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool, loop: Callable[..., None]) -> Any:
    monkeypatch.setenv("OTELPROF_TORCH_NATIVE", "true" if native else "false")
    # No periodic window (a slow machine reaches its 5 s start): a window hands the C hooks' steps to Python.
    session = otelprof.init(record_dir=str(tmp_path / ("native" if native else "python")), system_metrics=False,
                            profile_every=0)
    model, optimizer, loader = _parts()
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    assert (inst.native is not None) is native
    loop(model, optimizer, loader)
    if native:  # the C hooks held steps, and were still on at the end
        assert inst.native.enabled and inst.native.number > 0
    otorch.uninstrument()
    return _shape(_recording(session))


@pytest.mark.parametrize("loop", [plain, evaluation, accumulation, user_calls, phases_and_windows,
                                  forward_inside_forward], ids=lambda f: f.__name__)
def test_the_c_hooks_record_what_the_python_hooks_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     loop: Callable[..., None]) -> None:
    require_native()
    native = _record(tmp_path, monkeypatch, True, loop)
    python = _record(tmp_path, monkeypatch, False, loop)
    assert native == python
    assert native[0], "the loop recorded no steps"


def _session(tmp_path: Path, **kwargs: Any) -> Any:
    require_native()
    kwargs.setdefault("profile_every", 0)  # windows are tested on their own; here they would take the steps over
    return otelprof.init(record_dir=str(tmp_path), system_metrics=False, torch_native=True, **kwargs)


def test_the_plain_step_is_held_in_c_until_optimizer_step(tmp_path: Path) -> None:
    _session(tmp_path)
    model, optimizer, loader = _parts()
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    plain(model, optimizer, loader)  # the first forward decides there is no device timer: C from step 1
    x, y = next(iter(loader))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    assert inst.native.open and hotpath._tls.step is None and hotpath._native[0] is not None
    optimizer.step()
    assert not inst.native.open and hotpath._native[0] is None
    assert inst.native.number == 8 and hotpath.next_step_number() == 9


def test_a_hot_path_call_hands_the_step_over_with_what_it_holds(tmp_path: Path) -> None:
    session = _session(tmp_path)
    model, optimizer, loader = _parts()
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    plain(model, optimizer, loader)
    x, y = next(iter(loader))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    otelprof.record("note", 1)
    step = hotpath._tls.step
    assert not inst.native.open and step is inst.auto.current and step.number == 8
    assert [a[0] for a in step.annotations] == [sc.REGION_DATALOADER, sc.REGION_FORWARD]
    assert step.scalars == {"samples": 16, "note": 1}
    loss.backward()
    optimizer.step()
    assert hotpath._tls.step is None
    rank = _recording(session)
    assert [a.name for a in rank.steps[-1].annotations] == REGIONS
    assert rank.steps[-1].scalars["note"] == 1 and rank.steps[-1].scalars["loss"] > 0


def test_a_region_open_at_the_hand_over_ends_in_the_python_step(tmp_path: Path) -> None:
    """record() inside the model's forward: the forward region began in C and ends in the StepContext."""
    session = _session(tmp_path)

    class Noting(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            otelprof.record("inside", 1)
            return self.linear(x)

    model = Noting()
    _, _, loader = _parts()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    plain(model, optimizer, loader)
    rank = _recording(session)
    assert len(rank.steps) == 8 and not rank.annotations
    assert all([(a.name, a.depth) for a in s.annotations] == [(name, 0) for name in REGIONS] for s in rank.steps)
    assert all(s.scalars["inside"] == 1 and s.scalars["samples"] == 16 for s in rank.steps)


def test_a_failure_in_the_c_path_turns_it_off_and_training_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from tests.test_catalog import _scrape

    session = _session(tmp_path, metrics_exporters=("prometheus",), prometheus_port=0)
    model, optimizer, loader = _parts()
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    plain(model, optimizer, loader)
    assert inst.native.enabled
    optimizer.param_groups[0]["lr"] = _BadRate(0.05)  # float() on it raises: in C, then in the Python hook
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        plain(model, optimizer, loader)
    assert not inst.native.enabled
    assert "C hot path failed" in caplog.text
    errors = [line for line in _scrape(session).splitlines()
              if line.startswith(sc.INTEGRATION_ERRORS.prometheus_name) and f'hook="{torch_state.HOOK_NATIVE}"' in line]
    assert len(errors) == 1 and float(errors[0].rsplit(" ", 1)[1]) == 1
    steps = _recording(session).steps
    assert len(steps) >= 15  # the step open in C when it failed is dropped; the Python hooks record the rest


class _BadRate(float):
    """A learning rate that is not a plain float and cannot become one."""

    def __float__(self) -> float:
        raise ValueError("no rate")


def test_a_step_boundary_callback_may_stop_training_from_the_c_path(tmp_path: Path) -> None:
    _session(tmp_path)
    model, optimizer, loader = _parts()
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    plain(model, optimizer, loader)

    def stop() -> None:
        raise hotpath.StopTraining("asked")

    x, y = next(iter(loader))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    hotpath._step_boundary.append(stop)
    with pytest.raises(hotpath.StopTraining):
        optimizer.step()
    assert hotpath._native[0] is None and not hotpath._step_boundary


def test_uninstrument_mid_step_ends_the_step_the_c_hooks_hold(tmp_path: Path) -> None:
    session = _session(tmp_path)
    model, optimizer, loader = _parts()
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    plain(model, optimizer, loader)
    x, y = next(iter(loader))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    otorch.uninstrument()
    assert hotpath._native[0] is None and hotpath._tls.step is None
    assert type(torch.Tensor.backward).__name__ == "function"
    steps = _recording(session).steps
    assert len(steps) == 9 and [a.name for a in steps[-1].annotations] == REGIONS[:3]


def test_a_loop_on_another_thread_is_held_in_c_there(tmp_path: Path) -> None:
    session = _session(tmp_path)
    model, optimizer, loader = _parts()
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    noted = threading.Event()

    def train() -> None:
        plain(model, optimizer, loader)
        x, y = next(iter(loader))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        otelprof.record("main-thread", 0)  # while the main thread records on its own
        noted.wait(5)
        loss.backward()
        optimizer.step()

    worker = threading.Thread(target=train)
    worker.start()
    while not (inst.native.open or not worker.is_alive()):
        pass
    otelprof.record("from-main", 1)  # another thread's call leaves the worker's step alone
    noted.set()
    worker.join()
    rank = _recording(session)
    assert len(rank.steps) == 9 and all([a.name for a in s.annotations] == REGIONS for s in rank.steps)
    assert rank.steps[-1].scalars["main-thread"] == 0


def test_the_c_wrappers_look_like_what_they_wrap(tmp_path: Path) -> None:
    _session(tmp_path)
    model, optimizer, loader = _parts()
    original = type(model).forward
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    assert type(type(model).__dict__["forward"].timed).__name__ == "Forward"  # behind what torch.compile traces
    assert inspect.signature(model.forward) == inspect.signature(original.__get__(model))
    assert torch.Tensor.backward.__doc__ == torch_backward._original_backward.__doc__  # type: ignore[union-attr]
    assert torch.Tensor.backward.__name__ == "backward"
    iterator = iter(loader)
    assert len(iterator) == 4 and iterator._num_yielded == 0  # the loader iterator's length and attributes
    hooks = list(optimizer._optimizer_step_pre_hooks.values())
    assert type(hooks[0]).__name__ == "OptimizerHook"
    assert copy.deepcopy(hooks[0]) is hooks[0] and copy.copy(hooks[0]) is hooks[0]  # copied as functions are
    assert copy.deepcopy(optimizer).param_groups[0]["lr"] == 0.05


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_a_full_queue_drops_and_counts_steps_on_both_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           native: bool) -> None:
    """The C hooks keep closed steps in a ring with a marker per step in the recorder's queue: a full queue
    drops the step and counts it, as for the Python hooks' records, and the rest keep their order."""
    if native:
        require_native()
    monkeypatch.setenv("OTELPROF_TORCH_NATIVE", "true" if native else "false")
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, queue_size=64, flush_interval=10.0)
    model, optimizer, loader = _parts(n=16 * 100)
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    plain(model, optimizer, loader)  # 200 steps, nothing processed meanwhile
    assert session.recorder.queue_dropped == 200 - 64
    assert not native or inst.native.number >= 199  # the C hooks held them (the last fetch opened one more)
    otorch.uninstrument()
    steps = _recording(session).steps
    assert [s.number for s in steps] == list(range(64))
    assert all([a.name for a in s.annotations] == REGIONS and s.scalars["samples"] == 16 for s in steps)


def test_steps_waiting_for_the_recorder_keep_their_order_as_the_rings_grow(tmp_path: Path) -> None:
    session = _session(tmp_path, flush_interval=10.0)
    model, optimizer, loader = _parts(n=16 * 700)
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    plain(model, optimizer, loader)  # 1,400 steps before the recorder processes any: the rings double 3 times
    assert len(session.recorder.queue) == 1400 and session.recorder.queue_dropped == 0
    otorch.uninstrument()
    steps = _recording(session).steps
    assert [s.number for s in steps] == list(range(1400))
    assert all([a.name for a in s.annotations] == REGIONS and s.scalars["samples"] == 16 for s in steps)
    assert all(s.start_ns <= a.start_ns and a.start_ns + a.duration_ns <= s.end_ns
               for s in steps for a in s.annotations)
    assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(steps))
