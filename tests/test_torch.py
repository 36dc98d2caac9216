"""The PyTorch integration on a real (CPU) training loop."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

import otelprof
from otelprof import semconv as sc
from otelprof.integrations import torch as otorch
from otelprof.integrations.torch_profiler import gpu_activity, kernel_precision
from otelprof.recording import schema
from otelprof.recording.ranks import RankRecording
from otelprof.recording.reader import read_recording

torch.set_num_threads(1)
REGIONS = [sc.REGION_DATALOADER, sc.REGION_FORWARD, sc.REGION_BACKWARD, sc.REGION_OPTIMIZER]


@pytest.fixture(autouse=True, params=["native", "python"])
def hot_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every test runs with the hooks in C (where the extension is built) and with the Python hooks alone."""
    if request.param == "native":
        require_native()
    monkeypatch.setenv("OTELPROF_TORCH_NATIVE", "true" if request.param == "native" else "false")
    yield request.param
    otorch.uninstrument()


def require_native() -> None:
    """The C extension is built by ``pip install -e .``; CI must have it, a local checkout may not."""
    if otorch._native is None:
        if os.environ.get("CI"):
            pytest.fail("the C extension otelprof.integrations._torch_native is not built")
        pytest.skip("the C extension otelprof.integrations._torch_native is not built (pip install -e .)")


def _parts(batch: int = 16, n: int = 128) -> tuple[torch.nn.Module, torch.optim.Optimizer, DataLoader[Any]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(TensorDataset(torch.randn(n, 8), torch.randint(0, 2, (n,))), batch_size=batch)
    return model, optimizer, loader


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader[Any],
           epochs: int = 1) -> list[float]:
    losses = []
    for _ in range(epochs):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    return losses


def _recording(session: Any) -> RankRecording:
    run_dir = session.run_dir
    otelprof.shutdown()
    return read_recording(run_dir).ranks[0]


def test_one_line_gives_steps_regions_and_scalars(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader, grad_norm=True)
    losses = _train(model, optimizer, loader, epochs=2)
    rank = _recording(session)
    assert len(rank.steps) == 16  # 2 epochs x 8 batches, one step per optimizer.step()
    for step, loss in zip(rank.steps, losses):
        assert [a.name for a in step.annotations] == REGIONS
        assert step.scalars["loss"] == pytest.approx(loss)
        assert step.scalars["samples"] == 16
        assert step.scalars["learning_rate"] == 0.05
        assert step.scalars["grad_norm"] > 0
        a = {x.name: x for x in step.annotations}
        assert a["dataloader"].start_ns < a["forward"].start_ns < a["backward"].start_ns < a["optimizer"].start_ns
        assert step.start_ns <= a["dataloader"].start_ns and a["optimizer"].start_ns + a["optimizer"].duration_ns \
            <= step.end_ns


def test_grad_norm_matches_torch(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    otorch.instrument(model=model, optimizer=optimizer, grad_norm=True)
    x, y = next(iter(loader))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    expected = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
    optimizer.step()
    rank = _recording(session)
    assert rank.steps[0].scalars["grad_norm"] == pytest.approx(expected, rel=1e-5)


def test_evaluation_iterations_become_eval_steps(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    _train(model, optimizer, loader)
    model.eval()
    with torch.no_grad():
        for x, _ in loader:
            model(x)
    rank = _recording(session)
    phases = [(s.phase, s.number) for s in rank.steps]
    assert phases == [("train", i) for i in range(8)] + [("eval", i) for i in range(8)]
    assert [a.name for a in rank.steps[-1].annotations] == [sc.REGION_DATALOADER, sc.REGION_FORWARD]


def test_gradient_accumulation_is_one_step_per_update(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    for i, (x, y) in enumerate(loader):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if i % 4 == 3:
            optimizer.step()
            optimizer.zero_grad()
    rank = _recording(session)
    assert len(rank.steps) == 2
    assert [a.name for a in rank.steps[0].annotations].count(sc.REGION_FORWARD) == 4
    assert rank.steps[0].scalars["samples"] == 64  # the four micro-batches' samples: throughput per update


def test_without_a_hooked_optimizer_a_step_runs_from_fetch_to_fetch(tmp_path: Path) -> None:
    """Data loader (and model) only: no optimizer.step() ends steps, so each fetch does; nothing piles up."""
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    otorch.instrument(model=model, dataloader=loader)
    _train(model, optimizer, loader)
    otorch.uninstrument()
    _, _, only_loader = _parts()
    otorch.instrument(dataloader=only_loader)
    for _ in only_loader:
        pass
    rank = _recording(session)
    trained, fetched = rank.steps[:8], rank.steps[8:]
    assert [[a.name for a in s.annotations] for s in trained] == [REGIONS[:3]] * 8
    assert [[a.name for a in s.annotations] for s in fetched] == [[sc.REGION_DATALOADER]] * 8


def test_an_optimizer_calling_its_base_step_is_timed_once(tmp_path: Path) -> None:
    """Each class's step() is wrapped by torch: a subclass calling super().step() fires the hooks twice."""
    class Clipped(torch.optim.SGD):
        def step(self, closure: Any = None) -> Any:  # type: ignore[override]
            return super().step(closure)

    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, _, loader = _parts()
    torch.optim.SGD(model.parameters(), lr=0.05)  # an instance of the base class wraps SGD.step too
    optimizer = Clipped(model.parameters(), lr=0.05)
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    _train(model, optimizer, loader)
    rank = _recording(session)
    assert len(rank.steps) == 8
    assert all([a.name for a in s.annotations] == REGIONS for s in rank.steps)


def test_a_step_that_never_ends_keeps_a_bounded_list(tmp_path: Path) -> None:
    from otelprof.runtime import hotpath
    from tests.test_catalog import _scrape

    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, metrics_exporters=("prometheus",),
                            prometheus_port=0)
    with otelprof.step() as step:
        for _ in range(hotpath.MAX_STEP_ANNOTATIONS + 10):
            with otelprof.annotate("layer"):
                pass
        assert len(step.annotations) == hotpath.MAX_STEP_ANNOTATIONS
    label = f'exporter="{sc.DROPPED_STEP_REGIONS}"'
    lines = [line for line in _scrape(session).splitlines()
             if line.startswith(sc.EXPORTER_DROPPED.prometheus_name) and label in line]
    assert len(lines) == 1 and float(lines[0].rsplit(" ", 1)[1]) == 10
    rank = _recording(session)
    assert len(rank.steps[0].annotations) == hotpath.MAX_STEP_ANNOTATIONS and not rank.annotations


def test_the_hooks_keep_the_region_bound_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from otelprof.runtime import hotpath

    monkeypatch.setattr(hotpath, "MAX_STEP_ANNOTATIONS", 2)
    dropped = hotpath.dropped_regions
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    _train(model, optimizer, loader)
    assert hotpath.dropped_regions == dropped + 2 * 8  # backward and optimizer of each step
    rank = _recording(session)
    assert [[a.name for a in s.annotations] for s in rank.steps] == [REGIONS[:2]] * 8
    assert all(s.scalars["learning_rate"] == 0.05 and s.scalars["samples"] == 16 for s in rank.steps)


def test_backward_arguments_are_passed_on(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    otorch.instrument(model=model, optimizer=optimizer)
    x, y = next(iter(loader))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward(retain_graph=True)
    loss.backward(None, False)  # a second pass needs the graph the first one kept
    optimizer.step()
    rank = _recording(session)
    [step] = rank.steps
    assert [a.name for a in step.annotations] == [sc.REGION_FORWARD, sc.REGION_BACKWARD, sc.REGION_BACKWARD,
                                                  sc.REGION_OPTIMIZER]


def test_automatic_steps_always_end(tmp_path: Path) -> None:
    """Without a hooked optimizer the event that opened a step starts the next; with one, an eval forward does."""
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    otorch.instrument(model=model)  # the model only: a step per forward (with its backward)
    _train(model, optimizer, loader)
    otorch.uninstrument()
    model2, optimizer2, loader2 = _parts()
    otorch.instrument(model=model2, optimizer=optimizer2)
    _train(model2, optimizer2, loader2)
    model2.eval()
    with torch.no_grad():
        for x, _ in loader2:  # no data-loader hook: each eval forward is a step
            model2(x)
    otorch.uninstrument()  # ends the last one
    rank = _recording(session)
    names = [[a.name for a in s.annotations] for s in rank.steps]
    assert names[:8] == [[sc.REGION_FORWARD, sc.REGION_BACKWARD]] * 8
    assert names[8:16] == [REGIONS[1:]] * 8
    assert [(s.phase, len(n)) for s, n in zip(rank.steps[16:], names[16:])] == [("eval", 1)] * 8


def test_user_marked_steps_get_the_regions_and_no_auto_steps(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    otorch.instrument(model=model, optimizer=optimizer)
    for x, y in loader:
        with otelprof.step():
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    rank = _recording(session)
    assert len(rank.steps) == 8
    assert [a.name for a in rank.steps[0].annotations] == [sc.REGION_FORWARD, sc.REGION_BACKWARD,
                                                           sc.REGION_OPTIMIZER]


class _SlowDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.002)
        return torch.randn(8), torch.tensor(index % 2)


def test_input_bound_steps_show_a_high_wait_ratio(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    assert isinstance(session, otelprof.Session)
    model, optimizer, _ = _parts()
    loader = DataLoader(_SlowDataset(), batch_size=16)
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    _train(model, optimizer, loader)
    metrics = {m.name: m for m in session.registry.collect()}
    [ratio] = metrics[sc.DATALOADER_WAIT_RATIO.name].data.data_points
    assert ratio.count == 4 and ratio.sum / ratio.count > 0.5  # 16 x 2 ms of loading vs a tiny model
    [wait] = metrics[sc.DATALOADER_WAIT.name].data.data_points
    assert wait.sum > 4 * 16 * 0.002 * 0.9
    [workers] = metrics[sc.DATALOADER_WORKERS.name].data.data_points
    assert workers.value == 0


def test_instrumenting_twice_is_idempotent_and_uninstrument_removes_everything(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    first = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    second = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    assert first is second
    _train(model, optimizer, loader)
    otorch.uninstrument()
    assert type(loader) is DataLoader
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    _train(model, optimizer, loader)  # not recorded any more
    rank = _recording(session)
    assert len(rank.steps) == 8
    assert all([a.name for a in s.annotations] == REGIONS for s in rank.steps)


def test_backward_patch_is_restored() -> None:
    original = torch.Tensor.backward
    otorch.instrument()
    assert torch.Tensor.backward is not original
    otorch.uninstrument()
    assert torch.Tensor.backward is original


def test_a_failing_hook_is_removed_counted_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from otelprof._log import reset_warnings

    reset_warnings()
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    assert isinstance(session, otelprof.Session)
    model, optimizer, loader = _parts()
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)

    class BrokenTimer:
        def poll(self) -> None:
            raise RuntimeError("hook bug")

    monkeypatch.setattr(inst, "device_timer", BrokenTimer())  # the forward pre-hook raises
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        losses = _train(model, optimizer, loader)
    assert len(losses) == 8
    assert type(model) is torch.nn.Sequential  # the timed forward removed
    assert caplog.text.count("forward hook failed") == 1
    [errors] = [m for m in session.registry.collect() if m.name == sc.INTEGRATION_ERRORS.name]
    assert errors.data.data_points[0].value == 1
    rank = _recording(session)
    assert len(rank.steps) == 8
    assert sc.REGION_BACKWARD in [a.name for a in rank.steps[-1].annotations]


def test_objects_without_the_expected_structure_warn(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    from otelprof._log import reset_warnings

    class Unhookable(torch.nn.Module):
        """A forward of its own (timed with hooks, not a subclass) and no hooks."""

        def __init__(self) -> None:
            super().__init__()
            self.forward = lambda x: x

        def register_forward_pre_hook(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("no hooks here")

    reset_warnings()
    otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        otorch.instrument(model=object(), optimizer=object(), dataloader=42)
        otorch.instrument(model=Unhookable())
    assert "expects a torch.nn.Module" in caplog.text
    assert "expects a torch.optim.Optimizer" in caplog.text
    assert "not iterable" in caplog.text
    assert "cannot instrument the model Unhookable (RuntimeError: no hooks here)" in caplog.text


def test_an_instrumented_model_pickles_and_copies_as_itself_without_the_instrumentation(tmp_path: Path) -> None:
    """The timed forward is a subclass of the model's class: ``torch.save`` and ``copy.deepcopy`` (EMA copies)
    work, the copies are of the original class, and uninstrument() gives the model its class back."""
    import copy
    import io

    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    assert type(model) is not torch.nn.Sequential and isinstance(model, torch.nn.Sequential)
    assert type(model).__name__ == "Sequential" and repr(model).startswith("Sequential(")
    assert not model._forward_pre_hooks  # torch's fast call path: no module hooks
    ema = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(ema) is torch.nn.Sequential and type(loaded) is torch.nn.Sequential
    _train(model, optimizer, loader)
    x = torch.randn(4, 8)
    with otelprof.step():
        ema(x), loaded(x)  # not timed: the copies have no instrumentation
    otorch.uninstrument()
    assert type(model) is torch.nn.Sequential
    ema.load_state_dict(model.state_dict())
    assert torch.equal(ema(x), model(x))
    rank = _recording(session)
    assert len(rank.steps) == 9 and not rank.steps[-1].annotations
    assert all([a.name for a in s.annotations] == REGIONS for s in rank.steps[:8])


def test_a_model_with_its_own_forward_attribute_is_timed_with_hooks(tmp_path: Path) -> None:
    """A forward set on the instance (as some wrappers do) would bypass a subclass: module hooks time it."""
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    model.forward = model.forward  # type: ignore[method-assign]
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    assert type(model) is torch.nn.Sequential and model._forward_pre_hooks and model._forward_hooks
    _train(model, optimizer, loader)
    otorch.uninstrument()
    assert not model._forward_pre_hooks and not model._forward_hooks
    rank = _recording(session)
    assert all([a.name for a in s.annotations] == REGIONS for s in rank.steps)


def test_a_forward_that_raises_passes_the_error_on_and_closes_its_region(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    with otelprof.step() as step:
        with pytest.raises(RuntimeError):
            model(torch.randn(4, 3))  # wrong width: torch's own error reaches the caller
        assert step.depth == 0
    with otelprof.step():
        model(torch.randn(4, 8))
    rank = _recording(session)
    assert [[(a.name, a.depth) for a in s.annotations] for s in rank.steps] == [[(sc.REGION_FORWARD, 0)]] * 2


def test_a_failing_backward_hook_is_turned_off_after_its_first_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from otelprof._log import reset_warnings

    reset_warnings()
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)

    class TimerBrokenForBackward:
        def poll(self) -> None:
            pass

        def begin(self, region: str) -> None:
            if region == sc.REGION_BACKWARD:
                raise RuntimeError("hook bug")

        def end(self, region: str) -> None:
            pass

    monkeypatch.setattr(inst, "device_timer", TimerBrokenForBackward())
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        losses = _train(model, optimizer, loader)
    assert len(losses) == 8 and caplog.text.count("backward hook failed") == 1
    [errors] = [m for m in session.registry.collect() if m.name == sc.INTEGRATION_ERRORS.name]
    assert errors.data.data_points[0].value == 1  # once, not once per step
    rank = _recording(session)
    assert len(rank.steps) == 8
    assert [[a.name for a in s.annotations] for s in rank.steps] == [[sc.REGION_DATALOADER, sc.REGION_FORWARD,
                                                                     sc.REGION_OPTIMIZER]] * 8


def test_an_optimizer_whose_hooks_cannot_be_registered_warns_and_training_goes_on(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """An Optimizer subclass that skipped Optimizer.__init__ and wraps nothing: a warning, no exception."""
    from otelprof._log import reset_warnings

    class Stateless(torch.optim.Optimizer):
        def __init__(self) -> None:  # no super().__init__(): no hook dictionaries
            pass

    reset_warnings()
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        otorch.instrument(model=model, optimizer=Stateless(), dataloader=loader)
    assert "cannot hook Stateless.step()" in caplog.text
    _train(model, optimizer, loader)
    rank = _recording(session)
    assert len(rank.steps) == 8  # fetch to fetch, as without an optimizer


def test_profile_window_records_top_operators_and_a_span(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer, loader = _parts()
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    assert inst.profile_window(2, 3, chrome_trace=True)["armed"] is True
    _train(model, optimizer, loader)
    time.sleep(0.5)  # the summary is computed on a background thread
    rank = _recording(session)
    [window] = list(rank.profiles())
    assert (window["start_step"], window["num_steps"]) == (2, 3)
    names = {op["name"] for op in window["cpu_ops"]}
    assert any(name.startswith("aten::") for name in names)
    assert all(op["calls"] > 0 and op["total_s"] >= op["self_s"] >= 0 for op in window["cpu_ops"])
    assert (rank.path / window["trace_file"]).stat().st_size > 1000
    [span] = [s for s in rank.spans() if s.name == sc.SPAN_PROFILE]
    assert span.attributes[sc.ATTR_PROFILE_START] == 2
    steps = {s.number: s for s in rank.steps}
    assert span.start_ns <= steps[2].start_ns and span.end_ns >= steps[4].end_ns
    # every span -- the profile window's from the SDK tracer, the others built -- under otelprof's versioned scope
    scopes = {json.dumps(scope_spans["scope"], sort_keys=True)
              for line in (rank.path / schema.SPANS).read_text().splitlines()
              for resource_spans in json.loads(line)["resourceSpans"] for scope_spans in resource_spans["scopeSpans"]}
    assert scopes == {json.dumps({"name": sc.SCOPE_NAME, "version": otelprof.__version__}, sort_keys=True)}


def test_capture_endpoint_arms_a_profiler_window(tmp_path: Path) -> None:
    from tests.servers import free_port
    from tests.test_control import TOKEN, _post

    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, control_port=free_port(),
                            control_token=TOKEN)
    assert isinstance(session, otelprof.Session) and session.control_address is not None
    model, optimizer, loader = _parts()
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    _train(model, optimizer, loader)
    status, answer = _post(session.control_address, "/v1/capture", {"steps": 2})
    assert status == 202 and answer["kind"] == "torch.profiler" and answer["start_step"] == 8
    _train(model, optimizer, loader)
    time.sleep(0.5)
    rank = _recording(session)
    [window] = list(rank.profiles())
    assert (window["start_step"], window["num_steps"]) == (8, 2)


def test_kernel_classification() -> None:
    assert kernel_precision("ampere_fp16_s16816gemm_fp16_128x128") == "fp16"
    assert kernel_precision("sm80_xmma_gemm_bf16bf16_bf16f32") == "bf16"
    assert kernel_precision("volta_sgemm_128x64_nn") == "fp32"
    assert kernel_precision("void at::native::vectorized_elementwise_kernel") == "other"
    assert gpu_activity("Memcpy HtoD (Pageable -> Device)") == "memcpy"
    assert gpu_activity("Memset (Device)") == "memset"
    assert gpu_activity("cudaDeviceSynchronize") == "sync"
    assert gpu_activity("ampere_sgemm") == "kernel"


def test_otelprof_run_instruments_an_unmodified_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "dl = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)\n"
        "for x, y in dl:\n"
        "    loss = ((model(x) - y) ** 2).mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
    )
    env = {**os.environ, "OTELPROF_RECORD_DIR": str(tmp_path / "runs"), "OTELPROF_SYSTEM_METRICS": "false"}
    result = subprocess.run([sys.executable, "-m", "otelprof", "run", "--", sys.executable, str(script)],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    [run_dir] = list((tmp_path / "runs").iterdir())
    rank = read_recording(run_dir).ranks[0]
    assert len(rank.steps) == 8
    assert [a.name for a in rank.steps[0].annotations] == REGIONS
    assert rank.steps[0].scalars["samples"] == 8


def test_run_without_a_command_is_a_usage_error() -> None:
    result = subprocess.run([sys.executable, "-m", "otelprof", "run"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "otelprof run -- python train.py" in result.stderr


def test_a_teacher_models_forward_stays_in_the_students_train_step(tmp_path: Path) -> None:
    """Global hooks (``otelprof run``): a teacher in eval mode under no_grad, before or after the student's forward,
    is part of the student's training iteration; the evaluation pass of the student after them is evaluation."""
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    student, optimizer, loader = _parts()
    teacher = torch.nn.Sequential(torch.nn.Linear(8, 2)).eval()
    otorch.auto_instrument()
    for i, (x, y) in enumerate(loader):
        if i % 2 == 0:
            with torch.no_grad():
                soft = teacher(x).softmax(1)
        logits = student(x)
        if i % 2 == 1:
            with torch.no_grad():
                soft = teacher(x).softmax(1)
        loss = torch.nn.functional.cross_entropy(logits, y) + torch.nn.functional.cross_entropy(logits, soft)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    student.eval()
    with torch.no_grad():
        for x, _ in loader:
            student(x)
    rank = _recording(session)
    assert [(s.phase, s.number) for s in rank.steps] == [(phase, i) for phase in ("train", "eval") for i in range(8)]
    assert all([a.name for a in s.annotations] == [sc.REGION_DATALOADER, sc.REGION_FORWARD, sc.REGION_FORWARD,
                                                   sc.REGION_BACKWARD, sc.REGION_OPTIMIZER] for s in rank.steps[:8])


def test_the_loss_of_an_evaluation_forward_output(tmp_path: Path) -> None:
    """The scalar loss of an evaluation forward's output: the tensor, a tuple's, a mapping's or an attribute; the
    eval step's loss is their mean; a loss the user records stays."""
    from dataclasses import dataclass

    @dataclass
    class Output:
        logits: torch.Tensor
        loss: torch.Tensor | None = None

    assert otorch._output_loss(torch.tensor(2.5)) == 2.5
    assert otorch._output_loss((torch.ones(2, 3), torch.tensor(1.5))) == 1.5
    assert otorch._output_loss({"logits": torch.ones(2), "loss": torch.tensor(0.5)}) == 0.5
    assert otorch._output_loss(Output(torch.ones(2), torch.tensor(0.25))) == 0.25
    for none in (torch.ones(2), torch.tensor(3), (torch.ones(2), None), Output(torch.ones(2)), {"x": 1}, None, 3.0):
        assert otorch._output_loss(none) is None

    class Scoring(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 2)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            logits = self.linear(x)
            return logits, torch.nn.functional.cross_entropy(logits, y)

    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model = Scoring().eval()
    _, _, loader = _parts()
    otorch.instrument(model=model, dataloader=loader)
    losses = []
    with torch.no_grad():
        for i, (x, y) in enumerate(loader):
            first, second = float(model(x[:8], y[:8])[1]), float(model(x[8:], y[8:])[1])
            losses.append((first + second) / 2)
            if i == 3:
                otelprof.record("loss", 42.0)
    rank = _recording(session)
    assert [(s.phase, s.number) for s in rank.steps] == [("eval", i) for i in range(8)]
    assert [s.scalars["loss"] for s in rank.steps] == pytest.approx([*losses[:3], 42.0, *losses[4:]], rel=1e-6)


def test_grad_scaler_is_patched_while_instrumented() -> None:
    """The base class's ``__init__``, ``scale`` and ``step``; subclasses with their own ``scale`` (FSDP's
    ``ShardedGradScaler``, one defined after instrumenting) too; all restored."""
    from torch.amp.grad_scaler import GradScaler
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    init, scale, step, sharded = GradScaler.__init__, GradScaler.scale, GradScaler.step, ShardedGradScaler.scale
    otorch.instrument()

    class Later(GradScaler):
        def scale(self, outputs: Any) -> Any:  # type: ignore[override]
            return super().scale(outputs)

    own = Later.scale
    assert GradScaler.scale is not scale and GradScaler.step is not step and ShardedGradScaler.scale is not sharded
    Later("cpu")
    assert Later.scale is not own
    otorch.uninstrument()
    assert (GradScaler.__init__, GradScaler.scale, GradScaler.step) == (init, scale, step)
    assert ShardedGradScaler.scale is sharded and Later.scale is own and otorch._scaled == [None]


def test_a_steps_loss_parts_are_added_up_off_the_hot_path(tmp_path: Path) -> None:
    """A loss of parts (tensors, as a CUDA loop's backward() losses are kept) is their sum in the recording; the
    parts of an evaluation step's loss their mean; parts that are not numbers are ignored with one warning."""
    from otelprof.runtime import hotpath

    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    with otelprof.step():
        otelprof.record("loss", [torch.tensor(0.25), 0.5, torch.tensor([1.0])])
    with otelprof.step(phase="eval"):
        otelprof.record("loss", hotpath.Mean([torch.tensor(1.0), 2.0]))
    with otelprof.step():
        otelprof.record("loss", ["x"])
        otelprof.record("samples", 4)
    rank = _recording(session)
    assert [s.scalars.get("loss") for s in rank.steps] == [1.75, 1.5, None]


def test_record_keeps_the_value_at_the_call_of_a_tensor_changed_in_place_later(tmp_path: Path) -> None:
    """A running-loss accumulator recorded and then reset in place: each step (and a scalar outside steps) keeps
    the value it had when it was recorded, not the one the recorder would read later on its thread."""
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    running, expected = torch.zeros(()), []
    for i in range(6):
        with otelprof.step():
            running += float(i + 1)
            otelprof.record("running_loss", running)
            otelprof.record("parts", [running, torch.ones(()) * i])
            expected.append((float(running), float(running) + i))
            if i % 2 == 1:
                running.zero_()
    running.fill_(7.0)
    otelprof.record("after", running)
    running.zero_()
    rank = _recording(session)
    assert [(s.scalars["running_loss"], s.scalars["parts"]) for s in rank.steps] == expected
    assert [(name, value) for _, _, name, value in rank.scalars] == [("after", 7.0)]


def test_record_copies_a_tensor_on_a_device_and_leaves_other_values_alone() -> None:
    """Off the CPU a one-element tensor is copied (on its device's stream, never read on the training thread);
    a tensor of several elements and values that are no tensors are kept as given (the recorder judges them)."""
    from otelprof.runtime import hotpath

    on_device = torch.zeros((), device="meta", requires_grad=True)
    copy = hotpath._value_now(on_device)
    assert copy is not on_device and copy.device.type == "meta" and not copy.requires_grad
    several = torch.zeros(3)
    assert hotpath._value_now(several) is several and hotpath._value_now("x") == "x"
    assert hotpath._value_now([torch.tensor(0.5), 2]) == [0.5, 2]


def test_a_critic_updated_every_batch_and_a_generator_every_third_make_one_step_per_batch(tmp_path: Path) -> None:
    """A WGAN-style loop: per fetched batch the critic's update, and every third batch the generator's too. Each
    batch is one step holding its updates, its loss all of them and each optimizer's its own; a step whose last
    update was the critic's (which also comes before the generator's) ends at that update's end, not at the next
    fetch, nor, for the last batch, at the end of the loop."""
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    torch.manual_seed(0)
    critic, generator = torch.nn.Linear(4, 1), torch.nn.Linear(2, 4)
    optimizer_c = torch.optim.RMSprop(critic.parameters(), lr=5e-5)
    optimizer_g = torch.optim.RMSprop(generator.parameters(), lr=5e-5)
    loader = DataLoader(TensorDataset(torch.randn(56, 4)), batch_size=8)
    otorch.instrument(model=critic, optimizer=optimizer_c, dataloader=loader)
    otorch.instrument(model=generator, optimizer=optimizer_g)
    expected, ended = [], []
    for i, (real,) in enumerate(loader):
        optimizer_c.zero_grad()
        loss_c = critic(generator(torch.randn(8, 2)).detach()).mean() - critic(real).mean()
        loss_c.backward()
        optimizer_c.step()
        losses = {0: float(loss_c.detach())}
        if i % 3 == 0:
            optimizer_g.zero_grad()
            loss_g = -critic(generator(torch.randn(8, 2))).mean()
            loss_g.backward()
            optimizer_g.step()
            losses[1] = float(loss_g.detach())
        ended.append(time.perf_counter_ns())
        expected.append(losses)
    otorch.uninstrument()
    offset = session.recorder.offset_ns  # the recording's Unix times from perf_counter_ns()
    rank = _recording(session)
    assert [s.number for s in rank.steps if s.phase == "train"] == list(range(7)) and len(rank.steps) == 7
    for step, losses, end in zip(rank.steps, expected, ended):
        assert step.scalars[sc.SCALAR_LOSS] == pytest.approx(sum(losses.values()), rel=1e-6)
        assert {k: v for k, v in step.scalars.items() if k.startswith("loss_")} == pytest.approx(
            {sc.optimizer_loss(n): v for n, v in losses.items()}, rel=1e-6)
        assert [a.name for a in step.annotations].count(sc.REGION_OPTIMIZER) == len(losses)
        assert step.annotations[-1].name == sc.REGION_OPTIMIZER and step.end_ns <= end + offset
