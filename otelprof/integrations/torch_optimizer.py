"""The ``optimizer`` region: ``optimizer.step()`` timed by its step hooks. Its end ends the automatic step (with
several optimizers, the iteration's last update does) and records the learning rate, CUDA memory and, when asked
for, the gradient norm; a ``GradScaler`` that skips the update ends the step all the same."""

from __future__ import annotations

import functools
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

import torch

from otelprof import semconv as sc
from otelprof._log import warn_once
from otelprof.integrations.torch_hooks import _Hooks
from otelprof.integrations.torch_scalars import _cuda_memory_if_initialized, _learning_rate
from otelprof.integrations.torch_state import (
    _LEARNING_RATE,
    _LOSS,
    _OPTIMIZER,
    OPTIMIZER,
    _cuda_globals,
    _native,
    _Sum,
)
from otelprof.integrations.torch_steps import _AutoSteps
from otelprof.runtime import hotpath as hot


class _OptimizerHooks(_Hooks):
    """The optimizer hooks of an instrumentation."""

    def _optimizer_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Before ``optimizer.step()``: the gradient norm when asked for, begins the ``optimizer`` region."""
        try:
            self._optimizer_depth += 1
            if self._optimizer_depth > 1:
                return  # a subclass's step() calling super().step(): both are wrapped, time the outer one
            self._closure_evaluated = False
            auto = self.auto
            auto.by_optimizer = True  # (already, unless otelprof run's hooks met an optimizer made before them)
            if auto.stepped != id(optimizer) and auto.stepped and not auto.several:
                auto.several = True  # a second optimizer steps (one made before otelprof run's hooks, say)
                self.sync_native()
            step = hot._tls.step
            if step is None:
                step = auto.begin(OPTIMIZER, step)
            elif step is auto.current and (auto.leader == OPTIMIZER or auto.slow):
                step = auto.next_update(optimizer, step) if auto.pending is not None else auto.begin(OPTIMIZER, step)
            auto.saw_work = auto.trained = True
            if self.grad_norm:
                grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
                if grads:
                    norms = torch.stack([torch.linalg.vector_norm(g.detach()) for g in grads])
                    hot.record(sc.SCALAR_GRAD_NORM, torch.linalg.vector_norm(norms))
            timer = self.device_timer
            if timer is not None:
                timer.begin(_OPTIMIZER)
            if step is None:  # hot._begin_region inline
                self._optimizer_region = (perf_counter_ns(), None, 0)
            else:
                depth = step.depth
                step.depth = depth + 1
                self._optimizer_region = (perf_counter_ns(), step, depth)
        except hot.StopTraining:
            raise
        except Exception as exc:
            self.failed("optimizer", exc)

    def _optimizer_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """After ``optimizer.step()``: ends the ``optimizer`` region, records the learning rate (and CUDA
        memory), closes the automatic step."""
        try:
            nesting = self._optimizer_depth - 1
            if nesting > 0:
                self._optimizer_depth = nesting
                return
            self._optimizer_depth = 0
            region = self._optimizer_region
            if region is None:
                step = hot._tls.step
            else:
                self._optimizer_region = None
                start, step, depth = region  # the step open at optimizer.step(): the one open now
                end = perf_counter_ns()  # hot._end_region inline
                if step is not None:
                    step.depth = depth
                    if not step.closed and len(annotations := step.annotations) < hot.MAX_STEP_ANNOTATIONS:
                        annotations.append((_OPTIMIZER, start, end, depth, None))
                    else:
                        hot._close_region(_OPTIMIZER, start, end, step, depth, None)
                else:
                    hot._close_region(_OPTIMIZER, start, end, None, 0, None)
            timer = self.device_timer
            if timer is not None:
                timer.end(_OPTIMIZER)
            try:
                groups = optimizer.param_groups  # not getattr(): a plain attribute read is much cheaper
            except AttributeError:
                groups = None
            if groups and "lr" in (group := groups[0]):
                lr = group["lr"]
                if type(lr) is not float:  # a float (the usual) as it is
                    lr = _learning_rate(lr)
                if step is not None and hot._active is not None:  # hot._record_into inline
                    if step.scalars is None:
                        step.scalars = {_LEARNING_RATE: lr}
                    else:
                        step.scalars[_LEARNING_RATE] = lr
                else:
                    hot.record(_LEARNING_RATE, lr)
            # torch.cuda.is_initialized() is a call into torch every step: its module's flag says False
            # sooner on a CPU run (a torch without the flag: always ask).
            if _cuda_globals.get("_initialized", True):
                _cuda_memory_if_initialized()
            auto = self.auto
            current = auto.current
            if current is not None:
                if auto.several:
                    self._updated(optimizer, step, perf_counter_ns())
                else:  # _AutoSteps.close() inline (the pre-hook left no eval step, nothing pending)
                    auto.current = auto.eval_module = None
                    auto.stepped = id(optimizer)
                    if step is current:
                        current.__exit__(None, None, None)
        except hot.StopTraining:
            raise
        except Exception as exc:
            self.failed("optimizer", exc)

    def _updated(self, optimizer: Any, step: hot.StepContext | None, end: int) -> None:
        """One optimizer's update ended (its ``step()``, or a ``GradScaler`` skipping it) with several optimizers: the
        losses given to ``backward()`` since the step's previous update are also this optimizer's own
        (``loss_optimizer_<n>``); the step ends here if this optimizer is known to end iterations, else waits."""
        auto = self.auto
        current = auto.current
        auto.stepped = id(optimizer)
        scalars = current.scalars if current is not None else None
        if scalars is not None and type(total := scalars.get(_LOSS)) is _Sum:
            mark = auto.loss_mark if auto.loss_step is current else 0
            index = self._optimizer_index.get(optimizer)
            if index is None:
                index = self._optimizer_index[optimizer] = len(self._optimizer_index)
            if len(total) > mark and index < sc.MAX_OPTIMIZER_LOSSES:
                name = sc.optimizer_loss(index)
                own = scalars.get(name)
                if type(own) is _Sum:
                    own.extend(total[mark:])  # the same optimizer again in the iteration (several critic updates)
                else:
                    scalars[name] = total[mark:]
            auto.loss_step, auto.loss_mark = current, len(total)
        if step is current and (optimizer in auto.not_last or optimizer not in auto.last):
            auto.pending, auto.pending_end, auto.slow = optimizer, end, True
        else:
            auto.close()

    def scaler_stepped(self, optimizer: Any) -> None:
        """After ``GradScaler.step(optimizer)``: a step still open with a backward in it ends here — the scaler
        skipped ``optimizer.step()`` (inf/NaN gradients), whose hook would have ended it — unless that step went
        on to the next optimizer's."""
        native = self.native
        if native is not None and native.open:
            self._materialise()
        auto = self.auto
        optimizer = _unwrap_optimizer(optimizer)
        if auto.pending is not None and auto.pending is optimizer:
            return
        current = auto.current
        if current is not None and auto.saw_backward and hot._tls.step is current:
            if auto.several:
                self._updated(optimizer, current, perf_counter_ns())
            else:
                auto.close()

    def optimizer_begin(self, optimizer: Any) -> None:
        """What the optimizer step pre-hook does (a failure removes the optimizer hooks)."""
        self._optimizer_pre_hook(optimizer, (), {})

    def optimizer_end(self, optimizer: Any) -> None:
        """What the optimizer step post-hook does (a failure removes the optimizer hooks)."""
        self._optimizer_post_hook(optimizer, (), {})

    def add_optimizer(self, optimizer: Any) -> None:
        optimizer = _unwrap_optimizer(optimizer)
        if optimizer in self.optimizers:
            return
        if not hasattr(optimizer, "register_step_pre_hook"):
            warn_once("torch:optimizer", "otelprof: instrument(optimizer=...) expects a torch.optim.Optimizer, got "
                      "%s; ignored", type(optimizer).__name__)
            return
        pre_hook: Any = self._optimizer_pre_hook
        post_hook: Any = self._optimizer_post_hook
        if self.native is not None:
            pre_hook = _native.OptimizerHook(self.native, pre_hook, False)
            post_hook = _native.OptimizerHook(self.native, post_hook, True)
        try:
            pre = optimizer.register_step_pre_hook(pre_hook)
        except Exception as exc:  # an Optimizer subclass that skipped Optimizer.__init__, and kept no wrapped one
            warn_once("torch:optimizer-hooks", "otelprof: cannot hook %s.step() (%s); no optimizer region, and "
                      "steps end at the next fetch", type(optimizer).__name__, exc)
            return
        post = optimizer.register_step_post_hook(post_hook)
        self.optimizers.add(optimizer)
        self.auto.by_optimizer = True
        if len(self.optimizers) > 1:
            self.auto.several = True
        self._on_remove("optimizer", pre.remove)
        self._on_remove("optimizer", post.remove)


def _unwrap_optimizer(optimizer: Any) -> Any:
    """The optimizer whose ``step()`` does the work: a wrapper that is an ``Optimizer`` without its state
    (accelerate's ``AcceleratedOptimizer``: ``step()`` calls the wrapped one's, only on steps that apply
    the gradients) gives the wrapped one."""
    inner = getattr(optimizer, "optimizer", None)
    if (inner is not None and inner is not optimizer and hasattr(inner, "register_step_pre_hook")
            and "_optimizer_step_pre_hooks" not in getattr(optimizer, "__dict__", {})):
        return inner
    return optimizer


_original_optimizer_init: Callable[..., Any] | None = None


def _patch_optimizer_class(auto: _AutoSteps) -> None:
    """``Optimizer.__init__`` tells ``auto`` that an optimizer exists, and when a second one does (``otelprof run``)."""
    global _original_optimizer_init
    from torch.optim import Optimizer

    if _original_optimizer_init is not None:
        return
    original = _original_optimizer_init = Optimizer.__init__
    made = [0]

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        auto.by_optimizer = True
        made[0] += 1
        if made[0] > 1:
            auto.several = True

    Optimizer.__init__ = __init__  # type: ignore[method-assign]


def _unpatch_optimizer_class() -> None:
    global _original_optimizer_init
    from torch.optim import Optimizer

    if _original_optimizer_init is not None:
        Optimizer.__init__ = _original_optimizer_init  # type: ignore[method-assign]
        _original_optimizer_init = None
