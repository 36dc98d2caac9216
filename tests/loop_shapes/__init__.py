"""Training loops of the shapes people write, each in its own module, written after common public training
scripts (not copied from them): ``main(instrument)`` runs the loop and returns its own :class:`Account` of what it
did — its steps in order, by phase, with the regions each holds, its batch sizes and the loss as the loop itself
combines it. ``tests/test_loop_shapes.py`` runs each loop under ``otelprof run`` (a subprocess: ``python -m
tests.loop_shapes.<name>``, the account written to ``$LOOP_SHAPE_OUT``) and with the explicit API
(``instrument`` is ``otelprof.torch.instrument``), and compares the recording with the account.

A loop's account names the regions the recording must show, in order: ``dataloader``, ``forward`` (a call of
a model given to ``instrument``), ``backward``, ``optimizer``, and :data:`OTHER_FORWARD` for a top-level call of
a module the explicit API is not given (a loss module such as ``nn.CrossEntropyLoss``): a ``forward`` region
under ``otelprof run``, whose global hooks time every top-level module call, and nothing with the explicit API.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import torch

Instrument = Callable[..., Any]
"""``otelprof.torch.instrument``, or None: the loop runs as written (``otelprof run`` hooks it from outside)."""

OTHER_FORWARD = "forward*"
"""A top-level call of a module that is not instrumented explicitly (see the module docstring)."""


class Account:
    """What the loop did, step by step (a step: one iteration's optimizer updates, or one evaluation batch)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.outside: list[str] = []
        """Regions that stand outside steps."""
        self.facts: dict[str, Any] = {}
        """What else the loop saw that must not depend on otelprof (compared with the loop run without it)."""

    def step(self, phase: str) -> None:
        """A step of ``phase`` begins."""
        self.steps.append({"phase": phase, "regions": [], "loss": None, "losses": [], "samples": None})

    def did(self, *regions: str) -> None:
        self.steps[-1]["regions"].extend(regions)

    def samples(self, count: int) -> None:
        current = self.steps[-1]
        current["samples"] = (current["samples"] or 0) + count

    def backward_loss(self, loss: torch.Tensor, update: int | None = None) -> None:
        """The loss a backward() of this step was given (a train step's loss is their sum); ``update``: in a loop
        with several optimizers, the number of the optimizer whose update it is for (numbered in the order they
        first step; that optimizer's own loss in the step is the sum of its update's)."""
        current = self.steps[-1]
        current["loss"] = (current["loss"] or 0.0) + float(loss.detach())
        if update is not None:
            own = current.setdefault("updates", {})
            own[str(update)] = own.get(str(update), 0.0) + float(loss.detach())

    def recorded(self, name: str, value: torch.Tensor) -> None:
        """The value the loop gave ``otelprof.record(name, ...)`` in this step, as it was then."""
        self.steps[-1].setdefault("recorded", {})[name] = float(value)

    def eval_loss(self, loss: torch.Tensor, module: str = "forward") -> None:
        """The loss an evaluation forward returned (an eval step's loss is their mean); ``module``
        :data:`OTHER_FORWARD`: the output of a module the explicit API is not given (recorded under ``otelprof run``
        only)."""
        current = self.steps[-1]
        current["losses"].append(float(loss.detach()))
        current["loss"] = sum(current["losses"]) / len(current["losses"])
        current["loss_from"] = module

    def dump(self) -> dict[str, Any]:
        return {"steps": [{k: v for k, v in s.items() if k != "losses"} for s in self.steps],
                "outside": sorted(self.outside), "facts": self.facts}


def run_as_script(main: Callable[..., Account]) -> None:
    """``python -m tests.loop_shapes.<name>``: run the loop as written, with the options in ``$LOOP_SHAPE_OPTIONS``
    (JSON), and write its account to ``$LOOP_SHAPE_OUT`` (``.<rank>`` appended in a distributed job). With
    ``LOOP_SHAPE_EXPLICIT=1`` the loop starts otelprof and instruments its objects itself (the explicit API in a
    job of several processes), with the hooks in C on the ranks listed in ``LOOP_SHAPE_NATIVE_RANKS`` and in
    Python on the others."""
    torch.set_num_threads(1)
    options = json.loads(os.environ.get("LOOP_SHAPE_OPTIONS", "{}"))
    if os.environ.get("LOOP_SHAPE_EXPLICIT") == "1":
        import otelprof
        from otelprof.integrations import torch as otorch

        native = os.environ.get("RANK", "0") in os.environ.get("LOOP_SHAPE_NATIVE_RANKS", "").split(",")
        os.environ["OTELPROF_TORCH_NATIVE"] = "true" if native else "false"
        otelprof.init(system_metrics=False, profile_every=0)
        account = main(otorch.instrument, **options)
        otelprof.shutdown()
    else:
        account = main(None, **options)
    path = os.environ["LOOP_SHAPE_OUT"]
    if "RANK" in os.environ:
        path += "." + os.environ["RANK"]
    with open(path, "w") as out:
        json.dump(account.dump(), out)
