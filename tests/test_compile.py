"""A compiled model under otelprof: no graph break, no recompile over the bare model, fullgraph=True trains."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import otelprof
from otelprof.integrations import torch as otorch

torch.set_num_threads(1)
STEPS = 9


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    otorch.uninstrument()
    otelprof.shutdown()
    torch._dynamo.reset()


def _train(*, fullgraph: bool, session: bool, tmp_path: Path, start: int = 2) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    compiled = torch.compile(model, backend="eager", fullgraph=fullgraph)
    if session:  # the compiled module is the model (docs/pytorch.md)
        otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0, profile_warmup=0)
        otorch.instrument(model=compiled, optimizer=optimizer)
        otorch.profile_window(start, 2)  # its steps, and the ones before and after it, run compiled
    x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
    for _ in range(STEPS):
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if session:
        otorch.uninstrument()
        otelprof.shutdown()
    return {"graph_breaks": sum(counters["graph_break"].values()),
            "unique_graphs": counters["stats"]["unique_graphs"],
            "frames": counters["frames"]["total"], "ok_frames": counters["frames"]["ok"],
            "recompiles": sum(counters["recompiles"].values())}


@pytest.mark.parametrize(("fullgraph", "start"), [(False, 2), (True, 2), (False, 5)])
def test_otelprof_adds_no_graph_break_or_recompile(tmp_path: Path, fullgraph: bool, start: int) -> None:
    """An early window (its heap watch's global hook goes in before the first compile, and stays) and a later
    one (after the first compile: no hook)."""
    bare = _train(fullgraph=fullgraph, session=False, tmp_path=tmp_path)
    profiled = _train(fullgraph=fullgraph, session=True, tmp_path=tmp_path, start=start)  # fullgraph: no raise
    assert bare["graph_breaks"] == 0 and bare["unique_graphs"] >= 1
    assert profiled == bare
    profiles = [line for path in tmp_path.rglob("profiles.jsonl") for line in path.read_text().splitlines() if line]
    assert profiles  # the window ran (over compiled steps)
