"""Compiled models under otelprof: the same compilations as the bare model (no graph break, no recompile), for the
whole model or a submodule compiled, fullgraph or not, inductor's default mode or reduce-overhead, with otelprof's
defaults, an early profiling window, tensor collections and the FLOP counter; the instrumented run records its
steps, windows and collections; compile time is a ``compile`` region, not an outlier step."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import otelprof
from otelprof import semconv as sc
from otelprof.integrations import torch as otorch

torch.set_num_threads(1)
STEPS = 7
SAVED = [0, 2, 4, 6]  # @2 of STEPS
COLLECTIONS = "weights@2,gradients@2,outputs@2"
WINDOW = (1, 2)  # early: the heap watch's global hook goes in before the first compilation
_bare: dict[tuple[str, bool, str | None], dict[str, Any]] = {}


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    otorch.uninstrument()
    otelprof.shutdown()
    torch._dynamo.reset()


def _compiles() -> tuple[list[str], Any]:
    """Ids of the frames Dynamo compiles from now on (a recompile is a frame's second id: ``0/1``)."""
    from torch._dynamo.callback import callback_handler

    ids: list[str] = []

    def started(args: Any) -> None:  # frames Dynamo compiles (a backward compiled lazily depends on the caches)
        if args.callback_trigger.name == "DYNAMO":
            ids.append(str(args.compile_id))

    callback_handler.register_start_callback(started)
    return ids, started


def _train(where: str, fullgraph: bool, mode: str | None, feature: str | None, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch, *, instrument_first: bool = False) -> dict[str, Any]:
    """STEPS steps of a tiny MLP, compiled (``where``: the whole model or its first layer); ``feature``: None for
    the bare loop, else otelprof on with it. Dynamo's counts, and what torch warned."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    ids, started = _compiles()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    options: dict[str, Any] = {"fullgraph": fullgraph} | ({"mode": mode} if mode else {})
    if feature is not None:
        if feature == "collections":
            monkeypatch.setenv("OTELPROF_COLLECTIONS", COLLECTIONS)
        monkeypatch.setenv("OTELPROF_PROFILE_FLOPS", "true" if feature == "flops" else "false")
        otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0, profile_warmup=0)
        if instrument_first:
            otorch.instrument(model=model, optimizer=optimizer)
    if where == "whole":
        call = compiled = torch.compile(model, **options)
    else:
        model[0] = torch.compile(model[0], **options)
        call = compiled = model
    if feature is not None:
        if not instrument_first:  # the compiled module is the model (docs/pytorch.md)
            otorch.instrument(model=compiled, optimizer=optimizer)
        if feature in ("window", "flops"):
            otorch.profile_window(*WINDOW)
    x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        for _ in range(STEPS):
            loss = torch.nn.functional.cross_entropy(call(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    if feature is not None:
        otorch.uninstrument()
        otelprof.shutdown()
    from torch._dynamo.callback import callback_handler

    if started in callback_handler.start_callbacks:
        callback_handler.remove_start_callback(started)
    return {"graph_breaks": sum(counters["graph_break"].values()), "unique_graphs": counters["stats"]["unique_graphs"],
            "compiles": sorted(ids), "recompiles": [i for i in ids if not i.endswith("/0")],
            "warnings": [str(w.message) for w in shown]}


def _bare_run(where: str, fullgraph: bool, mode: str | None, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    key = (where, fullgraph, mode)
    if key not in _bare:  # one bare run per compiled shape (the features change nothing there)
        _bare[key] = _train(where, fullgraph, mode, None, tmp_path, monkeypatch)
    return _bare[key]


def _lines(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for path in tmp_path.rglob(name) for line in path.read_text().splitlines() if line]


@pytest.mark.parametrize("feature", ["defaults", "window", "collections", "flops"])
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("where", ["whole", "submodule"])
def test_otelprof_adds_no_graph_break_or_recompile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str,
                                                   fullgraph: bool, mode: str | None, feature: str) -> None:
    bare = _bare_run(where, fullgraph, mode, tmp_path / "bare", monkeypatch)
    run = tmp_path / "run"
    profiled = _train(where, fullgraph, mode, feature, run, monkeypatch)  # fullgraph: no raise
    assert bare["graph_breaks"] == 0 and bare["unique_graphs"] >= 1 and not bare["recompiles"]
    assert profiled["graph_breaks"] == 0 and profiled["recompiles"] == []
    assert profiled["unique_graphs"] == bare["unique_graphs"] and profiled["compiles"] == bare["compiles"]
    assert not [w for w in profiled["warnings"] if "global hooks" in w]  # torch's warning, not on the job's stderr
    steps = [s for s in _lines(run, "steps.jsonl") if s.get("k") == "s"]
    assert [s["n"] for s in steps] == list(range(STEPS))  # every step the loop did, once
    regions = [{a[0] for a in s.get("a", [])} for s in steps]
    assert all(sc.REGION_OPTIMIZER in r and sc.REGION_BACKWARD in r for r in regions)
    assert all(sc.REGION_FORWARD in r for r in regions)  # the compiled module's (or the model's) forward
    assert sc.REGION_COMPILE in regions[0]  # step 0 compiled
    profiles = _lines(run, "profiles.jsonl")
    if feature in ("window", "flops"):
        assert [(p["start_step"], p["num_steps"]) for p in profiles] == [WINDOW]
        assert "flops" not in profiles[0]  # a FLOP counter (a dispatch mode) would recompile: not under compile
    else:
        assert profiles == []
    tensors = [t for t in _lines(run, "tensors.jsonl") if t.get("k") == "t"]
    if feature == "collections":
        names = {t["name"] for t in tensors}
        weights = {"0.weight", "2.weight"}  # named as the uncompiled model's
        gradients = {f"gradients/{n}" for n in weights | {"0.bias", "2.bias"}}
        assert names >= weights | gradients
        for name in weights | gradients:
            assert sorted(t["n"] for t in tensors if t["name"] == name) == SAVED
        # compiled layers run no hooks: their activations are not seen; eager layers' are, at every saved step
        eager = {"1/output", "2/output"} if where == "submodule" else set()
        assert {n for n in names if n.endswith("/output")} == eager
        for name in eager:
            assert sorted(t["n"] for t in tensors if t["name"] == name) == SAVED
    else:
        assert tensors == []


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_model_compiled_after_instrument_compiles_as_the_bare_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    fullgraph: bool) -> None:
    """instrument(model) then torch.compile(model): torch.compile inspects and traces the instrumented forward
    (a C timer on the C hot path had no source: "getfile returned None"); the same compilations as bare."""
    bare = _bare_run("whole", fullgraph, None, tmp_path / "bare", monkeypatch)
    run = tmp_path / "run"
    profiled = _train("whole", fullgraph, None, "collections", run, monkeypatch, instrument_first=True)
    assert profiled["graph_breaks"] == 0 and profiled["recompiles"] == []
    assert profiled["compiles"] == bare["compiles"]
    steps = [s for s in _lines(run, "steps.jsonl") if s.get("k") == "s"]
    assert [s["n"] for s in steps] == list(range(STEPS))
    tensors = [t for t in _lines(run, "tensors.jsonl") if t.get("k") == "t"]
    assert sorted(t["n"] for t in tensors if t["name"] == "0.weight") == SAVED


def test_compile_time_is_a_region_not_an_outlier_step(tmp_path: Path) -> None:
    """A function compiled at step 30 of steps of a few milliseconds: that step holds a ``compile`` region and is
    judged neither live nor offline (the report's outlier steps, the offline checks), while a step as slow that
    did not compile is an outlier."""
    import time

    from otelprof.analysis import check_recording
    from otelprof.analysis.run import RunView
    from otelprof.analysis.steps import step_analysis
    from otelprof.mixin.config import MixinConfig
    from otelprof.recording.reader import read_recording

    otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0, outlier_min_steps=20,
                  outlier_min_excess=0.001)
    session = otelprof.get_session()
    assert session is not None and session.run_dir is not None
    otorch.instrument()  # the compile callbacks (no model: steps marked by hand)
    compiled = torch.compile(lambda t: torch.sin(t) * 2 + 1, backend="eager")
    slow_ns = 0
    for n in range(45):
        with otelprof.step():
            time.sleep(0.002)
            if n == 30:
                began = time.perf_counter_ns()
                compiled(torch.randn(4))
                slow_ns = time.perf_counter_ns() - began
            if n == 40:  # as slow, nothing compiled: the judge does see outliers
                time.sleep(slow_ns / 1e9)
    session.recorder.drain()
    live = session.recorder.step_outliers.values[("train",)]
    run_dir = session.run_dir.parent
    otorch.uninstrument()
    otelprof.shutdown()
    recording = read_recording(run_dir)
    rank = recording.ranks[0]
    steps = rank.steps
    assert [a.name for a in steps[30].annotations] == [sc.REGION_COMPILE]
    assert not any(a.name == sc.REGION_COMPILE for s in steps if s.number != 30 for a in s.annotations)
    listed = set(step_analysis(RunView(recording)).rows[0].outlier_steps)
    assert 40 in listed and 30 not in listed
    costs = check_recording.outlier_costs(rank, check_recording.OutlierSettings.of(
        rank.manifest.get("config") or {}, MixinConfig()))[0]
    numbers = list(rank.step_columns.number)
    assert costs[numbers.index(30)] == 0.0 and costs[numbers.index(40)] > 0
    assert live >= 1  # step 40 (live and offline judge alike)


class Net(torch.nn.Module):
    """A model of the user's own class: torch.compile runs its module hooks eagerly and compiles the frames they
    call (a torch.nn container's are traced inline instead)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(8, 16)
        self.last = torch.nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(torch.relu(self.first(x)))


def _user_bare(fullgraph: bool) -> list[str]:
    key = ("user", fullgraph, None)
    if key not in _bare:
        torch._dynamo.reset()
        ids, started = _compiles()
        torch.manual_seed(0)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        compiled = torch.compile(model, fullgraph=fullgraph)
        x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
        for _ in range(STEPS):
            loss = torch.nn.functional.cross_entropy(compiled(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        from torch._dynamo.callback import callback_handler

        callback_handler.remove_start_callback(started)
        _bare[key] = {"compiles": sorted(ids)}
    return list(_bare[key]["compiles"])


@pytest.mark.parametrize("kind", ["sequential", "user"])
@pytest.mark.parametrize("fullgraph", [False, True])
def test_otelprof_run_hooks_add_no_graph_break_or_recompile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            fullgraph: bool, kind: str) -> None:
    """``otelprof run``'s global module and optimizer hooks and the tensor collections' model discovery (a global
    module hook too), installed before the model is compiled: the same compilations as bare (a hook that Dynamo
    compiled on its own would be an extra frame, and would then do nothing), no warning about global hooks, every
    step recorded with its forward, the weights of the discovered (compiled) model saved."""
    from torch._dynamo.utils import counters

    bare = (_bare_run("whole", fullgraph, None, tmp_path / "bare", monkeypatch)["compiles"] if kind == "sequential"
            else _user_bare(fullgraph))
    torch._dynamo.reset()
    counters.clear()
    ids, started = _compiles()
    monkeypatch.setenv("OTELPROF_COLLECTIONS", "weights@2")
    monkeypatch.setenv("OTELPROF_PROFILE_FLOPS", "false")
    otelprof.init(record_dir=str(tmp_path / "run"), system_metrics=False, profile_every=0, profile_warmup=0)
    otorch.auto_instrument()
    torch.manual_seed(0)
    model: torch.nn.Module = (torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
                              if kind == "sequential" else Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    compiled = torch.compile(model, fullgraph=fullgraph)
    x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
    with warnings.catch_warnings(record=True) as shown:  # the filters as they are (otelprof's in), shown afresh
        for _ in range(STEPS):
            loss = torch.nn.functional.cross_entropy(compiled(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    otorch.uninstrument()
    otelprof.shutdown()
    from torch._dynamo.callback import callback_handler

    if started in callback_handler.start_callbacks:
        callback_handler.remove_start_callback(started)
    assert sum(counters["graph_break"].values()) == 0 and sorted(ids) == bare
    assert not [w for w in shown if "global hooks" in str(w.message)]
    steps = [s for s in _lines(tmp_path / "run", "steps.jsonl") if s.get("k") == "s"]
    assert [s["n"] for s in steps] == list(range(STEPS))
    assert all(sc.REGION_FORWARD in {a[0] for a in s["a"]} for s in steps)
    assert sc.REGION_COMPILE in {a[0] for a in steps[0]["a"]}
    tensors = [t for t in _lines(tmp_path / "run", "tensors.jsonl") if t.get("k") == "t"]
    weight = "0.weight" if kind == "sequential" else "first.weight"
    assert sorted(t["n"] for t in tensors if t["name"] == weight) == SAVED
