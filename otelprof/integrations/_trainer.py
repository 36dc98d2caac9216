"""What the trainer callbacks (Lightning, Hugging Face ``Trainer``) share.

* :class:`SessionOwner` starts a session when none runs and shuts down only the one it started.
* :class:`StepTracker` opens a step at the framework's "batch starts" event, closes it at its
  "optimizer step done" event, times regions between two framework events, times data-loader fetches
  (:meth:`StepTracker.time_fetches`, :meth:`StepTracker.time_all_fetches`) and attaches a fetch made
  before its step opened to that step (the step then starts at the fetch), and sums per-step scalars
  (samples, loss parts).
* Failures are caught: counted in ``otelprof.integration.errors`` (``hook`` = ``<framework>.<part>``),
  warned about once, and that part of the callback turns itself off; training goes on.

A tracker opens a step only when none is open on the thread (a step the user marks, or one that
``otelprof.torch`` opened, is used as it is) and closes only the steps it opened, so combining a
callback with ``otelprof.torch.instrument()`` never counts a step twice.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from time import perf_counter_ns
from typing import Any

from otelprof import semconv as sc
from otelprof._log import warn_once
from otelprof.integrations._iterators import IteratorProxy
from otelprof.runtime import hotpath as hot

PENDING_FETCHES = 64
"""Fetches kept while no step is open (a loader iterated outside the trainer must not grow memory)."""

PART_CALLBACK = "callback"
PART_DATALOADER = "dataloader"
PART_SCALARS = "scalars"
PART_TEARDOWN = "teardown"
"""Undoing what the callback installed: runs even after the callback turned itself off."""


def open_step() -> hot.StepContext | None:
    """The step open on this thread (the user's, ``otelprof.torch``'s or a callback's)."""
    step: hot.StepContext | None = getattr(hot._tls, "step", None)
    return step


def batch_size(batch: Any) -> int | None:
    """First dimension of the first tensor-like value of a batch (tensor, sequence or mapping)."""
    for _ in range(3):
        shape = getattr(batch, "shape", None)
        if shape is not None:
            return int(shape[0]) if len(shape) > 0 else None
        if isinstance(batch, (list, tuple)) and batch:
            batch = batch[0]
        elif isinstance(batch, dict) and batch:
            batch = next((v for v in batch.values() if hasattr(v, "shape")), next(iter(batch.values())))
        else:
            return None
    return None


def torch_instrumentation() -> Any:
    """The running ``otelprof.torch`` instrumentation, if that module is loaded and one is active."""
    import sys

    module = sys.modules.get("otelprof.integrations.torch")
    active = getattr(module, "_active", None)
    return active[-1] if active else None


def warn_if_torch_hooked(framework: str, inst: Any, optimizers: bool) -> None:
    """One warning when ``otelprof.torch`` also hooks the model (or, ``optimizers``, an optimizer) or runs
    everywhere (``otelprof run``) without having handed steps over to a trainer's callback: regions would be
    timed twice."""
    if inst is None:
        return
    everywhere = "everything" in getattr(inst, "_removers", ()) and not getattr(inst, "handed_over", "")
    if len(inst.models) or (optimizers and len(inst.optimizers)) or everywhere:
        warn_once(f"callback:{framework}:torch", "otelprof: otelprof.torch hooks (instrument() or `otelprof run`) "
                  "and the %s callback both time this run, so regions appear twice: use the callback alone",
                  framework)


class SessionOwner:
    """Starts an otelprof session when none runs; shuts down (or flushes) only the one it started."""

    def __init__(self, init_kwargs: dict[str, Any], shutdown: bool) -> None:
        self.init_kwargs = init_kwargs
        self.shutdown = shutdown
        self.session: Any = None
        """The session this callback started, or None (none started, or the user's is used)."""

    def ensure(self) -> None:
        from otelprof.runtime.session import Session, get_session, init

        if get_session() is not None:
            return
        session = init(**self.init_kwargs)
        self.session = session if isinstance(session, Session) else None

    def end(self) -> None:
        """At the end of training: shut down (``shutdown=True``) or flush the session this callback started."""
        session = self.session
        if session is None:
            return
        if self.shutdown:
            self.session = None
            session.shutdown()
        else:
            session.flush()


class StepTracker:
    """Steps, regions and per-step scalars driven by a trainer's events (see the module docstring)."""

    def __init__(self, framework: str) -> None:
        self.framework = framework
        self.step: hot.StepContext | None = None
        """The step this tracker opened and has not closed."""
        self.regions: dict[str, hot._Region] = {}
        self.pending: list[tuple[int, int]] = []
        """Fetches (start, end) made while no step was open: they belong to the next step."""
        self.samples = 0
        self.loss_parts: list[Any] = []
        self.off: set[str] = set()
        self.undo: Callable[[], None] | None = None
        """Run when the callback turns itself off: remove what it installed."""
        self._loaders: list[tuple[weakref.ref[Any], type]] = []
        self.device: Any = None
        """The ``otelprof.torch`` instrumentation whose device timer (CUDA events) also times this tracker's
        regions, once the callback told it the model (``time_device_of``)."""

    # ------------------------------------------------------------------ failures
    def guarded(self, part: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run callback code; on an error turn ``part`` off, count it, warn once, and carry on."""
        if part in self.off:
            return None
        try:
            return fn(*args)
        except hot.StopTraining:
            raise
        except Exception as exc:
            self.failed(part, exc)
            return None

    def failed(self, part: str, exc: BaseException) -> None:
        self.off.add(part)
        label = f"{self.framework}.{part}"
        from otelprof.runtime.session import get_session

        session = get_session()
        if session is not None:
            with session.registry.lock:
                session.registry.counter(sc.INTEGRATION_ERRORS).add(1, (label,))
        warn_once(f"callback:{label}", "otelprof: the %s callback failed in its %s part (%r), which was turned "
                  "off; training goes on without it", self.framework, part, exc)
        if part == PART_CALLBACK:
            self.off.add(PART_DATALOADER)
            with contextlib.suppress(Exception):
                self.close()
            self.restore_loaders()
            if self.undo is not None:
                with contextlib.suppress(Exception):
                    self.undo()

    @property
    def on(self) -> bool:
        """Record anything at all: a session is running and the callback has not turned itself off."""
        return hot._active is not None and PART_CALLBACK not in self.off

    # ------------------------------------------------------------------ steps
    def open(self, phase: str | None = None, start_ns: int | None = None) -> None:
        """Open a step (unless one is open: then this batch belongs to it). It starts at the earliest
        fetch waiting for it, or at ``start_ns`` when given and earlier."""
        if not self.on:
            self.pending.clear()
            return
        current = open_step()
        if current is None:
            step = hot.StepContext(phase, None)
            step.__enter__()
            starts = [start for start, _ in self.pending]
            if start_ns is not None:
                starts.append(start_ns)
            if starts:
                step.start_ns = min(step.start_ns, *starts)
            self.step = current = step
        for start, end in self.pending:
            current.annotations.append((sc.REGION_DATALOADER, start, end, 0, None))
        self.pending.clear()

    def close(self, error: BaseException | None = None) -> None:
        """Close the open regions, write the step's scalars and close the step this tracker opened."""
        for name in reversed(list(self.regions)):
            self.end(name)
        step, self.step = self.step, None
        samples, self.samples = self.samples, 0
        if step is None or step.closed or open_step() is not step:
            self.loss_parts.clear()
            return
        if samples:
            hot.record("samples", samples)
        step.__exit__(type(error) if error is not None else None, error, None)

    def add_samples(self, size: int | None) -> None:
        """Samples of a batch of the open step (summed into the step this tracker opened)."""
        if not size or not self.on:
            return
        if self.step is not None and open_step() is self.step:
            self.samples += size
        elif open_step() is not None:
            hot.record("samples", size)

    def take_loss_parts(self) -> list[Any]:
        parts, self.loss_parts = self.loss_parts, []
        return parts

    # ------------------------------------------------------------------ regions
    def begin(self, name: str) -> None:
        if not self.on or name in self.regions:
            return
        region = hot._Region(name)
        region.__enter__()
        self.regions[name] = region
        if self.device is not None:
            self.device.device_begin(name, poll=name == sc.REGION_FORWARD)

    def end(self, name: str) -> None:
        region = self.regions.pop(name, None)
        if region is not None:
            region.__exit__(None, None, None)
            if self.device is not None:
                self.device.device_end(name)

    def add_region(self, name: str, start_ns: int, end_ns: int) -> None:
        """A region measured between two events, added to the open step."""
        step = open_step()
        if step is not None and not step.closed and end_ns > start_ns:
            step.annotations.append((name, start_ns, end_ns, 0, None))

    # ------------------------------------------------------------------ data loader
    def fetched(self, start: int, end: int) -> None:
        step = open_step()
        if step is None:
            if len(self.pending) < PENDING_FETCHES:
                self.pending.append((start, end))
        elif not step.closed:
            step.annotations.append((sc.REGION_DATALOADER, start, end, 0, None))

    def time_fetches(self, loader: Any) -> None:
        """Time each ``next()`` on ``loader``'s iterators (an accelerate adapter: its base loader)."""
        base = loader.__dict__.get("base_dataloader") if hasattr(loader, "__dict__") else None
        target = base if base is not None else loader
        if PART_DATALOADER in self.off or target is None or not hasattr(target, "__iter__"):
            return
        if getattr(target, "_otelprof_fetches", None) is not None:
            target.__dict__["_otelprof_fetches"] = self  # wrapped before (an earlier fit): this tracker now
            return
        cls = type(target)
        original_iter = cls.__iter__

        def __iter__(this: Any) -> Any:
            iterator = original_iter(this)
            tracker = this.__dict__.get("_otelprof_fetches")
            return iterator if tracker is None else _TimedFetches(iterator, tracker)

        try:
            target.__class__ = type(cls.__name__, (cls,), {"__iter__": __iter__, "__module__": cls.__module__,
                                                          "__qualname__": cls.__qualname__})
        except (TypeError, AttributeError):
            warn_once(f"callback:{self.framework}:loader", "otelprof: cannot time the data loader %s; the "
                      "dataloader region is missing", cls.__name__)
            return
        target.__dict__["_otelprof_fetches"] = self
        self._loaders.append((weakref.ref(target), cls))

    def time_all_fetches(self) -> Callable[[], None]:
        """Time ``next()`` on every ``DataLoader`` iterated from now on (for a trainer that creates its
        iterators before any callback event); the returned function undoes it."""
        from torch.utils.data import DataLoader

        original = DataLoader.__iter__
        tracker = self
        live = [True]

        def __iter__(this: Any) -> Any:
            iterator = original(this)
            if not live[0] or hot._active is None or PART_DATALOADER in tracker.off:
                return iterator
            return _TimedFetches(iterator, tracker)

        DataLoader.__iter__ = __iter__  # type: ignore[method-assign]

        def restore() -> None:
            live[0] = False  # patched again on top of this one: stays in the chain, times nothing
            if DataLoader.__iter__ is __iter__:
                DataLoader.__iter__ = original  # type: ignore[method-assign]

        return restore

    def restore_loaders(self) -> None:
        loaders, self._loaders = self._loaders, []
        for ref, cls in loaders:
            loader = ref()
            if loader is None:
                continue
            with contextlib.suppress(Exception):
                loader.__dict__.pop("_otelprof_fetches", None)
                loader.__class__ = cls


class _TimedFetches(IteratorProxy):
    """A data-loader iterator whose ``next()`` calls are timed for a :class:`StepTracker`."""

    def __init__(self, iterator: Iterator[Any], tracker: StepTracker) -> None:
        super().__init__(iterator)
        self._tracker = tracker

    def __next__(self) -> Any:
        tracker = self._tracker
        if hot._active is None or PART_DATALOADER in tracker.off:
            return next(self._iterator)
        start = perf_counter_ns()
        batch = next(self._iterator)  # the end of the epoch is not a fetch
        tracker.guarded(PART_DATALOADER, tracker.fetched, start, perf_counter_ns())
        return batch

