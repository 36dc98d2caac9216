"""What a step records besides its regions, as the hooks read it: samples (the batch size), the loss (a
``GradScaler``'s scale undone, an evaluation forward's output), the learning rate, CUDA memory."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from otelprof.integrations import cuda_memory
from otelprof.integrations.torch_state import _LOSS, _cuda, _Mean, _Tensor, _with_registry
from otelprof.runtime import hotpath as hot


def _batch_size(batch: Any) -> int | None:
    """First dimension of the first tensor in a batch (tensor, sequence or mapping)."""
    kind = type(batch)
    if (kind is tuple or kind is list) and batch and type(first := batch[0]) is _Tensor:
        shape = first.shape  # the usual (inputs, targets) batch, once per step: without the loop below
        return shape[0] if shape else None
    for _ in range(3):
        if isinstance(batch, torch.Tensor):
            return int(batch.shape[0]) if batch.dim() > 0 else None
        if isinstance(batch, (list, tuple)) and batch:
            batch = batch[0]
        elif isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
        else:
            return None
    return None


def _record_cuda_memory() -> None:
    """CUDA memory gauges, after each optimizer step once CUDA is initialized (reads: cuda_memory.py)."""
    figures = cuda_memory.read()
    if figures is not None:
        _with_registry(lambda r: cuda_memory.set_gauges(r, figures))


def _learning_rate(lr: Any) -> Any:
    """A learning rate that is not a float, as the hooks record it: a tensor detached (converted off the hot
    path), anything else as a float."""
    return lr.detach() if isinstance(lr, _Tensor) else float(lr)


_scaled: list[tuple[weakref.ref[Any], Any] | None] = [None]
"""The last loss a ``GradScaler`` scaled: (a weak reference to the scaled tensor, the loss as given, detached).
``backward()`` on that scaled tensor records the loss as given: the loop's loss, not times the scale."""


def _output_loss(output: Any) -> Any:
    """The scalar loss an evaluation forward returned, or None: the output itself when it is a 0-dim floating
    tensor, the first such item of a tuple or list (nanoGPT's ``(logits, loss)``), or the ``loss`` of a mapping
    or object (a Hugging Face ``ModelOutput``). A number on CPU, a detached tensor elsewhere (converted off the
    hot path)."""
    loss: Any
    if isinstance(output, _Tensor):
        loss = output
    elif isinstance(output, (tuple, list)):
        loss = next((item for item in output[:4] if isinstance(item, _Tensor) and item.dim() == 0), None)
    elif isinstance(output, dict):
        loss = output.get("loss")
    else:
        loss = getattr(output, "loss", None)
    if not isinstance(loss, _Tensor) or loss.dim() != 0 or not loss.is_floating_point():
        return None
    return loss.item() if loss.is_cpu else loss.detach()


def _add_eval_loss(step: hot.StepContext, loss: Any) -> None:
    """An evaluation forward's loss into its step: averaged with the step's others (unless the step's loss is
    anything else: what the user recorded, or the sum of backward losses)."""
    scalars = step.scalars
    if scalars is None:
        step.scalars = {_LOSS: _Mean((loss,))}
    elif type(mean := scalars.get(_LOSS, _NO_LOSS)) is _Mean:
        mean.append(loss)
    elif mean is _NO_LOSS:
        scalars[_LOSS] = _Mean((loss,))


_NO_LOSS = object()


def _cuda_memory_if_initialized() -> None:
    if _cuda.is_initialized():  # type: ignore[no-untyped-call]
        _record_cuda_memory()
