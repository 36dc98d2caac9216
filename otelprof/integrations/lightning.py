"""Lightning: ``Trainer(callbacks=[otelprof.integrations.lightning.OtelprofCallback()])``.

Maps Lightning's own events to otelprof's (``pip install otelprof[lightning]``; ``lightning`` 2.x, or
``pytorch_lightning`` 2.x when ``lightning`` is not installed):

* **train steps** — one per optimizer step: from the batch fetch (``dataloader`` region) through
  ``on_train_batch_start`` to ``on_train_batch_end`` of the batch whose optimizer step ran, so
  ``accumulate_grad_batches=N`` gives one step per N batches (manual optimization: per ``optimizer.step()``).
* **regions** — ``dataloader`` (each ``next()`` on a ``DataLoader`` while the trainer runs),
  ``forward`` (``training_step``: from the batch start to ``on_before_backward``, with Lightning's
  ``zero_grad`` when it runs there), ``backward`` (``Tensor.backward``, timed by
  :mod:`otelprof.integrations.torch`), ``optimizer`` (``on_before_optimizer_step`` to the end of
  ``optimizer.step()``: the update, after the closure that ran ``training_step`` and backward).
* **eval steps** — one per validation batch in phase ``eval`` (``test``, ``predict`` for those loops),
  from its fetch to ``on_validation_batch_end``: ``dataloader``, then ``validation_step`` as ``forward``.
  A loader that is not a ``DataLoader`` has no timed fetch: the step starts where the previous batch
  ended (the first: at the loop's start) and that wait is its ``dataloader`` region. The sanity check is
  one ``sanity_check`` region, not steps.
* **scalars** — ``loss``: the step's loss as Lightning reports it (the sum over the step's batches of
  ``training_step``'s loss divided by ``accumulate_grad_batches``; a validation step's returned loss);
  ``learning_rate`` of the first parameter group; ``samples`` (the batches' first dimension, summed over the
  step); ``grad_norm`` with ``grad_norm=True``.

The callback starts otelprof (``otelprof.init(**init_kwargs)``) when no session runs, and shuts that
session down at the end of the trainer's ``fit``/``validate``/``test`` (``shutdown=False``: flush only);
a session the user started is left running. A stop request (alert action, control endpoint) sets
``trainer.should_stop``. A failing part of the callback is counted in ``otelprof.integration.errors``,
warned about once and turned off; training goes on.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

import torch

from otelprof import semconv as sc
from otelprof.integrations._trainer import (
    PART_CALLBACK,
    PART_SCALARS,
    PART_TEARDOWN,
    SessionOwner,
    StepTracker,
    batch_size,
    torch_instrumentation,
    warn_if_torch_hooked,
)
from otelprof.runtime import hotpath as hot

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package
    from pytorch_lightning import Callback  # type: ignore[assignment]

__all__ = ["OtelprofCallback"]

SANITY_CHECK = "sanity_check"
_EVAL_PHASES = {"validation": "eval", "test": "test", "predict": "predict"}


class OtelprofCallback(Callback):  # type: ignore[misc]
    """Steps, phases, regions and training scalars of a Lightning run (see the module docstring).

    ``init_kwargs`` go to ``otelprof.init()`` when the callback starts the session itself."""

    def __init__(self, *, grad_norm: bool = False, shutdown: bool = True, **init_kwargs: Any) -> None:
        super().__init__()
        self.grad_norm = grad_norm
        self.owner = SessionOwner(init_kwargs, shutdown)
        self.tracker = StepTracker("lightning")
        self._untime_fetches: Any = None
        self._optimizer_hooks: list[Any] = []
        self._stepped = False
        self._eval_mark: int | None = None
        self._previous_phase: str | None = None
        self._manual = False
        self._loop: str | None = None
        self._torch: Any = None
        """The ``otelprof.torch`` instrumentation this callback created (removed at teardown)."""
        self.tracker.undo = self._undo

    # ------------------------------------------------------------------ lifecycle
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.tracker.guarded(PART_CALLBACK, self._setup)

    def _setup(self) -> None:
        self.owner.ensure()
        if hot._active is None:
            return
        from otelprof.integrations import torch as otorch

        inst = torch_instrumentation()
        warn_if_torch_hooked("lightning", inst, optimizers=True)  # an optimizer hook would cover the closure
        if self._untime_fetches is None:
            # Lightning creates the first epoch's iterators before any later callback event.
            self._untime_fetches = self.tracker.time_all_fetches()
        created = otorch.instrument(loss=False, count_samples=False)  # backward timing, on-demand capture
        if inst is None:
            self._torch = created
        self.tracker.device = created  # its CUDA event timer, once on_train_start shows the model's device

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.tracker.guarded(PART_TEARDOWN, self._teardown, None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.tracker.guarded(PART_TEARDOWN, self._teardown, exception)

    def _teardown(self, error: BaseException | None) -> None:
        self.tracker.close(error)
        self._restore_phase()
        self._undo()
        self.owner.end()

    def _undo(self) -> None:
        """Remove the optimizer hooks, the fetch timing and the ``otelprof.torch`` hooks this callback added."""
        for handle in self._optimizer_hooks:
            handle.remove()
        self._optimizer_hooks.clear()
        untime, self._untime_fetches = self._untime_fetches, None
        if untime is not None:
            untime()
        self.tracker.pending.clear()
        inst, self._torch = self._torch, None
        self.tracker.device = None
        if inst is not None:
            inst.uninstrument()

    # ------------------------------------------------------------------ training
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._train_start, trainer, pl_module)

    def _train_start(self, trainer: Any, pl_module: Any) -> None:
        self._manual = not getattr(pl_module, "automatic_optimization", True)
        if self.tracker.device is not None:
            self.tracker.device.time_device_of(pl_module)
        for optimizer in getattr(trainer, "optimizers", None) or []:
            if hasattr(optimizer, "register_step_post_hook"):
                self._optimizer_hooks.append(optimizer.register_step_post_hook(self._optimizer_done))

    def _optimizer_done(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self.tracker.end, sc.REGION_OPTIMIZER)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.tracker.guarded(PART_CALLBACK, self._train_batch_start, batch)

    def _train_batch_start(self, batch: Any) -> None:
        tracker = self.tracker
        tracker.open()
        tracker.add_samples(tracker.guarded(PART_SCALARS, batch_size, batch))
        tracker.begin(sc.REGION_FORWARD)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self.tracker.end, sc.REGION_FORWARD)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._before_optimizer_step, optimizer)

    def _before_optimizer_step(self, optimizer: Any) -> None:
        tracker = self.tracker
        tracker.end(sc.REGION_FORWARD)
        self._stepped = True
        tracker.guarded(PART_SCALARS, self._optimizer_scalars, optimizer)
        tracker.begin(sc.REGION_OPTIMIZER)

    def _optimizer_scalars(self, optimizer: Any) -> None:
        if not self.tracker.on:
            return
        groups = getattr(optimizer, "param_groups", None)
        if groups and "lr" in groups[0]:
            lr = groups[0]["lr"]
            hot.record("learning_rate", lr.detach() if isinstance(lr, torch.Tensor) else float(lr))
        if self.grad_norm:
            grads = [p.grad.detach() for group in optimizer.param_groups for p in group["params"]
                     if p.grad is not None]
            if grads:
                norms = torch.stack([torch.linalg.vector_norm(g) for g in grads])
                hot.record("grad_norm", torch.linalg.vector_norm(norms))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.tracker.guarded(PART_CALLBACK, self._train_batch_end, trainer, outputs)

    def _train_batch_end(self, trainer: Any, outputs: Any) -> None:
        tracker = self.tracker
        tracker.end(sc.REGION_FORWARD)  # training_step returned None: no backward
        tracker.end(sc.REGION_OPTIMIZER)
        tracker.guarded(PART_SCALARS, self._collect_loss, outputs)
        if not self._stepped:
            return  # accumulating gradients: the step goes on with the next batch
        self._stepped = False
        self._close_train_step()
        session = _session()
        if session is not None and session.should_stop():
            trainer.should_stop = True

    def _collect_loss(self, outputs: Any) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self.tracker.loss_parts.append(loss.detach())

    def _close_train_step(self) -> None:
        parts = self.tracker.take_loss_parts()
        if parts and self.tracker.on:
            # Automatic optimization: each part is already divided by accumulate_grad_batches.
            loss = parts[-1] if self._manual or len(parts) == 1 else torch.stack(parts).sum()
            hot.record("loss", loss.item() if loss.device.type == "cpu" else loss)
        self.tracker.close()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._epoch_end)

    def _epoch_end(self) -> None:
        if self.tracker.step is not None:  # an epoch that ended while accumulating
            self._stepped = False
            self._close_train_step()
        self.tracker.pending.clear()

    # ------------------------------------------------------------------ sanity check, evaluation loops
    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, hot.annotation_begin, SANITY_CHECK)

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, hot.annotation_end, SANITY_CHECK)
        self.tracker.pending.clear()  # the sanity check's fetches

    def _eval_start(self, trainer: Any, loop: str) -> None:
        if getattr(trainer, "sanity_checking", False) or not self.tracker.on:
            return
        if self.tracker.step is not None:  # validation in the middle of gradient accumulation
            self._close_train_step()
        self._previous_phase = hot.current_phase()
        hot.phase(_EVAL_PHASES[loop])
        self._loop = loop
        self._eval_mark = perf_counter_ns()

    def _eval_batch_start(self, trainer: Any, batch: Any) -> None:
        if getattr(trainer, "sanity_checking", False) or self._eval_mark is None:
            return
        tracker = self.tracker
        if tracker.pending:
            tracker.open()  # from the timed fetch
        else:  # not a DataLoader: the time since the previous batch ended (fetch, transfer to the device)
            tracker.open(start_ns=self._eval_mark)
            tracker.add_region(sc.REGION_DATALOADER, self._eval_mark, perf_counter_ns())
        tracker.add_samples(tracker.guarded(PART_SCALARS, batch_size, batch))
        tracker.begin(sc.REGION_FORWARD)

    def _eval_batch_end(self, trainer: Any, outputs: Any) -> None:
        if getattr(trainer, "sanity_checking", False) or self._eval_mark is None:
            return
        tracker = self.tracker
        tracker.end(sc.REGION_FORWARD)
        if self._loop != "predict":  # a prediction is not a loss
            tracker.guarded(PART_SCALARS, self._collect_loss, outputs)
        parts = tracker.take_loss_parts()
        if parts and tracker.on:
            hot.record("loss", parts[-1].item() if parts[-1].device.type == "cpu" else parts[-1])
        tracker.close()
        self._eval_mark = perf_counter_ns()

    def _eval_end(self, trainer: Any) -> None:
        if getattr(trainer, "sanity_checking", False) or self._eval_mark is None:
            return
        self.tracker.close()
        self._eval_mark = self._loop = None
        self._restore_phase()

    def _restore_phase(self) -> None:
        previous, self._previous_phase = self._previous_phase, None
        if previous is not None and hot._active is not None:
            hot.phase(previous)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._eval_start, trainer, "validation")

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        self.tracker.guarded(PART_CALLBACK, self._eval_batch_start, trainer, batch)

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self.tracker.guarded(PART_CALLBACK, self._eval_batch_end, trainer, outputs)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._eval_end, trainer)

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._eval_start, trainer, "test")

    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        self.tracker.guarded(PART_CALLBACK, self._eval_batch_start, trainer, batch)

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        self.tracker.guarded(PART_CALLBACK, self._eval_batch_end, trainer, outputs)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._eval_end, trainer)

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._eval_start, trainer, "predict")

    def on_predict_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        self.tracker.guarded(PART_CALLBACK, self._eval_batch_start, trainer, batch)

    def on_predict_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None:
        self.tracker.guarded(PART_CALLBACK, self._eval_batch_end, trainer, outputs)

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self.tracker.guarded(PART_CALLBACK, self._eval_end, trainer)


def _session() -> Any:
    from otelprof.runtime.session import get_session

    return get_session()
