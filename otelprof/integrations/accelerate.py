"""Hugging Face ``accelerate`` in a loop of the user's own (``accelerator.prepare``, ``accelerator.backward``,
``accelerator.accumulate``), as :mod:`otelprof.integrations.torch` records it.

* **fetches** — a prepared data loader (``DataLoaderShard``, ``DataLoaderDispatcher``, ...) reads its base
  loader one batch ahead of the loop. Under ``otelprof run`` its fetches are timed where the loop asks it
  for a batch (as ``instrument(dataloader=prepared)`` does), not where it reads ahead, so a step holds its
  own batches and samples.
* **loss** — ``Accelerator.backward`` divides the loss by the gradient accumulation steps before
  ``backward()``. A step's recorded loss is the mean of the losses the loop passed to
  ``accelerator.backward()`` in it, i.e. what the loop computed, micro-batch by micro-batch.

Both stand aside while a trainer's callback is in charge (the Hugging Face ``Trainer`` uses accelerate
inside; its callback records the loss the ``Trainer`` logs). Installed by ``otelprof run``
(:mod:`otelprof.integrations.autoattach`) and by ``otelprof.torch.instrument()`` when accelerate is
loaded. A failure is counted like a failing hook's and warned about once; training goes on.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch

from otelprof import semconv as sc
from otelprof._log import warn_once
from otelprof.runtime import hotpath as hot

__all__ = ["after_init", "patch_backward", "patch_loaders"]

HOOK = "accelerate"
"""``hook`` label of ``otelprof.integration.errors`` when a patch below failed."""
MARK = "_otelprof_patch"
"""Attribute that marks a method otelprof replaced (``__wrapped__`` is the original)."""


def _instrumentation() -> Any:
    """The ``otelprof.torch`` instrumentation, unless none runs or a trainer's callback is in charge."""
    module = sys.modules.get("otelprof.integrations.torch")
    active = getattr(module, "_active", None)
    inst = active[-1] if active else None
    return None if inst is None or inst.closed or inst.handed_over else inst


def _failed(exc: Exception) -> None:
    from otelprof.runtime.session import get_session

    session = get_session()
    if session is not None:
        with session.registry.lock:
            session.registry.counter(sc.INTEGRATION_ERRORS).add(1, (HOOK,))
    warn_once("accelerate:failed", "otelprof: its accelerate patch failed (%r); training goes on without it", exc)


class _StepLoss:
    """The losses passed to ``accelerator.backward()`` in the open step."""

    def __init__(self) -> None:
        self.step: hot.StepContext | None = None
        self.total: Any = 0.0
        self.count = 0

    def add(self, loss: Any) -> None:
        if hot._active is None or not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            return
        inst = _instrumentation()
        if inst is None or not inst.loss:
            return
        step = hot._tls.step
        if step is None and (native := hot._native[0]) is not None:
            native()  # the step the C hooks hold becomes the thread's
            step = hot._tls.step
        if step is None:
            return
        value = loss.item() if loss.is_cpu else loss.detach()
        if step is not self.step:
            self.step, self.total, self.count = step, value, 1
        else:
            self.total, self.count = self.total + value, self.count + 1
        hot._record_into(step, sc.SCALAR_LOSS, self.total / self.count if self.count > 1 else value)


_step_loss = _StepLoss()


def patch_backward(accelerator_class: type) -> None:
    """``Accelerator.backward(loss)``: the step's loss is the mean of the losses passed to it."""
    original = accelerator_class.backward  # type: ignore[attr-defined]
    if getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def backward(self: Any, loss: Any, **kwargs: Any) -> Any:
        result = original(self, loss, **kwargs)
        try:
            _step_loss.add(loss)
        except hot.StopTraining:
            raise
        except Exception as exc:
            _failed(exc)
        return result

    setattr(backward, MARK, True)
    accelerator_class.backward = backward  # type: ignore[attr-defined]


def after_init(cls: type, then: Callable[[Any], None], failed: Callable[[Exception], None]) -> None:
    """Run ``then(instance)`` at the end of ``cls.__init__`` (a subclass's ``__init__`` calls it), once however
    often it is patched; an exception there goes to ``failed`` and the instance is made all the same."""
    original = cls.__init__  # type: ignore[misc]
    if getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            then(self)
        except Exception as exc:
            failed(exc)

    setattr(__init__, MARK, True)
    cls.__init__ = __init__  # type: ignore[misc]


def patch_loaders(adapter_class: type) -> None:
    """Every prepared data loader built from now on is timed as the loop's loader, its base loader not."""
    after_init(adapter_class, _time_prepared, _failed)


def _time_prepared(loader: Any) -> None:
    inst = _instrumentation()
    if inst is None or "everything" not in inst._removers:
        return  # the explicit API times the loader it is given
    base = loader.__dict__.get("base_dataloader")
    inst.add_dataloader(loader)
    if base is not None and hasattr(base, "__dict__"):
        base.__dict__["_otelprof_instrumented"] = True  # read ahead by the prepared loader: not timed itself
