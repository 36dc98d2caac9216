"""What every hook of one PyTorch instrumentation shares (:class:`_Hooks`): its settings and automatic steps,
failure handling (a hook that raises is removed and counted; training goes on), the hand-over of a step from the
C hot path to Python, and CUDA device timing around regions.

The hooks that run every step (fetch, forward, backward, optimizer) are written for the training loop, where
their code is cold in the CPU caches and each call, thread-local read and allocation shows: the automatic step's
usual case is tested inline before calling _AutoSteps.begin, regions are (start_ns, step, depth) tuples
(hot._begin_region / hot._end_region) instead of hot._Region objects, scalars go straight into the step they
belong to (hot._record_into).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from otelprof import semconv as sc
from otelprof._log import warn_once
from otelprof.integrations import cuda_timing, torch_profiler
from otelprof.integrations.cuda_timing import DeviceTimer
from otelprof.integrations.torch_scalars import _batch_size, _cuda_memory_if_initialized, _learning_rate, _scaled
from otelprof.integrations.torch_state import (
    _BACKWARD,
    _DATALOADER,
    _FORWARD,
    _LEARNING_RATE,
    _LOSS,
    _NATIVE_KINDS,
    _OPTIMIZER,
    _SAMPLES,
    HOOK_CUDA_EVENTS,
    HOOK_NATIVE,
    _cuda_globals,
    _grad_enabled,
    _native,
    _native_wanted,
    _OpenRegion,
    _Sum,
    _Tensor,
    _with_registry,
)
from otelprof.integrations.torch_steps import _AutoSteps
from otelprof.runtime import hotpath as hot


class _Nesting(threading.local):
    """Module calls in progress on this thread (``add_everything``: only top-level calls are forwards)."""

    value = 0


class _Undecided:
    """``device_timer`` until a forward shows where the model lives; regions before it get no device time."""

    def begin(self, region: str) -> None:
        return None

    def end(self, region: str) -> None:
        return None


_UNDECIDED = _Undecided()


class _Hooks:
    """One instrumentation's state and what all its hooks share. The hook families are its subclasses (data loader:
    :mod:`~otelprof.integrations.torch_dataloader`, model: ``torch_forward``, DDP: ``torch_ddp``, optimizer:
    ``torch_optimizer``; ``backward`` is ``Tensor.backward``'s patch, ``torch_backward``), and
    :class:`~otelprof.integrations.torch.TorchInstrumentation` is all of them."""

    def __init__(self, grad_norm: bool, loss: bool, count_samples: bool) -> None:
        self.grad_norm = grad_norm
        self.loss = loss
        self.count_samples = count_samples
        self.closed = False
        self.auto = _AutoSteps()
        self._removers: dict[str, list[Callable[[], None]]] = {}
        # Stacks (a forward or backward may run inside another): deques, as a list shrinks and grows its
        # storage when it goes from one item to none and back, every step.
        self._forward_regions: deque[_OpenRegion] = deque()
        self._optimizer_region: _OpenRegion | None = None
        self._optimizer_depth = 0
        self._closure_evaluated = False
        """A ``backward()`` ran inside the current ``optimizer.step(closure)``: the closure's first evaluation, whose
        loss is what ``step()`` returns, gave the step's loss; the line search's further evaluations give none."""
        self.backward_off = False
        """The backward hook failed: ``Tensor.backward`` stays patched (other instrumentations may share it)
        but this one no longer times it."""
        self._global_depth = _Nesting()
        self.models: weakref.WeakSet[Any] = weakref.WeakSet()
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._optimizer_index: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        """Several optimizers: each one's number in its loss's name (``sc.optimizer_loss``), in stepping order."""
        self.windows = torch_profiler.windows
        self.device_timer: DeviceTimer | _Undecided | None = _UNDECIDED
        """CUDA event timing: decided at the first forward of a module with parameters; None on CPU."""
        self.native: Any = None
        """The C hot path's ``Steps`` (``_torch_native``), or None: the Python hooks do all the work."""
        if _native_wanted():
            self.native = _native.Steps(
                vars(hot), (_DATALOADER, _FORWARD, _BACKWARD, _OPTIMIZER), (_SAMPLES, _LOSS, _LEARNING_RATE),
                self._materialise, self._native_failed,
                {"batch_size": _batch_size, "learning_rate": _learning_rate, "cuda_memory": _cuda_memory_if_initialized,
                 "cuda_globals": _cuda_globals, "tensor_type": _Tensor, "sum_type": _Sum, "scaled": _scaled,
                 "grad_enabled": _grad_enabled})
        self._wrapped_models = 0
        self._hooked_models = 0
        self._comm_hooked = False
        self._hook_failed = False
        self.handed_over = ""
        """The trainer whose callback ``otelprof run`` attached and put in charge of steps (:meth:`hand_over`)."""
        self._global_removers: list[Callable[[], None]] = []
        """Undo the global hooks of :meth:`add_everything` (also listed under their hook names)."""

    # ------------------------------------------------------------------ failure handling
    def guarded(self, hook: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run hook code; on error remove that hook, count it, warn once, and carry on."""
        try:
            return fn(*args)
        except hot.StopTraining:
            raise
        except Exception as exc:
            self.failed(hook, exc)
            return None

    def failed(self, hook: str, exc: Exception) -> None:
        """A hook raised: remove it, count it, warn once; training goes on."""
        self._remove_hook(hook)
        if hook == "backward":
            self.backward_off = True
        if hook == "forward":  # device times are read at each forward: without it the timer would only fill
            self._close_device_timer()
        if hook == "optimizer":  # its step() no longer ends steps: each fetch (or forward) does
            self.auto.by_optimizer = False
        self._hook_failed = True
        self.sync_native()
        _with_registry(lambda r: r.counter(sc.INTEGRATION_ERRORS).add(1, (hook,)))
        warn_once(f"torch-hook:{hook}", "otelprof: the %s hook failed (%r) and was removed; training goes on "
                  "without it", hook, exc)

    # ------------------------------------------------------------------ the C hot path
    def sync_native(self) -> None:
        """Turn the C hot path on where it does exactly what the Python hooks would: the plain automatic step
        of a model whose forward this instance wraps, ended by a hooked optimizer, on CPU, without gradient
        norm, DDP communication hook, global hooks (``otelprof run``), second optimizer or a failed hook. Anything
        else the C hooks hand to the Python ones."""
        native = self.native
        if native is None:
            return
        native.loss = self.loss
        native.count_samples = self.count_samples
        native.enabled = (not self.closed and not self.grad_norm and self.device_timer is None
                          and self.auto.by_optimizer and len(self.optimizers) < 2 and not self.auto.several
                          and self._wrapped_models > 0 and not self._hooked_models
                          and not self._comm_hooked and not self._hook_failed and not self.backward_off
                          and "everything" not in self._removers)

    def _materialise(self) -> None:
        """Hand the step the C hooks hold over to Python: it becomes the thread's StepContext and this
        instance's automatic step, as if the Python hooks had opened it (``hot._native`` calls this)."""
        native = self.native
        state = native.take() if native is not None else None
        if state is None:
            return
        phase, number, start_ns, annotations, scalars, depth, leader, saw_backward, saw_work, optimizer = state
        step: hot.StepContext = hot._new_object(hot.StepContext)
        step.phase, step.number, step.start_ns = phase, number, start_ns
        step.annotations, step.scalars, step.closed, step.depth = annotations, scalars, False, depth
        step._previous = hot._tls.step
        hot._tls.step = step
        auto = self.auto
        auto.current, auto.leader = step, _NATIVE_KINDS[leader]
        # the C hooks hold training steps only: their work (a training forward, backward, optimizer) is training
        auto.saw_backward, auto.saw_work, auto.trained = bool(saw_backward), bool(saw_work), bool(saw_work)
        auto.eval_module = auto.retagged = auto.pending = None
        auto.slow = False
        if optimizer is not None:  # inside optimizer.step(): the post-hook ends the region
            optimizer_start, optimizer_depth, self._optimizer_depth, closure_evaluated = optimizer
            self._closure_evaluated = bool(closure_evaluated)
            self._optimizer_region = (optimizer_start, step, optimizer_depth)
        native.adopt(step)

    def _native_failed(self, exc: BaseException) -> None:
        """The C hot path failed: it is off for good (its open step dropped), the Python hooks carry on."""
        _with_registry(lambda r: r.counter(sc.INTEGRATION_ERRORS).add(1, (HOOK_NATIVE,)))
        warn_once("torch-hook:native", "otelprof: the C hot path failed (%r) and was turned off; the Python hooks "
                  "carry on", exc)

    def _remove_hook(self, hook: str) -> None:
        for remove in self._removers.pop(hook, []):
            with contextlib.suppress(Exception):
                remove()

    def _on_remove(self, hook: str, remove: Callable[[], None]) -> None:
        self._removers.setdefault(hook, []).append(remove)

    # ------------------------------------------------------------------ device time (CUDA events)
    def _decide_device_timer(self, module: Any) -> DeviceTimer | None:
        """A :class:`DeviceTimer` when ``module`` lives on a CUDA device, else None for good; undecided while
        modules without parameters or buffers run."""
        backend = cuda_timing.backend
        try:
            on_cuda = backend.on_cuda(module)
            if on_cuda is None:
                return None
            timer = DeviceTimer(backend, self._device_timer_failed, self._device_pairs_dropped) \
                if on_cuda and backend.available() else None
        except Exception as exc:
            self._device_timer_failed(exc)
            return None
        self.device_timer = timer
        self.sync_native()
        return timer

    def time_device_of(self, module: Any) -> None:
        """For trainer callbacks, which time the forward themselves: decide device timing from ``module`` (the
        backward and optimizer regions this instance times then get device times too)."""
        if isinstance(self.device_timer, _Undecided) and isinstance(module, torch.nn.Module):
            self._decide_device_timer(module)

    def device_begin(self, region: str, poll: bool = False) -> None:
        """A callback's region begins: its device-time marker (``poll``: once per iteration, first)."""
        timer = self.device_timer
        if isinstance(timer, DeviceTimer):
            if poll:
                timer.poll()
            timer.begin(region)

    def device_end(self, region: str) -> None:
        timer = self.device_timer
        if isinstance(timer, DeviceTimer):
            timer.end(region)

    def _close_device_timer(self) -> None:
        timer, self.device_timer = self.device_timer, None
        if isinstance(timer, DeviceTimer):
            timer.close()
        self.sync_native()

    def _device_timer_failed(self, exc: Exception) -> None:
        self.device_timer = None
        self.sync_native()
        _with_registry(lambda r: r.counter(sc.INTEGRATION_ERRORS).add(1, (HOOK_CUDA_EVENTS,)))
        warn_once(f"torch-hook:{HOOK_CUDA_EVENTS}", "otelprof: CUDA event timing failed (%r) and was turned off; "
                  "device times are not measured, host times go on", exc)

    def _device_pairs_dropped(self, count: int) -> None:
        _with_registry(lambda r: r.counter(sc.EXPORTER_DROPPED).add(count, (cuda_timing.DROPPED_LABEL,)))
        warn_once("torch:cuda-events-dropped", "otelprof: more than %d CUDA event pairs waited for the GPU; the "
                  "oldest are dropped and counted (their device times are lost)", cuda_timing.PENDING_PAIRS)

    # ------------------------------------------------------------------ the step left open
    def end_open_step(self) -> None:
        """End the automatic step open on this thread, if it holds work (a forward, backward or optimizer step)."""
        native = self.native
        if native is not None and native.open:
            self._materialise()
        auto = self.auto
        current = auto.current
        if current is not None and hot._tls.step is current:
            if auto.saw_work:
                auto.close()
            else:
                auto.cancel()
