"""Tensor collections' hooks: turned off from inside ``optimizer.step()`` (a step hook of the user's), they are
removed outside torch's iteration of them (training goes on, no RuntimeError); a CSR parameter and its CSR gradient
are skipped and counted as dropped, the other tensors are saved."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.optim import optimizer as optim_module

import otelprof
from otelprof.integrations import tensors
from otelprof.integrations import torch as otorch


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    yield
    otorch.uninstrument()
    otelprof.shutdown()


def _hooks() -> tuple[int, int]:
    return len(optim_module._global_optimizer_pre_hooks), len(optim_module._global_optimizer_post_hooks)


@pytest.mark.parametrize("where", ["global", "optimizer"])
def test_collections_turned_off_inside_a_step_hook_leave_training_alone(tmp_path: Path, where: str) -> None:
    """A post hook of the user's (global, after otelprof's; or the optimizer's own) stops the collections at step 2:
    removing otelprof's global hooks there would change the dict torch is iterating ("dictionary changed size
    during iteration" out of optimizer.step()). Later steps train; the hooks go once outside that iteration."""
    before = _hooks()
    otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0, collections="weights")
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    otorch.instrument(model=model, optimizer=optimizer)
    collector = tensors._collector[0]
    steps: list[int] = []

    def turn_off(opt: object, args: object, kwargs: object) -> None:
        steps.append(len(steps))
        if len(steps) == 3:
            tensors.stop()

    later: list[int] = []
    handles = [optim_module.register_optimizer_step_post_hook(turn_off) if where == "global"
               else optimizer.register_step_post_hook(turn_off),
               optim_module.register_optimizer_step_post_hook(lambda *args: later.append(1))]  # iterated after
    try:
        for _ in range(6):
            optimizer.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            optimizer.step()  # raised "OrderedDict mutated during iteration" at the third step
    finally:
        for handle in handles:
            handle.remove()
    assert steps == list(range(6)) and len(later) == 6 and collector.closed and not collector.failed
    assert sum(_hooks()) <= sum(before) + 1  # one no-op hook left at most, until a call outside any step
    tensors.stop()  # outside any step: what was left goes
    assert _hooks() == before
    saved = [json.loads(line) for path in tmp_path.rglob("tensors.jsonl") for line in path.read_text().splitlines()]
    assert [r["n"] for r in saved if r.get("name") == "weight"] == [0]  # saved at step 0; off from step 2 on


def test_a_csr_parameter_and_gradient_are_dropped_and_counted(tmp_path: Path) -> None:
    """A CSR weight (with its CSR gradient) beside dense ones: the collections skip it (its update could not even
    be computed: "unsupported tensor layout: SparseCsr") and count it, the dense tensors are saved every step."""
    otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0,
                  collections="weights@1,gradients@1,optimizer@1")

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            dense = torch.randn(4, 6)
            dense[dense < 0.3] = 0
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch: "Sparse CSR tensor support is in beta state"
                self.sparse = torch.nn.Parameter(dense.to_sparse_csr())
            self.head = torch.nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head((self.sparse.to_dense() @ x).T)

    model = Model()
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.1)  # the CSR weight is updated by hand
    otorch.instrument(model=model, optimizer=optimizer)
    collector = tensors._collector[0]
    for _ in range(3):
        optimizer.zero_grad()
        model.sparse.grad = None
        model(torch.randn(6, 5)).sum().backward()
        assert model.sparse.grad is not None and model.sparse.grad.layout == torch.sparse_csr
        optimizer.step()
    assert not collector.failed
    assert collector.dropped == 3 * 3  # the weight, its gradient and its update at each of the 3 saved steps
    otorch.uninstrument()
    records = [json.loads(line) for path in tmp_path.rglob("tensors.jsonl") for line in path.read_text().splitlines()]
    names = {r["name"] for r in records if r.get("k") == "t"}
    assert names == {"head.weight", "gradients/head.weight", "gradients/head.bias", "update/head.weight",
                     "update/head.bias"}
    assert sorted(r["n"] for r in records if r.get("name") == "head.weight") == [0, 1, 2]


def test_a_compiled_layer_is_named_as_the_layer(tmp_path: Path) -> None:
    """torch.compile(Linear) as the model: its tensors are named as the bare layer's (``weight``, ``linear/output``
    as the hook's name), not ``_orig_mod.weight``; its output, which compiled code computes without hooks, is
    counted as dropped at each saved step."""
    torch._dynamo.reset()
    otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0,
                  collections="weights@1,outputs@1")
    layer = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    compiled = torch.compile(layer, backend="eager")
    otorch.instrument(model=compiled, optimizer=optimizer)
    collector = tensors._collector[0]
    for _ in range(2):
        optimizer.zero_grad()
        compiled(torch.randn(3, 4)).sum().backward()
        optimizer.step()
    assert collector._activation_names[0] == ("outputs", "linear/output") and collector.dropped == 2
    otorch.uninstrument()
    torch._dynamo.reset()
    records = [json.loads(line) for path in tmp_path.rglob("tensors.jsonl") for line in path.read_text().splitlines()]
    assert sorted((r["name"], r["n"]) for r in records if r.get("k") == "t") == [("weight", 0), ("weight", 1)]
