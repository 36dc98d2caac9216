"""The ``backward`` region and a train step's loss: ``Tensor.backward`` patched once per process (the C wrapper
when the extension is there, which hands what it does not handle to the Python one), and ``GradScaler`` patched so
that the loss recorded is the loss as given (not times the scale) and a skipped update still ends the step."""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

import torch

from otelprof.integrations.torch_hooks import _Hooks
from otelprof.integrations.torch_optimizer import _OptimizerHooks
from otelprof.integrations.torch_scalars import _scaled
from otelprof.integrations.torch_state import _BACKWARD, _LOSS, BACKWARD, _active, _native, _OpenRegion, _Sum, _Tensor
from otelprof.runtime import hotpath as hot

_original_backward: Callable[..., Any] | None = None
_native_backward: Any = None
"""The C ``Tensor.backward`` while patched with it: its ``steps`` follow the newest instrumentation."""


def _patched_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        inst: _Hooks | None = _active[-1] if _active and hot._active is not None else None
        if inst is None or inst.backward_off:
            return original(self, *args, **kwargs)
        # Before: may open a step, records the loss (the tensor backward() is called on, when a scalar), begins the
        # ``backward`` region; after: ends it. Inline, as every call on the training thread counts.
        region: _OpenRegion | None = None
        try:
            auto = inst.auto
            step = hot._tls.step
            if step is None or (step is auto.current and (auto.leader == BACKWARD or auto.slow)):
                step = auto.begin(BACKWARD, step)
            auto.saw_work = auto.saw_backward = auto.trained = True
            counted = inst.loss
            if counted and inst._optimizer_depth:  # inside optimizer.step(closure): its first evaluation's loss only
                counted = not inst._closure_evaluated
                inst._closure_evaluated = True
            if counted and self.numel() == 1:
                tensor = self
                if (scaled := _scaled[0]) is not None and scaled[0]() is self:  # GradScaler.scale(loss): loss
                    tensor = scaled[1]
                    _scaled[0] = None
                # CPU: a number now is cheaper than holding the tensor; CUDA: converted off the hot path.
                loss = tensor.item() if tensor.is_cpu else tensor.detach()
                if step is not None and hot._active is not None:
                    # the step's loss: the sum of what its backward() calls were given (gradient accumulation)
                    scalars = step.scalars
                    if scalars is None:
                        step.scalars = {_LOSS: [loss]}  # a hot.Sum
                    elif type(total := scalars.get(_LOSS)) is _Sum:
                        total.append(loss)
                    else:
                        scalars[_LOSS] = [loss]
                else:
                    hot.record(_LOSS, loss)
            timer = inst.device_timer
            if timer is not None:
                timer.begin(_BACKWARD)
            if step is None:  # hot._begin_region inline
                region = (perf_counter_ns(), None, 0)
            else:
                depth = step.depth
                step.depth = depth + 1
                region = (perf_counter_ns(), step, depth)
        except hot.StopTraining:
            raise
        except Exception as exc:
            inst.failed("backward", exc)
        try:  # without arguments (the usual loss.backward()) a plain call: unpacking costs ~3,000 instructions
            return original(self, *args, **kwargs) if args or kwargs else original(self)
        finally:
            if region is not None:
                try:
                    start, step, depth = region
                    end = perf_counter_ns()  # hot._end_region inline
                    if step is not None:
                        step.depth = depth
                        if not step.closed and len(annotations := step.annotations) < hot.MAX_STEP_ANNOTATIONS:
                            annotations.append((_BACKWARD, start, end, depth, None))
                        else:
                            hot._close_region(_BACKWARD, start, end, step, depth, None)
                    else:
                        hot._close_region(_BACKWARD, start, end, None, 0, None)
                    timer = inst.device_timer
                    if timer is not None:
                        timer.end(_BACKWARD)
                except Exception as exc:  # StopTraining included: nothing here raises it on purpose
                    inst.failed("backward", exc)

    return backward


def _patch_backward(steps: Any) -> None:
    """Patch ``Tensor.backward`` once per process: the C wrapper when the extension is there (it hands what it
    does not handle to the Python one), else the Python one. ``steps``: the newest instrumentation's. And
    ``GradScaler`` (:func:`_patch_grad_scaler`)."""
    global _original_backward, _native_backward
    if _original_backward is None:
        _original_backward = torch.Tensor.backward
        patched = _patched_backward(_original_backward)
        if steps is not None:
            patched = _native_backward = _native.Backward(None, _original_backward, patched)
        torch.Tensor.backward = patched  # type: ignore[method-assign]
        _patch_grad_scaler()
    if _native_backward is not None:
        _native_backward.steps = steps


def _unpatch_backward() -> None:
    global _original_backward, _native_backward
    if _original_backward is not None:
        torch.Tensor.backward = _original_backward  # type: ignore[method-assign]
        _original_backward = None
        _native_backward = None
    _unpatch_grad_scaler()
    _scaled[0] = None


_original_scaler: tuple[type, Callable[..., Any], Callable[..., Any]] | None = None
"""``GradScaler`` and its own ``__init__`` and ``step`` while patched."""
_original_scales: dict[type, Callable[..., Any]] = {}
"""Each scaler class with its own ``scale()`` (``GradScaler``, FSDP's ``ShardedGradScaler``, a user's) and that
``scale`` while patched."""


def _wrap_scale(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def scale(self: Any, outputs: Any) -> Any:
        scaled = original(self, outputs)
        if scaled is not outputs and isinstance(outputs, _Tensor) and isinstance(scaled, _Tensor) and _active:
            try:
                if outputs.numel() == 1:
                    _scaled[0] = (weakref.ref(scaled), outputs.detach())
            except Exception:  # a tensor subclass without weak references: the loss stays scaled
                pass
        return scaled

    return scale


def _patch_scales(cls: type, base: type) -> None:
    """Wrap the ``scale()`` of ``cls`` and of the classes between it and ``base`` that define their own."""
    for klass in cls.__mro__:
        own = klass.__dict__.get("scale")
        if own is not None and klass not in _original_scales and callable(own) and issubclass(klass, base):
            _original_scales[klass] = own
            klass.scale = _wrap_scale(own)  # type: ignore[attr-defined]


def _patch_grad_scaler() -> None:
    """``torch.amp.GradScaler`` (the base of ``torch.cuda.amp.GradScaler`` and FSDP's ``ShardedGradScaler``):
    ``scale()`` notes the loss it was given, so that ``backward()`` on the scaled tensor records that loss (see
    ``_scaled``), and ``step()`` ends the step even when it skipped ``optimizer.step()`` (inf/NaN gradients): the
    iteration ends there all the same. Subclasses with their own ``scale()`` are wrapped too: those imported
    already now, the others when their first instance is made."""
    global _original_scaler
    try:
        from torch.amp.grad_scaler import GradScaler
    except ImportError:  # an older torch: the loss is recorded scaled, a skipped update does not end the step
        return
    if _original_scaler is not None:
        return
    original_init, original_step = GradScaler.__init__, GradScaler.step

    @functools.wraps(original_init)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if type(self) not in _original_scales:
            with contextlib.suppress(Exception):
                _patch_scales(type(self), GradScaler)

    @functools.wraps(original_step)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        result = original_step(self, optimizer, *args, **kwargs)
        inst: _OptimizerHooks | None = _active[-1] if _active and hot._active is not None else None
        if inst is not None:
            inst.guarded("optimizer", inst.scaler_stepped, optimizer)
        return result

    pending = [GradScaler]
    while pending:
        cls = pending.pop()
        _patch_scales(cls, GradScaler)
        pending.extend(cls.__subclasses__())
    GradScaler.__init__ = init  # type: ignore[method-assign]
    GradScaler.step = step  # type: ignore[method-assign]
    _original_scaler = (GradScaler, original_init, original_step)


def _unpatch_grad_scaler() -> None:
    global _original_scaler
    if _original_scaler is not None:
        cls, original_init, original_step = _original_scaler
        cls.__init__ = original_init  # type: ignore[misc]
        cls.step = original_step  # type: ignore[attr-defined]
        for klass, original in _original_scales.items():
            klass.scale = original  # type: ignore[attr-defined]
        _original_scales.clear()
        _original_scaler = None
