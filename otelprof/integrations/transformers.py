"""Hugging Face ``Trainer``: ``Trainer(..., callbacks=[otelprof.integrations.transformers.OtelprofCallback()])``.

Maps the ``Trainer``'s own events to otelprof's (``pip install otelprof[hf]``: ``transformers`` with
``accelerate``):

* **train steps** — one per optimizer step (``state.global_step``): from the fetch of the step's first
  batch (the ``Trainer`` fetches all ``gradient_accumulation_steps`` batches first) to ``on_step_end``, or
  to ``on_log`` on a logging step (so the logged values land in that step).
* **regions** — ``dataloader`` (each ``next()`` on the training loader; under accelerate its base loader,
  which runs one batch ahead), ``forward`` (the model's forward call, once per micro-batch), and through
  :mod:`otelprof.integrations.torch` ``backward`` (``Tensor.backward``) and ``optimizer``
  (``optimizer.step()``). Gradient clipping, the scheduler step and ``zero_grad`` count in the step only.
* **eval steps** — one per evaluation batch (``on_prediction_step``), phase ``eval`` (``evaluate()`` and
  ``predict()``): from the end of the previous batch (the first: its forward) to ``on_prediction_step``;
  the time before the model's forward is the ``dataloader`` region (fetch and transfer to the device).
* **scalars** — ``loss``: the step's training loss as the ``Trainer`` counts it (from the model output's
  ``loss``: the mean over the step's micro-batches, or their sum when the ``Trainer`` passes the model
  ``num_items_in_batch`` and so does not divide; from the logs when the model returns no loss); ``learning_rate`` of the
  optimizer; ``grad_norm`` on logging steps (from the logs); ``samples`` (batch size summed over the
  step); in phase ``eval`` each batch's loss and the evaluation's ``eval_loss``.

The callback starts otelprof (``otelprof.init(**init_kwargs)``) when no session runs and shuts that
session down at the end of ``train()`` (or of an ``evaluate()``/``predict()`` outside training;
``shutdown=False``: flush only); a session the user started is left running. A stop request sets
``control.should_training_stop``. A failing part of the callback is counted in
``otelprof.integration.errors``, warned about once and turned off; training goes on.
"""

from __future__ import annotations

import weakref
from time import perf_counter_ns
from typing import Any

import torch
from transformers import TrainerCallback

from otelprof import semconv as sc
from otelprof.integrations._trainer import (
    PART_CALLBACK,
    PART_SCALARS,
    PART_TEARDOWN,
    SessionOwner,
    StepTracker,
    batch_size,
    open_step,
    torch_instrumentation,
    warn_if_torch_hooked,
)
from otelprof.runtime import hotpath as hot

__all__ = ["OtelprofCallback"]

EVAL_PHASE = "eval"


def _output_loss(output: Any) -> Any:
    """The scalar ``loss`` of a model output (``ModelOutput`` or dict), detached; else None."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss.detach()
    return None


def _number(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) and value.device.type == "cpu" else value


class OtelprofCallback(TrainerCallback):  # type: ignore[misc]
    """Steps, phases, regions and training scalars of a ``Trainer`` run (see the module docstring).

    ``init_kwargs`` go to ``otelprof.init()`` when the callback starts the session itself."""

    def __init__(self, *, shutdown: bool = True, **init_kwargs: Any) -> None:
        self.owner = SessionOwner(init_kwargs, shutdown)
        self.tracker = StepTracker("transformers")
        self._model: weakref.ref[Any] | None = None
        self._model_hooks: list[Any] = []
        self._torch: Any = None
        """The ``otelprof.torch`` instrumentation this callback created (removed at the end of training)."""
        self.tracker.undo = self._undo
        self._training = False
        self._close_at_log = False
        self._loss_recorded = False
        self._scaled = False
        self._eval_forward: tuple[int, int] | None = None
        self._eval_forward_start: int | None = None
        self._eval_loss: Any = None
        self._eval_samples: int | None = None
        self._eval_mark: int | None = None
        self._previous_phase: str | None = None

    # ------------------------------------------------------------------ model hooks
    def _hook_model(self, model: Any) -> None:
        if model is None or not isinstance(model, torch.nn.Module):
            return
        if self._model is not None and self._model() is model:
            return
        self._unhook_model()
        self._model = weakref.ref(model)
        self._model_hooks = [
            model.register_forward_pre_hook(self._forward_pre, with_kwargs=True),
            model.register_forward_hook(self._forward_post, with_kwargs=True),
        ]

    def _unhook_model(self) -> None:
        hooks, self._model_hooks = self._model_hooks, []
        for hook in hooks:
            hook.remove()
        self._model = None

    def _forward_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._forward_begin, module, kwargs)

    def _forward_begin(self, module: Any, kwargs: Any) -> None:
        tracker = self.tracker
        if module.training:
            if tracker.step is not None:
                self._scaled = "num_items_in_batch" in kwargs
                tracker.add_samples(tracker.guarded(PART_SCALARS, batch_size, kwargs))
                tracker.begin(sc.REGION_FORWARD)
        else:
            self._eval_samples = tracker.guarded(PART_SCALARS, batch_size, kwargs)
            self._eval_forward_start = perf_counter_ns()

    def _forward_post(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._forward_end, module, output)

    def _forward_end(self, module: Any, output: Any) -> None:
        tracker = self.tracker
        if module.training:
            if tracker.step is None:
                return
            tracker.end(sc.REGION_FORWARD)
            loss = tracker.guarded(PART_SCALARS, _output_loss, output)
            if loss is not None:
                tracker.loss_parts.append(loss)
        elif self._eval_forward_start is not None:
            self._eval_forward = (self._eval_forward_start, perf_counter_ns())
            self._eval_forward_start = None
            self._eval_loss = tracker.guarded(PART_SCALARS, _output_loss, output)

    # ------------------------------------------------------------------ lifecycle
    def on_init_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._hook_model, model)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       train_dataloader: Any = None, **kwargs: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._train_begin, model, optimizer, train_dataloader)

    def _train_begin(self, model: Any, optimizer: Any, train_dataloader: Any) -> None:
        self.owner.ensure()
        self._training = True
        if hot._active is None:
            return
        from otelprof.integrations import torch as otorch

        self._hook_model(model)
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
        before = torch_instrumentation()
        warn_if_torch_hooked("transformers", before, optimizers=False)
        inst = otorch.instrument(optimizer=inner if hasattr(inner, "register_step_pre_hook") else None,
                                 loss=False, count_samples=False)  # backward + optimizer regions, the lr
        if before is None:
            self._torch = inst
        self.tracker.device = inst  # its CUDA event timer times the forward too
        inst.time_device_of(model)
        if train_dataloader is not None:
            self.tracker.time_fetches(train_dataloader)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tracker.guarded(PART_TEARDOWN, self._train_end)

    def _train_end(self) -> None:
        self._close_train_step()
        self._training = False
        self.tracker.restore_loaders()
        self.tracker.pending.clear()
        self._remove_torch_hooks()
        self.owner.end()

    def _remove_torch_hooks(self) -> None:
        inst, self._torch = self._torch, None
        self.tracker.device = None
        if inst is not None:
            inst.uninstrument()

    def _undo(self) -> None:
        """The callback turned itself off: remove its model hooks and the ``otelprof.torch`` hooks it added."""
        self._unhook_model()
        self._remove_torch_hooks()

    # ------------------------------------------------------------------ training steps
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._step_begin)

    def _step_begin(self) -> None:
        if self._close_at_log:  # a logging step whose on_log never came
            self._close_train_step()
        self.tracker.open()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._step_end, control)

    def _step_end(self, control: Any) -> None:
        tracker = self.tracker
        tracker.end(sc.REGION_FORWARD)
        parts = tracker.take_loss_parts()
        if parts and tracker.on and open_step() is not None:
            # What the Trainer adds to its loss: each micro-batch's loss / their number, unless the model
            # already normalized by num_items_in_batch across them.
            loss = parts[0] if len(parts) == 1 else torch.stack(parts).sum() if self._scaled \
                else torch.stack(parts).mean()
            hot.record("loss", _number(loss))
            self._loss_recorded = True
        else:
            self._loss_recorded = False
        session = _session()
        if session is not None and session.should_stop():
            control.should_training_stop = True
        if getattr(control, "should_log", False) and tracker.step is not None:
            self._close_at_log = True  # the logs of this step come next
        else:
            self._close_train_step()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._log, logs)

    def _log(self, logs: Any) -> None:
        if not self._close_at_log:
            return
        if isinstance(logs, dict) and open_step() is self.tracker.step:
            self.tracker.guarded(PART_SCALARS, self._log_scalars, logs)
        self._close_train_step()

    def _log_scalars(self, logs: dict[str, Any]) -> None:
        if isinstance(logs.get("grad_norm"), (int, float)):
            hot.record("grad_norm", float(logs["grad_norm"]))
        if not self._loss_recorded and isinstance(logs.get("loss"), (int, float)):
            hot.record("loss", float(logs["loss"]))

    def _close_train_step(self) -> None:
        self._close_at_log = False
        self.tracker.close()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._epoch_end)

    def _epoch_end(self) -> None:
        self._close_train_step()  # a logging step's on_log came before this, if at all
        self.tracker.pending.clear()

    # ------------------------------------------------------------------ evaluation and prediction
    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._prediction_step)

    def _prediction_step(self) -> None:
        now = perf_counter_ns()
        forward, self._eval_forward = self._eval_forward, None
        loss, self._eval_loss = self._eval_loss, None
        samples, self._eval_samples = self._eval_samples, None
        mark, self._eval_mark = self._eval_mark, now
        if self._close_at_log:
            self._close_train_step()
        if hot._active is None and not self._training:
            self.owner.ensure()  # evaluate() or predict() outside train()
        tracker = self.tracker
        if not tracker.on:
            return
        if self._previous_phase is None:
            self._previous_phase = hot.current_phase()
            hot.phase(EVAL_PHASE)
        start = mark if mark is not None else forward[0] if forward is not None else now
        tracker.open(EVAL_PHASE, start_ns=start)
        if forward is not None:
            if mark is not None:
                tracker.add_region(sc.REGION_DATALOADER, mark, forward[0])
            tracker.add_region(sc.REGION_FORWARD, forward[0], forward[1])
        if loss is not None:
            hot.record("loss", _number(loss))
        tracker.add_samples(samples)
        tracker.close()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        self.tracker.guarded(PART_TEARDOWN, self._evaluation_end, metrics, "eval_loss")

    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        self.tracker.guarded(PART_TEARDOWN, self._evaluation_end, metrics, "test_loss")

    def _evaluation_end(self, metrics: Any, loss_key: str) -> None:
        self._eval_mark = self._eval_forward = self._eval_forward_start = self._eval_loss = None
        self._eval_samples = None
        previous, self._previous_phase = self._previous_phase, None
        if hot._active is not None:
            value = metrics.get(loss_key) if isinstance(metrics, dict) else None
            if isinstance(value, (int, float)) and previous is not None:
                hot.record("loss", float(value))  # outside steps: phase eval, the evaluation's mean loss
            if previous is not None:
                hot.phase(previous)
        if not self._training:
            self.owner.end()


def _session() -> Any:
    from otelprof.runtime.session import get_session

    return get_session()
