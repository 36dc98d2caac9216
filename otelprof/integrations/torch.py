"""PyTorch in one line: ``otelprof.integrations.torch.instrument(model=..., optimizer=..., dataloader=...)``.

What each region measures. Regions are host time, i.e. what the Python training loop waits for; on CPU
that is the work itself, on CUDA mostly the time to queue the kernels (the GPU runs them later):

* ``dataloader`` — from asking the data loader for the next batch to getting it: input wait.
* ``forward`` — the instrumented module's forward call.
* ``backward`` — ``Tensor.backward()``: the autograd pass (on CUDA, until its kernels are queued).
* ``optimizer`` — ``optimizer.step()`` (the gradient norm, when asked for, is computed just before it).
* ``collective`` — a DDP gradient all-reduce from launch until its future completes (communication hook;
  gloo completes it when the reduction is done, NCCL as soon as it is queued on its stream).

When the model's parameters are on a CUDA device, forward, backward and optimizer also get a device time
(:mod:`otelprof.integrations.cuda_timing`): CUDA events around the region, read once the GPU has passed
them, never waited for; ``otelprof.region.device.duration`` and late ``"k":"d"`` lines in the recording.
On CPU there is no timer at all (one attribute check per hook).

Steps: when the user marks none, a train step runs from the first event of an iteration (batch fetch,
forward) to the end of ``optimizer.step()`` — with gradient accumulation, one step per optimizer
update; with several optimizers, one step per iteration (a GAN's two updates per batch) — and each evaluation
batch (forwards in eval mode or without gradients) is an eval step (:class:`_AutoSteps`; docs/pytorch.md has
the rules per loop shape). Scalars: the loss (a train step's: the sum of the scalar tensors given to
``backward()``, a ``GradScaler``'s scale undone, only the first evaluation's inside ``step(closure)``, and with
several optimizers each update's also under its optimizer's name; an eval step's: the mean of the scalar losses
its forwards returned), the learning rate, optionally the global gradient norm,
samples per step (the first dimension of the batch), CUDA memory when CUDA is used.

A hook that raises is removed and counted (``otelprof_integration_errors_total``); training goes on.

Where the C extension ``_torch_native`` is built (``OTELPROF_TORCH_NATIVE``, default on), the four per-step
hooks are its C objects: they keep the plain automatic step in C and leave everything else to the Python
hooks below, handing a step they hold over first (:meth:`TorchInstrumentation._materialise`). Both give
the same recording; :meth:`TorchInstrumentation.sync_native` says when the C path applies.
"""

from __future__ import annotations

import atexit
import contextlib
import copyreg
import functools
import itertools
import sys
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from time import perf_counter_ns
from typing import Any

import torch

from otelprof import _warnings
from otelprof import semconv as sc
from otelprof._log import info_once, warn_once
from otelprof.integrations import cuda_memory, cuda_timing, torch_profiler
from otelprof.integrations._iterators import IteratorProxy
from otelprof.integrations.cuda_timing import DeviceTimer
from otelprof.runtime import hotpath as hot

__all__ = ["TorchInstrumentation", "auto_instrument", "instrument", "profile_window", "uninstrument"]

_lock = threading.RLock()
_active: list[TorchInstrumentation] = []
_original_backward: Callable[..., Any] | None = None
_native_backward: Any = None
"""The C ``Tensor.backward`` while patched with it: its ``steps`` follow the newest instrumentation."""
_original_dataloader_iter: Callable[..., Any] | None = None


def _load_native() -> Any:
    """The hot path in C (``_torch_native.c``, built by setup.py where a compiler is available), or None."""
    from otelprof.integrations import native

    return native.load()[0]


_native = _load_native()


def _native_wanted() -> bool:
    """``OTELPROF_TORCH_NATIVE`` / ``init(torch_native=...)``, and the extension is there."""
    if _native is None:
        return False
    session = _session()
    config = getattr(session, "config", None)
    if config is None:
        from otelprof.config import Config

        config = Config.from_env()
    return bool(config.torch_native)


def _session() -> Any:
    from otelprof.runtime.session import get_session

    return get_session()


def _with_registry(action: Callable[[Any], None]) -> None:
    session = _session()
    if session is None:
        return
    with session.registry.lock:
        action(session.registry)


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


def _has_parameters(module: Any) -> bool:
    """A module with parameters (a model, not a loss function)."""
    try:
        return next(module.parameters(), None) is not None
    except Exception:
        return False


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


def _open_step() -> hot.StepContext | None:
    """The step open on this thread (the user's or an automatic one)."""
    return hot._tls.step


FETCH, FORWARD, BACKWARD, OPTIMIZER = "fetch", "forward", "backward", "optimizer"
"""The events that start or continue an automatic step."""
EVAL_PHASE = "eval"
"""The phase of automatic steps that evaluate (their forwards in eval mode or without gradients)."""
_NATIVE_KINDS = (FETCH, FORWARD, BACKWARD, OPTIMIZER)
"""The C code's event kinds, by number."""

# Region names as module globals: one lookup on the hot path instead of two.
_DATALOADER, _FORWARD = sc.REGION_DATALOADER, sc.REGION_FORWARD
_BACKWARD, _OPTIMIZER = sc.REGION_BACKWARD, sc.REGION_OPTIMIZER
_SAMPLES, _LOSS, _LEARNING_RATE = sc.SCALAR_SAMPLES, sc.SCALAR_LOSS, sc.SCALAR_LEARNING_RATE
_Sum, _Mean = hot.Sum, hot.Mean
_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_cuda = torch.cuda
_cuda_globals = vars(torch.cuda)
_OpenRegion = tuple[int, "hot.StepContext | None", int]
"""A region a hook opened with ``hot._begin_region``: (start_ns, step, depth), closed by ``hot._end_region``."""


class _AutoSteps:
    """Opens steps the user did not mark at the first event of an iteration and closes them at the end of
    ``optimizer.step()``: with an optimizer hooked, the fetch/forward/backward rounds before its ``step()`` are
    one step (gradient accumulation), a **train** step. An **evaluation** forward (module in eval mode, or
    gradients off: ``model.eval()`` / ``torch.no_grad()``) that finds no training work in its step makes it an
    **eval** step (phase ``eval``): the next evaluation forward of the same module (or the next fetch) starts
    the next eval step, and that module's next training forward ends the evaluation and opens a train step.
    Other modules' forwards join the step they find (a loss module, a teacher model run before or after the
    student); an eval step that gets a backward or an optimizer step was training after all and goes back to
    its phase. With several optimizers (``several``) one iteration's updates are one step: an optimizer's
    ``step()`` leaves the step open (``pending``) unless that optimizer is known to end iterations, and the
    iteration ends at its next one's first event — in a step a fetch opened, only the next fetch (a GAN's
    generator update, after the discriminator's, joins the batch's step); in others, any event but another
    optimizer's ``step()`` (optimizers stepping back to back: one per parameter group, an encoder's and a
    decoder's). The step then ends where its work did (:meth:`close`). Without an optimizer, an event of the kind
    that opened the step (a forward of the module that opened it) starts the next one, so an automatic step
    always ends.

    The hooks test the usual case inline (a step open that the event continues) and call :meth:`begin` /
    :meth:`forward` only when they can do something: no step open, or ours open and the event may end it
    (``slow``)."""

    def __init__(self) -> None:
        self.current: hot.StepContext | None = None
        self.leader = ""
        """The kind of event that opened the current step."""
        self.saw_backward = False
        self.saw_work = False
        """A forward, backward or optimizer step (an epoch's last fetch alone opens a step that is dropped)."""
        self.fetcher = 0
        """The serial of the data-loader iterator whose fetch opened the step (0: not a fetch, or unknown)."""
        self.trained = False
        """Training work in the step: a training forward, a backward or an optimizer step."""
        self.eval_module: Any = None
        """The module whose evaluation forward made the current step an eval step; None: not one."""
        self.eval_seen: list[Any] | None = None
        """Other modules with parameters whose evaluation forwards the current eval step holds."""
        self.retagged: str | None = None
        """The phase the current step had before it became an eval step (``retag``)."""
        self.by_optimizer = False
        """An optimizer is hooked (under ``otelprof run``: one exists): its ``step()`` ends steps."""
        self.leader_module: Any = None
        """The module whose forward opened the current step: without an optimizer, its next forward ends it."""
        self.several = False
        """More than one optimizer: given to ``instrument()``, made under ``otelprof run``, or seen stepping."""
        self.pending: Any = None
        """The optimizer whose ``step()`` left the current step open for the iteration's next update, or its end."""
        self.pending_end = 0
        """When that ``step()`` ended."""
        self.not_last: weakref.WeakSet[Any] = weakref.WeakSet()
        """Optimizers whose update another update followed in an iteration: their ``step()`` leaves the step open."""
        self.last: weakref.WeakSet[Any] = weakref.WeakSet()
        """Optimizers whose update ended an iteration (and, not in ``not_last``, always has): theirs ends the step."""
        self.stepped = 0
        """The ``id()`` of the optimizer whose ``step()`` came last (a second one makes ``several``); not the
        optimizer itself, which the loop may drop (and its state with it)."""
        self.loss_step: hot.StepContext | None = None
        self.loss_mark = 0
        """In ``loss_step``, the loss parts (``backward()`` losses) given to updates' own names so far."""
        self.slow = False
        """The hooks must call :meth:`begin` / :meth:`forward` for any event: an eval step or a pending one."""
        self.opens = True
        """Open steps at all: False once a trainer callback is in charge (:meth:`TorchInstrumentation.hand_over`)."""

    def _ours(self) -> bool:
        return self.current is not None and hot._tls.step is self.current

    def begin(self, kind: str, step: hot.StepContext | None, fetcher: int = 0) -> hot.StepContext | None:
        """A fetch, backward or optimizer event, with ``step`` the step open on the thread (None, or ours): end
        ours when ``kind`` starts the next iteration, open one when none is; training work turns an eval step
        back into a train step. ``fetcher``: the serial of the iterator fetching (0: unknown); a step that holds
        only another iterator's fetch goes on (a batch peeked at before the loop, a second loader zipped in).
        Returns the step open afterwards."""
        if step is not None and step is self.current:
            if self.pending is not None:
                if kind == OPTIMIZER:  # another update of the iteration (the pre-hook calls next_update first)
                    self.pending = None
                    self.slow = False
                elif kind == FETCH or self.leader != FETCH:  # the next iteration's first event
                    self.end_iteration()
                    step = hot._tls.step
            elif kind == FETCH:
                if (kind == self.leader and (not self.by_optimizer or not self.saw_backward)
                        and (self.saw_work or not fetcher or not self.fetcher or fetcher == self.fetcher)) \
                        or self.eval_module is not None:
                    self.close()
                    step = hot._tls.step
            elif self.eval_module is not None:
                if kind == OPTIMIZER and not self.trained:  # step(closure) after an evaluation: the closure is the
                    self.close()                             # next iteration's training, a step of its own
                    step = hot._tls.step
                else:  # backward or optimizer step in an eval step: training after all
                    self.untag()
            elif kind == self.leader and not self.by_optimizer:
                self.close()
                step = hot._tls.step
        if step is not None or hot._active is None or not self.opens:
            return step
        step = self.open(kind)
        self.fetcher = fetcher
        return step

    def forward(self, step: hot.StepContext | None, module: Any, evaluating: bool) -> hot.StepContext | None:
        """A forward of ``module`` (``evaluating``: in eval mode or with gradients off), with ``step`` the step
        open on the thread (None, or ours). Returns the step open afterwards."""
        if step is not None and step is self.current:
            if self.pending is not None:
                if self.leader != FETCH:  # a step a fetch opened waits for the next fetch: this forward is its own
                    self.end_iteration()
                    step = hot._tls.step
            elif self.eval_module is not None:  # an eval step
                if module is self.eval_module:
                    if self.leader == FORWARD or not evaluating:
                        self.close()  # that model's next evaluation batch, or its training again
                        step = hot._tls.step
                elif evaluating and self.leader == FORWARD and _has_parameters(module):
                    seen = self.eval_seen
                    if seen is None:
                        self.eval_seen = [module]
                    elif any(m is module for m in seen):
                        self.close()  # another model ran again: the next batch (a model reloaded for the test set)
                        step = hot._tls.step
                    else:
                        seen.append(module)  # a second model of the same batch (a decoder after its encoder)
            elif self.leader == FORWARD and not self.by_optimizer and module is self.leader_module:
                self.close()
                step = hot._tls.step
        if step is None:
            if hot._active is None or not self.opens:
                return None
            step = self.open(FORWARD)
            self.leader_module = module
        if step is self.current:
            if not evaluating:
                self.trained = True
            elif self.eval_module is None and not self.trained:  # the step's first work is evaluation
                self.eval_module, self.eval_seen, self.slow = module, None, True
                if hot._phase[0] == hot.DEFAULT_PHASE:
                    self.retag(EVAL_PHASE)
        return step

    def open(self, kind: str) -> hot.StepContext:
        """Open a step (the data-loader hook does the same inline)."""
        step = hot._begin_step(None)
        self.current, self.leader, self.saw_backward, self.saw_work, self.trained = step, kind, False, False, False
        self.eval_module = self.pending = self.retagged = None
        self.slow = False
        self.fetcher = 0
        return step

    def next_update(self, optimizer: Any, step: hot.StepContext) -> hot.StepContext | None:
        """``optimizer.step()`` begins in the pending step: another update of the iteration (``pending`` does not
        always end iterations), or — the same optimizer again, in a step no fetch opened — the next iteration.
        Returns the step open afterwards."""
        pending = self.pending
        if pending is optimizer and self.leader != FETCH:
            self.end_iteration()
            return self.begin(OPTIMIZER, hot._tls.step)
        self.not_last.add(pending)
        self.pending = None
        self.slow = self.eval_module is not None
        return step

    def end_iteration(self) -> None:
        """The pending step's iteration is over: its last update was the pending optimizer's (learned)."""
        self.last.add(self.pending)
        self.close()

    def close(self) -> None:
        """End the current step; a pending one where its work ended (its last region, or its last update), not at
        the next iteration's first event."""
        step = self.current
        pending, end = self.pending, self.pending_end
        self.eval_module = self.leader_module = self.pending = None
        self.slow = False
        if step is not None:
            self.current = None
            if hot._tls.step is step:
                if pending is None:
                    step.__exit__(None, None, None)
                else:
                    annotations = step.annotations
                    hot._end_step(step, max(end, annotations[-1][2]) if annotations else end)

    def cancel(self) -> None:
        """Drop a step that only saw the fetch that ended the epoch."""
        step = self.current
        if step is None:
            return
        if not self.saw_work and _open_step() is step:
            self.current = None
            self.eval_module = self.pending = None
            self.slow = False
            step.closed = True
            hot._tls.step = step._previous
            if hot._step_numbers.get(step.phase) == step.number + 1:
                hot._step_numbers[step.phase] = step.number

    def retag(self, phase: str) -> None:
        """Move the open auto step to ``phase`` (evaluation detected), numbered in that phase."""
        step = self.current
        if step is None or not self._ours() or step.phase == phase:
            return
        if self.retagged is None:
            self.retagged = step.phase
        if hot._step_numbers.get(step.phase) == step.number + 1:
            hot._step_numbers[step.phase] = step.number
        step.phase = phase
        step.number = hot._step_numbers.get(phase, 0)
        hot._step_numbers[phase] = step.number + 1

    def untag(self) -> None:
        """The eval step got training work (a backward, an optimizer step): it is a train step after all."""
        self.eval_module = None
        self.slow = self.pending is not None
        phase, self.retagged = self.retagged, None
        if phase is not None:
            self.retag(phase)
            self.retagged = None


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
HOOK_CUDA_EVENTS = "cuda_events"
"""``hook`` label of ``otelprof.integration.errors`` when the CUDA event API failed and device timing stopped."""
HOOK_NATIVE = "native"
"""``hook`` label of ``otelprof.integration.errors`` when the C hot path failed (the Python hooks carry on)."""


_iterator_serials = itertools.count(1)
"""Numbers of the timed data-loader iterators, never reused (an iterator's id() is, once it is freed)."""


def _raise_as_caller(exc: BaseException) -> None:
    """Before a bare ``raise`` of ``exc`` in the ``except`` block of the function that called what raised it:
    drop that function's frame from the traceback, so that the user's traceback is the one without otelprof
    (the loop's line, then the data loader's own frames). Python 3.11 and later re-raise the exception's
    ``__traceback__``; 3.10 keeps the frame."""
    tb = exc.__traceback__
    if tb is not None and tb.tb_next is not None and tb.tb_frame is sys._getframe(1):
        exc.__traceback__ = tb.tb_next


class _TimedIterator(IteratorProxy):
    """Wraps a data-loader iterator: each ``next()`` is a ``dataloader`` region."""

    def __init__(self, iterator: Iterator[Any], owner: TorchInstrumentation) -> None:
        super().__init__(iterator)
        # Owner and iterator in one attribute: with IteratorProxy's __getattr__ every attribute read on this
        # class takes the slow path (~450 machine instructions), so __next__ makes one.
        self._state = (owner, iterator, next(_iterator_serials))

    def __next__(self) -> Any:
        owner, iterator, serial = self._state
        if hot._active is None or owner.closed:
            try:
                return next(iterator)
            except BaseException as exc:
                _raise_as_caller(exc)
                raise
        # TorchInstrumentation.fetch_begin and fetch_end inline, not through guarded(): this runs every step,
        # and on the training thread each call is paid in cold caches (see the note above fetch_begin).
        step: hot.StepContext | None = None
        depth = 0
        try:
            auto = owner.auto
            step = hot._tls.step
            if step is None:  # the usual case: the last step ended at optimizer.step(); auto.open inline
                step = hot._begin_step(None)
                auto.current, auto.leader, auto.saw_backward, auto.saw_work, auto.trained = step, FETCH, False, \
                    False, False
                auto.eval_module = auto.pending = auto.retagged = None
                auto.slow = False
                auto.fetcher = serial
            elif step is auto.current and (auto.leader == FETCH or auto.slow):
                step = auto.begin(FETCH, step, serial)
            if step is not None:
                depth = step.depth
                step.depth = depth + 1
            start = perf_counter_ns()
        except hot.StopTraining:
            raise
        except Exception as exc:
            owner.failed("dataloader", exc)
            try:
                return next(iterator)
            except BaseException as error:
                _raise_as_caller(error)
                raise
        try:
            batch = next(iterator)
        except BaseException as exc:  # the epoch's end, or the loader's error: the user's, as bare PyTorch shows it
            owner.guarded("dataloader", owner.fetch_end, (start, step, depth), None, True)
            _raise_as_caller(exc)
            raise
        try:
            end = perf_counter_ns()  # hot._end_region inline
            if step is not None:
                step.depth = depth
                if not step.closed and len(annotations := step.annotations) < hot.MAX_STEP_ANNOTATIONS:
                    annotations.append((_DATALOADER, start, end, depth, None))
                else:
                    hot._close_region(_DATALOADER, start, end, step, depth, None)
            else:
                hot._close_region(_DATALOADER, start, end, None, 0, None)
            if owner.count_samples:
                # _batch_size's and hot._add_into's usual cases inline: (inputs, targets) batches, a step open
                kind = type(batch)
                if (kind is tuple or kind is list) and batch and type(first := batch[0]) is _Tensor:
                    shape = first.shape
                    size = shape[0] if shape else None
                else:
                    size = _batch_size(batch)
                if size:
                    if step is not None and hot._active is not None:
                        scalars = step.scalars
                        if scalars is None:
                            step.scalars = {_SAMPLES: size}
                        else:  # summed: gradient accumulation fetches several batches
                            scalars[_SAMPLES] = scalars.get(_SAMPLES, 0) + size
                    else:
                        hot.record(_SAMPLES, size)
        except hot.StopTraining:
            raise
        except Exception as exc:
            owner.failed("dataloader", exc)
        return batch


class TorchInstrumentation:
    """Hooks on one model / optimizer / data loader (or, with ``everything=True``, on all of them)."""

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

    # ------------------------------------------------------------------ data loader
    # The hooks that run every step (fetch, forward, backward, optimizer) are written for the training
    # loop, where their code is cold in the CPU caches and each call, thread-local read and allocation
    # shows: the automatic step's usual case is tested inline before calling _AutoSteps.begin, regions
    # are (start_ns, step, depth) tuples (hot._begin_region / hot._end_region) instead of hot._Region
    # objects, scalars go straight into the step they belong to (hot._record_into).
    def fetch_begin(self) -> _OpenRegion:
        """Before the data loader's ``next()``: may open a step, begins the ``dataloader`` region."""
        auto = self.auto
        step = hot._tls.step
        if step is None or (step is auto.current and (auto.leader == FETCH or auto.slow)):
            step = auto.begin(FETCH, step)
        return hot._begin_region(step)

    def fetch_end(self, region: _OpenRegion | None, batch: Any, exhausted: bool) -> None:
        """After it: ends the region, records the batch's samples (or drops a step the epoch's end opened)."""
        step = None
        if region is not None:
            start, step, depth = region
            hot._end_region(_DATALOADER, start, step, depth)
        if exhausted:
            self.auto.cancel()
            return
        if self.count_samples:
            size = _batch_size(batch)
            if size:
                hot._add_into(step, _SAMPLES, size)  # summed: gradient accumulation fetches several batches

    def add_dataloader(self, loader: Any) -> None:
        if getattr(loader, "_otelprof_instrumented", False):
            return
        if not hasattr(loader, "__iter__"):
            warn_once("torch:dataloader", "otelprof: instrument(dataloader=...) got %r, which is not iterable; "
                      "ignored", type(loader).__name__)
            return
        owner = self
        cls = type(loader)
        original_iter = cls.__iter__

        def __iter__(this: Any) -> Any:
            try:
                iterator = original_iter(this)
            except BaseException as exc:  # the loader's own error, as without otelprof
                _raise_as_caller(exc)
                raise
            proxy = _TimedIterator(iterator, owner)
            native = owner.native
            return proxy if native is None else _native.Iterator(native, iterator, proxy)

        try:
            _set_class(loader, _instrumented_subclass(cls, {"__iter__": __iter__}))
        except (TypeError, AttributeError):  # a C type, __slots__, or a loader that refuses attribute changes
            warn_once("torch:dataloader-class", "otelprof: cannot instrument data loader %s; wrap its iterator "
                      "with otelprof.annotate('dataloader') instead", cls.__name__)
            return

        def restore() -> None:
            _set_class(loader, cls)

        self._on_remove("dataloader", restore)
        _report_loader(loader)

    # ------------------------------------------------------------------ model
    def _forward_pre_hook(self, module: Any, args: Any) -> None:
        """Before the model's forward: may open a step (see _AutoSteps), begins the ``forward`` region."""
        try:
            auto = self.auto
            step = hot._tls.step
            if step is None or step is auto.current:
                step = auto.forward(step, module, not module.training or not _grad_enabled())
            auto.saw_work = True
            timer = self.device_timer
            if timer is not None:
                if isinstance(timer, _Undecided):
                    timer = self._decide_device_timer(module)
                if timer is not None:
                    timer.poll()  # once per iteration: resolve what the GPU has finished, never wait
                    timer.begin(_FORWARD)
            if step is None:  # hot._begin_region inline
                self._forward_regions.append((perf_counter_ns(), None, 0))
            else:
                depth = step.depth
                step.depth = depth + 1
                self._forward_regions.append((perf_counter_ns(), step, depth))
        except hot.StopTraining:
            raise
        except Exception as exc:
            self.failed("forward", exc)

    def _forward_post_hook(self, module: Any, args: Any, output: Any) -> None:
        """After the model's forward: ends the ``forward`` region; an evaluation forward's loss, when its output
        holds one, goes into an evaluation step (see :func:`_output_loss`)."""
        try:
            regions = self._forward_regions
            if regions:
                start, step, depth = regions.pop()
                hot._end_region(_FORWARD, start, step, depth)
                if (self.loss and step is not None and step.phase != hot.DEFAULT_PHASE and module is not None
                        and (not module.training or not _grad_enabled())
                        and (loss := _output_loss(output)) is not None):
                    _add_eval_loss(step, loss)
            timer = self.device_timer
            if timer is not None:
                timer.end(_FORWARD)
        except hot.StopTraining:
            raise
        except Exception as exc:
            self.failed("forward", exc)

    def forward_begin(self, module: Any) -> None:
        """What the forward pre-hook does (a failure removes the forward hooks)."""
        self._forward_pre_hook(module, ())

    def forward_end(self, module: Any = None, output: Any = None) -> None:
        """What the forward hook does (a failure removes the forward hooks)."""
        self._forward_post_hook(module, (), output)

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

    def add_model(self, model: Any) -> None:
        if model in self.models:
            return
        if not isinstance(model, torch.nn.Module):
            warn_once("torch:model", "otelprof: instrument(model=...) expects a torch.nn.Module, got %s; ignored",
                      type(model).__name__)
            return
        if not self._wrap_forward(model):
            pre = model.register_forward_pre_hook(self._forward_pre_hook)
            try:
                post = model.register_forward_hook(self._forward_post_hook)
            except Exception:
                pre.remove()
                raise
            self._on_remove("forward", pre.remove)
            self._on_remove("forward", post.remove)
            self._hooked_models += 1
        else:
            self._wrapped_models += 1
        self.models.add(model)
        self._add_comm_hook(model)

    def _wrap_forward(self, model: Any) -> bool:
        """Time ``model``'s forward through a subclass of its class whose ``forward`` runs the two hooks around
        the original, made the model's class until uninstrumented. Module hooks would do the same, but a module
        with hooks takes torch's slow call path (about a fifth of the integration's cost per step on the
        benchmarks' loops), and hooks that hold this instrumentation would make the model impossible to pickle
        or deep-copy. The subclass pickles and copies as the original class, uninstrumented. False when that
        cannot be done (an instance-level ``forward``, a class that refuses the change): then hooks."""
        cls = type(model)
        if "forward" in vars(model) or getattr(cls, "_otelprof_instrumented", False):
            return False
        original = cls.forward
        pre, post = self._forward_pre_hook, self._forward_post_hook
        owner = self

        def forward(this: Any, *args: Any, **kwargs: Any) -> Any:
            # The hooks' usual case inline — a step open that a forward does not end, a module in training mode,
            # no device timer — and the hooks themselves otherwise: on the training thread each call counts.
            region: tuple[hot.StepContext, int, int] | None = None
            hooked = False
            output = None
            try:
                step = hot._tls.step
                auto = owner.auto
                if (step is None or owner.device_timer is not None or not this.training or not _grad_enabled()
                        or (step is auto.current and (auto.leader == FORWARD or auto.slow))):
                    hooked = True
                    pre(this, args)
                else:
                    auto.saw_work = auto.trained = True
                    depth = step.depth
                    step.depth = depth + 1
                    region = (step, depth, perf_counter_ns())
            except hot.StopTraining:
                raise
            except Exception as exc:
                owner.failed("forward", exc)
            try:  # without keyword arguments (the usual model(x)) a plain call: unpacking them costs more
                output = original(this, *args, **kwargs) if kwargs else original(this, *args)
                return output
            finally:
                if region is not None:
                    try:
                        step, depth, start = region
                        end = perf_counter_ns()  # hot._end_region inline
                        if step is not None:
                            step.depth = depth
                            if not step.closed and len(annotations := step.annotations) < hot.MAX_STEP_ANNOTATIONS:
                                annotations.append((_FORWARD, start, end, depth, None))
                            else:
                                hot._close_region(_FORWARD, start, end, step, depth, None)
                        else:
                            hot._close_region(_FORWARD, start, end, None, 0, None)
                    except Exception as exc:
                        owner.failed("forward", exc)
                elif hooked:
                    post(this, args, output)

        timed = forward if self.native is None else _native.Forward(self.native, original, forward)
        subclass = _instrumented_subclass(cls, {"forward": timed})
        try:
            _set_class(model, subclass)
        except (TypeError, AttributeError):
            return False

        def restore() -> None:
            if type(model) is subclass:
                _set_class(model, cls)

        self._on_remove("forward", restore)
        return True

    def _add_comm_hook(self, model: Any) -> None:
        """Time a DDP model's gradient all-reduce (:func:`_hook_ddp`); the C hot path then leaves steps to Python,
        where the collective regions go."""
        ddp = _ddp_class()
        if ddp is None or not isinstance(model, ddp) or not getattr(getattr(_session(), "config", None),
                                                                    "ddp_collectives", True):
            return
        self._comm_hooked = True
        _hook_ddp(model)
        self.sync_native()

    # ------------------------------------------------------------------ backward
    # Tensor.backward is patched once per process (_patched_backward): the wrapper does this instance's work,
    # inline — it records the loss and times the ``backward`` region.

    # ------------------------------------------------------------------ optimizer
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

    # ------------------------------------------------------------------ everything (otelprof run)
    def add_everything(self) -> None:
        """Global hooks: every optimizer, every top-level module call, every DataLoader."""
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        depth = self._global_depth
        forward_pre, forward_post = self._forward_pre_hook, self._forward_post_hook  # both guarded

        def pre(module: Any, args: Any) -> None:
            level = depth.value
            depth.value = level + 1
            if level == 0:
                forward_pre(module, args)

        def post(module: Any, args: Any, output: Any) -> None:
            level = depth.value - 1
            depth.value = level if level > 0 else 0  # not below 0: a call that began before the hooks did
            if level == 0:
                forward_post(module, args, output)

        # Steps end at optimizer.step() once an optimizer exists (made from now on, or seen stepping): a loop that
        # updates its parameters itself has none, and its steps end at its model's next forward.
        _patch_optimizer_class(self.auto)
        self._on_remove("optimizer", _unpatch_optimizer_class)
        handles = [nn_module.register_module_forward_pre_hook(pre), nn_module.register_module_forward_hook(post),
                   optim_module.register_optimizer_step_pre_hook(self._optimizer_pre_hook),
                   optim_module.register_optimizer_step_post_hook(self._optimizer_post_hook)]
        for handle in handles[:2]:
            self._on_remove("forward", handle.remove)
        for handle in handles[2:]:
            self._on_remove("optimizer", handle.remove)
        _patch_dataloader_class()
        self._on_remove("dataloader", _unpatch_dataloader_class)
        self._global_removers = [handle.remove for handle in handles] + [_unpatch_dataloader_class]
        _patch_ddp_class()  # each DDP model built from now on: collective regions
        self._on_remove("collective", _unpatch_ddp_class)
        # torch warns at each call of a torch.compile'd module while global hooks exist that they fire for it too:
        # that is expected here (only top-level calls count), and the training job's stderr stays quiet.
        with _warnings.untouched():  # the warnings the job was already shown stay shown
            warnings.filterwarnings("ignore", message=_COMPILE_HOOKS_WARNING, category=UserWarning)
        self._on_remove("forward", _forget_compile_hooks_warning)

    def hand_over(self, framework: str) -> None:
        """A trainer's callback is in charge of steps from now on (``otelprof run`` attached it, see
        :mod:`otelprof.integrations.autoattach`): the global hooks of :meth:`add_everything` stop timing module
        calls, optimizer steps and data-loader fetches, and no step opens automatically or records loss or
        samples — the callback does all that as it does without ``otelprof run``. ``Tensor.backward`` stays
        timed (the callbacks rely on it) and DDP models still get their collective regions."""
        with _lock:
            if self.handed_over or self.closed:
                return
            self.handed_over = framework
            removers, self._global_removers = self._global_removers, []
            for remove in removers:
                with contextlib.suppress(Exception):
                    remove()
            self.auto.close()
            self.auto.opens = False
            self.loss = self.count_samples = False
            self.sync_native()

    # ------------------------------------------------------------------ lifecycle
    def profile_window(self, start_step: int, num_steps: int, *, chrome_trace: bool = False,
                       top: int = 15) -> dict[str, Any]:
        """Run ``torch.profiler`` for steps ``start_step`` .. ``start_step + num_steps - 1``."""
        return self.windows.arm(start_step, num_steps, chrome_trace=chrome_trace, top=top)

    def uninstrument(self) -> None:
        """Remove every hook this instrumentation installed (DDP communication hooks cannot be removed)."""
        with _lock:
            if self.closed:
                return
            self.closed = True
            for hook in list(self._removers):
                self._remove_hook(hook)
            self._close_device_timer()
            native = self.native
            if native is not None:
                self._materialise()  # a step the C hooks hold ends as the Python hooks' would
                native.release()
                self.native = None
            self.auto.close()
            if self in _active:
                _active.remove(self)
            if not _active:
                _unpatch_backward()
            elif _native_backward is not None:
                _native_backward.steps = _active[-1].native
            session = _session()
            if session is not None and session.capture_handler == self._capture:
                session.capture_handler = None

    def _capture(self, steps: int) -> dict[str, Any]:
        return self.windows.arm(hot.next_step_number(), steps, trigger="capture")


_object_class = object.__dict__["__class__"]
_NEWOBJ: Any = copyreg.__newobj__  # type: ignore[attr-defined]  # (not in the type stubs)
_RECONSTRUCTOR: Any = copyreg._reconstructor  # type: ignore[attr-defined]


def _instrumented_subclass(cls: type, namespace: dict[str, Any]) -> type:
    """A subclass of ``cls`` with ``namespace`` (the timed methods) that an instrumented object gets as its class:
    same name and module; pickled and copied (``copy.deepcopy``, ``torch.save``) as an object of ``cls``, i.e.
    without the instrumentation."""
    subclass: type

    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        reduced = cls.__reduce_ex__(self, protocol)  # type: ignore[call-arg]
        if isinstance(reduced, tuple) and len(reduced) > 1 and reduced[1] and reduced[1][0] is subclass:
            if reduced[0] is _NEWOBJ:  # pickle insists on the object's own class there
                return (_RECONSTRUCTOR, (cls, object, None), *reduced[2:])
            return (reduced[0], (cls, *reduced[1][1:]), *reduced[2:])
        return reduced

    subclass = type(cls.__name__, (cls,), {**namespace, "__reduce_ex__": __reduce_ex__, "__module__": cls.__module__,
                                           "__qualname__": cls.__qualname__, "_otelprof_instrumented": True})
    return subclass


def _set_class(obj: Any, cls: type) -> None:
    """``obj.__class__ = cls``, also for a wrapper whose ``__class__`` is a read-only property that names the
    wrapped object's class (accelerate's ``DataLoaderShard``): then object's own setter does it."""
    try:
        obj.__class__ = cls
    except AttributeError:
        _object_class.__set__(obj, cls)


def _unwrap_optimizer(optimizer: Any) -> Any:
    """The optimizer whose ``step()`` does the work: a wrapper that is an ``Optimizer`` without its state
    (accelerate's ``AcceleratedOptimizer``: ``step()`` calls the wrapped one's, only on steps that apply
    the gradients) gives the wrapped one."""
    inner = getattr(optimizer, "optimizer", None)
    if (inner is not None and inner is not optimizer and hasattr(inner, "register_step_pre_hook")
            and "_optimizer_step_pre_hooks" not in getattr(optimizer, "__dict__", {})):
        return inner
    return optimizer


def _patched_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        inst = _active[-1] if _active and hot._active is not None else None
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
        inst = _active[-1] if _active and hot._active is not None else None
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


_COMPILE_HOOKS_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"


def _forget_compile_hooks_warning() -> None:
    for entry in [f for f in warnings.filters if f[0] == "ignore" and getattr(f[1], "pattern", None)
                  == _COMPILE_HOOKS_WARNING]:
        warnings.filters.remove(entry)  # type: ignore[attr-defined]


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


def _report_loader(loader: Any) -> None:
    """The loader's worker count and pin_memory as gauges (the data-loading advice weighs them)."""
    workers = getattr(loader, "num_workers", None)
    pin = getattr(loader, "pin_memory", None)
    if isinstance(workers, int):
        _with_registry(lambda r: r.gauge(sc.DATALOADER_WORKERS).set(workers))
    if isinstance(pin, bool):
        _with_registry(lambda r: r.gauge(sc.DATALOADER_PIN_MEMORY).set(1 if pin else 0))


def _patch_dataloader_class() -> None:
    global _original_dataloader_iter
    from torch.utils.data import DataLoader

    if _original_dataloader_iter is not None:
        return
    original = DataLoader.__iter__
    _original_dataloader_iter = original

    def __iter__(self: Any) -> Any:
        try:
            iterator = original(self)
        except BaseException as exc:  # the loader's own error, as without otelprof
            _raise_as_caller(exc)
            raise
        owner = _active[-1] if _active else None
        if owner is None or getattr(self, "_otelprof_instrumented", False):
            return iterator  # an instrumented loader (or one whose wrapper is) times its own fetches
        _report_loader(self)
        return _TimedIterator(iterator, owner)

    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]


def _unpatch_dataloader_class() -> None:
    global _original_dataloader_iter
    from torch.utils.data import DataLoader

    if _original_dataloader_iter is not None:
        DataLoader.__iter__ = _original_dataloader_iter  # type: ignore[method-assign]
        _original_dataloader_iter = None


# ---------------------------------------------------------------------- DDP communication hook
# DDP takes one communication hook per model, for good. otelprof's times each bucket's reduction as a ``collective``
# region and runs the reduction itself inside: DDP's all-reduce, or the user's hook when they register one after
# otelprof's — ``register_comm_hook`` is patched to hand it over, so theirs wins and is timed. A model that has a
# hook of its own before otelprof sees it keeps it alone (no collective regions).
_ddp_hooks: weakref.WeakKeyDictionary[Any, _CommHook] = weakref.WeakKeyDictionary()
"""The DDP models that carry otelprof's communication hook."""
_original_ddp_init: Callable[..., Any] | None = None
_original_register_comm_hook: Callable[..., Any] | None = None
_original_register_builtin_comm_hook: Callable[..., Any] | None = None


def _ddp_class() -> Any:
    return getattr(torch.nn.parallel, "DistributedDataParallel", None)


class _CommHook:
    """The reduction otelprof's communication hook of one DDP model runs: DDP's default all-reduce over the
    model's process group, until the user registers a hook of their own."""

    __slots__ = ("hook", "state", "users")

    def __init__(self, process_group: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.hook: Callable[[Any, Any], Any] = default_hooks.allreduce_hook
        self.state: Any = process_group
        self.users = False
        """The user's hook is inside: a second registration fails as DDP's would."""


def _average(process_group: Any, bucket: Any) -> Any:
    """``default_hooks.allreduce_hook`` without its Python layers (``dist.all_reduce``'s checks, a second
    ``then``): the bucket divided by the group's size, all-reduced on the group itself. Its future's value is
    a list of the one tensor."""
    group: Any = process_group if process_group is not None else torch.distributed.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(group.size())
    return group.allreduce([tensor]).get_future()


def _timed_comm_hook(inner: _CommHook) -> Callable[[Any, Any], Any]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    default = default_hooks.allreduce_hook

    def otelprof_collective(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations: none here
        hook, hook_state = inner.hook, inner.state
        step: hot.StepContext | None = None
        try:
            inst = _active[-1] if _active and hot._active is not None else None
            if inst is not None:  # the step may be open on another thread (autograd's device threads)
                step = inst.auto.current if inst.auto.current is not None else _open_step()
            start = perf_counter_ns()
        except Exception:
            step = None
        if hook is default:  # DDP's own reduction, done here: the callback unwraps its value (a list of one)
            future, unwrap = _average(hook_state, bucket), True
        else:  # the user's hook, timed
            future, unwrap = hook(hook_state, bucket), False
            if step is None:
                return future

        def done(fut):  # type: ignore[no-untyped-def]
            if step is not None and not step.closed and len(step.annotations) < hot.MAX_STEP_ANNOTATIONS:
                step.annotations.append((sc.REGION_COLLECTIVE, start, perf_counter_ns(), 1, None))
            value = fut.value()
            return value[0] if unwrap else value

        return future.then(done)

    return otelprof_collective


def _hook_ddp(model: Any) -> None:
    """Give a DDP model otelprof's communication hook, unless it has one (a hook of its own, or DDP's mixed
    precision or optimizer-in-backward hook): DDP allows one, so otelprof leaves it alone, and says so once."""
    if model in _ddp_hooks:
        return
    if getattr(model, "_comm_hooks", None) or getattr(model, "_use_python_reducer", False):
        info_once("torch:comm-hook-own", "otelprof: a DDP model already has a communication hook; otelprof leaves "
                  "it alone, so its gradient reduction is not timed (no collective regions). Register your hook "
                  "after otelprof.torch.instrument() (or under `otelprof run`) to have it timed.")
        return
    _patch_register_comm_hook()
    inner = _CommHook(getattr(model, "process_group", None))
    register = _original_register_comm_hook
    assert register is not None
    try:
        register(model, None, _timed_comm_hook(inner))
    except Exception as exc:  # a built-in (C++) hook is registered already, or an unforeseen DDP
        info_once("torch:comm-hook", "otelprof: cannot time this DDP model's gradient reduction (%s); no collective "
                  "regions", exc)
        return
    _ddp_hooks[model] = inner


def _patch_register_comm_hook() -> None:
    """``register_comm_hook`` on a model with otelprof's hook puts the user's hook inside it (theirs runs, timed);
    DDP's own checks of the hook run as before. Kept for the process's life: the models keep otelprof's hook."""
    global _original_register_comm_hook, _original_register_builtin_comm_hook
    ddp = _ddp_class()
    if ddp is None or _original_register_comm_hook is not None:
        return
    original = _original_register_comm_hook = ddp.register_comm_hook
    original_builtin = _original_register_builtin_comm_hook = ddp._register_builtin_comm_hook

    @functools.wraps(original)
    def register_comm_hook(self: Any, state: object, hook: Callable[..., Any]) -> None:
        inner = _ddp_hooks.get(self)
        if inner is None or inner.users:
            original(self, state, hook)
            return
        self._check_comm_hook(hook)  # DDP's own checks: the same errors as without otelprof
        inner.hook, inner.state, inner.users = hook, state, True
        with contextlib.suppress(Exception):
            self.logger._set_comm_hook_name(hook.__qualname__)
        info_once("torch:comm-hook-user", "otelprof: your DDP communication hook %s runs inside otelprof's, which "
                  "times it as the collective region", getattr(hook, "__qualname__", hook))

    @functools.wraps(original_builtin)
    def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        inner = _ddp_hooks.get(self)
        python = {"ALLREDUCE": default_hooks.allreduce_hook,
                  "FP16_COMPRESS": default_hooks.fp16_compress_hook}.get(getattr(comm_hook_type, "name", ""))
        if inner is None or inner.users or python is None:
            original_builtin(self, comm_hook_type)
            return
        register_comm_hook(self, self.process_group, python)  # the same reduction, written in Python

    ddp.register_comm_hook = register_comm_hook
    ddp._register_builtin_comm_hook = _register_builtin_comm_hook


def _patch_ddp_class() -> None:
    """``otelprof run``: each DDP model built from now on gets otelprof's communication hook."""
    global _original_ddp_init
    ddp = _ddp_class()
    if ddp is None or _original_ddp_init is not None:
        return
    original = _original_ddp_init = ddp.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        owner = _active[-1] if _active else None
        if owner is not None and not owner.closed:
            try:
                owner._add_comm_hook(self)
            except Exception as exc:  # never the job's failure
                warn_once("torch:comm-hook-auto", "otelprof: cannot time DDP's gradient reduction (%r); no "
                          "collective regions", exc)

    ddp.__init__ = __init__


def _unpatch_ddp_class() -> None:
    global _original_ddp_init
    ddp = _ddp_class()
    if ddp is not None and _original_ddp_init is not None:
        ddp.__init__ = _original_ddp_init
        _original_ddp_init = None


def instrument(
    model: Any = None,
    optimizer: Any = None,
    dataloader: Any = None,
    *,
    grad_norm: bool = False,
    loss: bool = True,
    count_samples: bool = True,
    collections: Any = None,
) -> TorchInstrumentation:
    """Instrument a PyTorch training loop (each argument optional; calling again adds objects).

    ``grad_norm=True`` also records the global gradient norm before each ``optimizer.step()``
    (one norm per parameter tensor: measured in ``benchmarks/``). ``collections`` (names, regex forms or
    :class:`otelprof.collections.Collection`; default ``OTELPROF_COLLECTIONS``) saves tensor statistics of
    ``model`` (docs/tensors.md). Call ``otelprof.init()`` first."""
    with _lock:
        inst = _active[-1] if _active else None
        if inst is None:
            inst = TorchInstrumentation(grad_norm, loss, count_samples)
            _active.append(inst)
            _patch_backward(inst.native)
            _end_steps_at_exit()
            session = _session()
            if session is not None and hasattr(session, "capture_handler"):
                session.capture_handler = inst._capture
        else:  # one instrumentation per process: what any caller asked for is on
            inst.grad_norm = inst.grad_norm or grad_norm
            inst.loss = inst.loss or loss
            inst.count_samples = inst.count_samples or count_samples
        for part, add, obj in (("model", inst.add_model, model), ("optimizer", inst.add_optimizer, optimizer),
                               ("dataloader", inst.add_dataloader, dataloader)):
            if obj is not None:
                try:
                    add(obj)
                except Exception as exc:  # an object of an unforeseen shape: a warning, never the job's failure
                    warn_once(f"torch:add-{part}", "otelprof: cannot instrument the %s %s (%s: %s); ignored",
                              part, type(obj).__name__, type(exc).__name__, exc)
        inst.sync_native()
        _patch_accelerate()
        _collect_tensors(collections, model, False)
        return inst


def _collect_tensors(collections: Any, model: Any, discover: bool) -> None:
    """Tensor collections (:mod:`otelprof.integrations.tensors`); a failure costs them, never the job."""
    try:
        from otelprof.integrations import tensors

        tensors.collect(collections, model, discover)
    except Exception as exc:
        warn_once("torch:tensors", "otelprof: cannot save tensor collections (%s: %s); ignored",
                  type(exc).__name__, exc)


def _patch_accelerate() -> None:
    """accelerate loaded: the loss passed to ``Accelerator.backward`` is the one recorded (see
    :mod:`otelprof.integrations.accelerate`)."""
    module = sys.modules.get("accelerate.accelerator")
    if module is not None:
        try:
            from otelprof.integrations.accelerate import patch_backward

            patch_backward(module.Accelerator)
        except Exception as exc:
            warn_once("torch:accelerate", "otelprof: cannot patch accelerate (%r); the recorded loss of its "
                      "backward() is the divided one", exc)


_exit_hook: list[bool] = []


def _end_steps_at_exit() -> None:
    """Once per process: at exit, before the session's shutdown (registered earlier, so run later), the automatic
    step still open is recorded — one no event of a next iteration ended: the last evaluation batch of a loop
    without a DataLoader, the last step of a loop without an optimizer."""
    if not _exit_hook:
        _exit_hook.append(True)
        atexit.register(_end_open_steps)


def _end_open_steps() -> None:
    with _lock:
        for inst in list(_active):
            with contextlib.suppress(hot.StopTraining):  # a stop request at the very end: nothing left to stop
                inst.guarded("optimizer", inst.end_open_step)


def auto_instrument(grad_norm: bool = False) -> TorchInstrumentation:
    """Hook every optimizer, top-level module call and DataLoader in the process (``otelprof run``)."""
    inst = instrument(grad_norm=grad_norm)
    with _lock:
        if "everything" not in inst._removers:
            inst.add_everything()
            inst._removers.setdefault("everything", [])
            inst.sync_native()
    _collect_tensors(None, None, True)
    return inst


def uninstrument() -> None:
    """Remove every hook otelprof installed in PyTorch."""
    with _lock:
        for inst in list(_active):
            inst.uninstrument()
    from otelprof.integrations import tensors

    tensors.stop()


def profile_window(start_step: int, num_steps: int, *, chrome_trace: bool = False, top: int = 15) -> dict[str, Any]:
    """Profile operators with ``torch.profiler`` for ``num_steps`` steps from ``start_step``. Windows follow the
    steps, however they are marked; this turns no PyTorch hook on (``instrument()`` does, when asked)."""
    return torch_profiler.windows.arm(start_step, num_steps, chrome_trace=chrome_trace, top=top)
