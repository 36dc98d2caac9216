"""The ``dataloader`` region: each ``next()`` of a data loader's iterator is timed (:class:`_TimedIterator`) and
its batch's samples counted; ``instrument(dataloader=...)`` times one loader, ``otelprof run`` every
``DataLoader``."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator
from time import perf_counter_ns
from typing import Any

from otelprof import semconv as sc
from otelprof._log import warn_once
from otelprof.integrations._iterators import IteratorProxy
from otelprof.integrations.torch_hooks import _Hooks
from otelprof.integrations.torch_scalars import _batch_size
from otelprof.integrations.torch_state import (
    _DATALOADER,
    _SAMPLES,
    FETCH,
    _active,
    _native,
    _OpenRegion,
    _Tensor,
    _with_registry,
)
from otelprof.integrations.torch_subclass import _instrumented_subclass, _set_class
from otelprof.runtime import hotpath as hot

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

    def __init__(self, iterator: Iterator[Any], owner: _LoaderHooks) -> None:
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


class _LoaderHooks(_Hooks):
    """The data-loader hooks of an instrumentation."""

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


def _report_loader(loader: Any) -> None:
    """The loader's worker count and pin_memory as gauges (the data-loading advice weighs them)."""
    workers = getattr(loader, "num_workers", None)
    pin = getattr(loader, "pin_memory", None)
    if isinstance(workers, int):
        _with_registry(lambda r: r.gauge(sc.DATALOADER_WORKERS).set(workers))
    if isinstance(pin, bool):
        _with_registry(lambda r: r.gauge(sc.DATALOADER_PIN_MEMORY).set(1 if pin else 0))


_original_dataloader_iter: Callable[..., Any] | None = None
"""``DataLoader.__iter__`` while ``otelprof run``'s patch is on."""


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
        owner: _LoaderHooks | None = _active[-1] if _active else None
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
