"""The hot path: ``step()``, ``phase()``, ``annotate()``, ``annotation_begin/end()``, ``record()``.

Each call reads a monotonic clock and appends a tuple to a list or a bounded
queue; everything else (histograms, spans, the recording) happens in the
recorder's background thread. With no active session every call is a no-op.
Nothing here raises into user code: user exceptions pass through untouched.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns
from types import TracebackType
from typing import Any, Protocol, TypeVar

from otelprof import _arguments

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_PHASE = "train"

# Record tags the recorder reads (Recorder._drain, on its own thread).
STEP = "s"
ANNOTATION = "a"
SCALAR = "x"
PHASE = "p"
DEVICE = "d"
"""Device times resolved after their steps closed (CUDA events): ``(DEVICE, [(phase, number, region, ns), ...])``."""
NATIVE_STEP = "n"
"""A step the PyTorch integration's C hooks closed: ``(NATIVE_STEP, steps)``, one per step, in order;
``steps.pop()`` builds its ``STEP`` record (on the recorder's thread, not the training thread)."""



class Sink(Protocol):
    """What the hot path appends its records to: the session's recorder (:mod:`otelprof.runtime.recorder`)."""

    queue: deque[tuple[Any, ...]]
    capacity: int
    queue_dropped: int

    def submit(self, item: tuple[Any, ...]) -> None: ...


_active: Sink | None = None


Sum = list
"""A step's scalar made of parts that the recorder adds up, off the hot path: the losses passed to ``backward()``
in one step (numbers, or tensors converted there). A plain list, the cheapest object to make on the training
thread: a list recorded as a scalar is its sum."""


class Mean(list):  # type: ignore[type-arg]
    """A step's scalar made of parts that the recorder averages, off the hot path: the losses of an evaluation
    step's forwards."""

    __slots__ = ()


MAX_STEP_ANNOTATIONS = 4096
"""Regions kept inside one step; past this (a step that never ends) they are dropped and counted
(``otelprof.exporter.dropped{exporter="step_regions"}``), so that an open step cannot grow without bound."""
dropped_regions = 0
class _ThreadState(threading.local):
    """Per-thread hot-path state: the step open on this thread (a class default, so reads need no getattr).
    An access costs ~500 machine instructions, ten times a plain attribute's: the hot path reads it as
    little as it can, and the region depth lives on the step (``StepContext.depth``)."""

    step: StepContext | None = None


_tls = _ThreadState()
_phase: list[str] = [DEFAULT_PHASE]
_step_numbers: dict[str, int] = {}
_open_regions: dict[str, tuple[int, StepContext | None]] = {}
_step_begin: list[Callable[[StepContext], None]] = []
"""Run on the training thread as a step starts, while non-empty (profiler windows about to open)."""
_step_boundary: list[Callable[[], None]] = []
"""Run on the training thread when a step closes, while non-empty (stop requests, armed captures)."""
_native: list[Callable[[], None] | None] = [None]
"""While the PyTorch integration's C hooks hold a step of their own (``otelprof.integrations._torch_native``):
the call that hands it over, so that it becomes the thread's StepContext. The calls below that find no step
open on the thread make it first; the C code sets and clears this item in place."""


def _activate(recorder: Sink | None) -> None:
    """Route the hot path to ``recorder`` (None: everything becomes a no-op)."""
    global _active
    _active = recorder
    _tls.__dict__.clear()
    _phase[0] = DEFAULT_PHASE
    _step_numbers.clear()
    _open_regions.clear()
    _step_boundary.clear()
    _step_begin.clear()


def current_phase() -> str:
    return _phase[0]


def next_step_number(phase: str | None = None) -> int:
    """The number the next step of ``phase`` (default: the current phase) will get."""
    return _step_numbers.get(phase or _phase[0], 0)


class StepContext:
    """One training step; use as ``with otelprof.step(): ...``."""

    __slots__ = ("phase", "number", "start_ns", "annotations", "scalars", "closed", "depth", "_previous")

    def __init__(self, phase: str | None, number: int | None) -> None:
        # Only explicit arguments are checked (the automatic ones cost nothing more): a phase that is not a
        # non-empty str is the current phase, a number that is not an int in range the next number.
        if phase is None:
            phase = _phase[0]
        elif type(phase) is not str or not phase:
            phase = _phase_argument(phase)
        if number is None:
            number = _step_numbers.get(phase, 0)
        elif type(number) is not int or number >> 63:  # not an int from 0 to 2**63-1 (MAX_STEP_NUMBER)
            number = _arguments.number_argument(number)
            if number is None:
                number = _step_numbers.get(phase, 0)
        _step_numbers[phase] = number + 1
        self.phase = phase
        self.number = number
        self.annotations: list[tuple[str, int, int, int, str | None]] = []
        self.scalars: dict[str, Any] | None = None
        self.closed = False
        self.start_ns = 0
        # Regions open in this step, i.e. the depth of the next one; per step, so that a nested step starts
        # from 0 and leaves its parent's count alone.
        self.depth = 0

    def __enter__(self) -> StepContext:
        tls = _tls
        previous = tls.step
        if previous is None and (native := _native[0]) is not None:  # an automatic step held in C: hand it over
            native()
            previous = tls.step
        self._previous = previous
        tls.step = self
        if _step_begin:
            _run_step_begin(self)
        self.start_ns = perf_counter_ns()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        end_ns = perf_counter_ns()
        self.closed = True
        _tls.step = self._previous
        recorder = _active
        if recorder is not None:  # Recorder.submit inline: one call less per step
            queue = recorder.queue
            if len(queue) < recorder.capacity:
                queue.append((STEP, self.phase, self.number, self.start_ns, end_ns, self.annotations, self.scalars,
                              exc_type.__name__ if exc_type is not None else None))
            else:
                recorder.queue_dropped += 1
        if _step_boundary and self._previous is None and exc_type is None:
            run_step_boundary()


def _phase_argument(phase: object) -> str:
    """``step(phase=...)`` that is not a non-empty str: "" is the current phase (as None), anything else is
    used as a name where it is a str, else dropped for the current phase."""
    if isinstance(phase, str) and str.__len__(phase) == 0:
        return _phase[0]
    return _arguments.name_argument(phase, "step-phase", "step(phase=...)") or _phase[0]


_new_object = object.__new__


def _begin_step(previous: StepContext | None) -> StepContext:
    """``StepContext(None, None).__enter__()`` for the integrations' automatic steps (one per iteration), on
    a thread whose open step the caller just read (``previous``). Written out because calling the class
    (type.__call__ and slot_tp_init: ~2,000 machine instructions) and reading the thread-local again cost
    more than the rest of opening a step. Keep it in line with ``__init__`` and ``__enter__``."""
    step: StepContext = _new_object(StepContext)
    phase = _phase[0]
    number = _step_numbers.get(phase, 0)
    _step_numbers[phase] = number + 1
    step.phase = phase
    step.number = number
    step.annotations = []
    step.scalars = None
    step.closed = False
    step.depth = 0
    step._previous = previous
    _tls.step = step
    if _step_begin:
        _run_step_begin(step)
    step.start_ns = perf_counter_ns()
    return step


def _end_step(step: StepContext, end_ns: int) -> None:
    """``step.__exit__(None, None, None)`` with the step ending at ``end_ns``, not now: for an automatic step whose
    end an integration learns afterwards (the last of several optimizers' updates in an iteration, seen from the
    next iteration's first event). Keep it in line with ``__exit__``."""
    step.closed = True
    _tls.step = step._previous
    recorder = _active
    if recorder is not None:
        queue = recorder.queue
        if len(queue) < recorder.capacity:
            queue.append((STEP, step.phase, step.number, step.start_ns, end_ns, step.annotations, step.scalars, None))
        else:
            recorder.queue_dropped += 1
    if _step_boundary and step._previous is None:
        run_step_boundary()


def run_step_boundary() -> None:
    """Run the pending step-boundary callbacks (each at most once). A callback may raise on purpose
    (``StopTraining`` when the user asked for it); other errors are logged, never raised."""
    from otelprof._log import logger

    callbacks = _step_boundary[:]
    del _step_boundary[: len(callbacks)]  # callbacks may re-arm themselves for the next boundary
    for callback in callbacks:
        try:
            callback()
        except StopTraining:
            raise
        except Exception:
            logger.exception("otelprof: a step-boundary callback failed")


def _run_step_begin(step: StepContext) -> None:
    from otelprof._log import logger

    for callback in _step_begin[:]:
        try:
            callback(step)
        except Exception:
            logger.exception("otelprof: a step-begin callback failed")


class StopTraining(Exception):
    """Raised at a step boundary after a stop request, only with ``init(stop_raises=True)``."""


class _NoopStep:
    """What ``step()`` returns with no session: same shape, no work."""

    phase = DEFAULT_PHASE
    number = 0

    def __enter__(self) -> _NoopStep:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_NOOP_STEP = _NoopStep()


def step(phase: str | None = None, number: int | None = None) -> Any:
    """Mark one training step. ``phase`` defaults to the current phase ("train");
    ``number`` defaults to the next number of that phase (from 0)."""
    if _active is None:
        return _NOOP_STEP
    return StepContext(phase, number)


class _Region:
    """``annotate(name)``: a context manager, and a decorator that annotates each call."""

    __slots__ = ("name", "start_ns", "_step", "_depth")

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> _Region:
        step = _tls.step
        if step is None and (native := _native[0]) is not None:
            native()
            step = _tls.step
        self._step = step
        if step is not None:
            depth = step.depth
            step.depth = depth + 1
        else:
            depth = 0  # outside steps the depth is not recorded
        self._depth = depth
        self.start_ns = perf_counter_ns()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        end_ns = perf_counter_ns()
        step = self._step
        if step is not None:
            step.depth = self._depth
        error = exc_type.__name__ if exc_type is not None else None
        _close_region(self.name, self.start_ns, end_ns, step, self._depth, error)

    def __call__(self, func: F) -> F:
        name = self.name

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _active is None:
                return func(*args, **kwargs)
            with _Region(name):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def _begin_region(step: StepContext | None) -> tuple[int, StepContext | None, int]:
    """Open a region without a ``_Region`` object (integrations' per-step hooks): ``(start_ns, step, depth)``
    for :func:`_end_region`; ``step`` is the step open on the thread."""
    if step is None:
        return perf_counter_ns(), None, 0
    depth = step.depth
    step.depth = depth + 1
    return perf_counter_ns(), step, depth


def _record_into(step: StepContext | None, name: str, value: Any) -> None:
    """:func:`record` for a step the caller already holds (the one open on the thread)."""
    if step is not None and _active is not None:
        if step.scalars is None:
            step.scalars = {}
        step.scalars[name] = value
    else:
        record(name, value)


def _add_into(step: StepContext | None, name: str, amount: int) -> None:
    """Add ``amount`` to the step's scalar ``name`` (per-step totals such as ``samples``)."""
    if step is not None and _active is not None:
        scalars = step.scalars
        if scalars is None:
            step.scalars = {name: amount}
        else:
            scalars[name] = scalars.get(name, 0) + amount
    else:
        record(name, amount)


def _end_region(name: str, start_ns: int, step: StepContext | None, depth: int) -> None:
    """Close a region opened by :func:`_begin_region`: the record ``_Region.__exit__`` makes, no error.
    The usual case (an open step with room) is :func:`_close_region`'s first branch inline: one call less
    per region on the training thread."""
    end_ns = perf_counter_ns()
    if step is not None:
        step.depth = depth
        if not step.closed and len(annotations := step.annotations) < MAX_STEP_ANNOTATIONS:
            annotations.append((name, start_ns, end_ns, depth, None))
            return
    _close_region(name, start_ns, end_ns, step, depth, None)


def _close_region(name: str, start_ns: int, end_ns: int, step: StepContext | None, depth: int,
                  error: str | None) -> None:
    if step is not None and not step.closed:
        annotations = step.annotations
        if len(annotations) < MAX_STEP_ANNOTATIONS:
            annotations.append((name, start_ns, end_ns, depth, error))
        else:
            global dropped_regions
            dropped_regions += 1
        return
    recorder = _active
    if recorder is not None:
        recorder.submit((ANNOTATION, name, _phase[0] if step is not None else None, start_ns, end_ns, error))


class _NoRegion:
    """What ``annotate()`` returns for a name it cannot use: times nothing, decorates as the identity."""

    __slots__ = ()

    def __enter__(self) -> _NoRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, func: F) -> F:
        return func


_NO_REGION = _NoRegion()


def annotate(name: str) -> _Region | _NoRegion:
    """Time a region: ``with otelprof.annotate("forward"): ...`` or ``@otelprof.annotate("load")``.

    Inside a step the region becomes a child of the step; outside steps
    (initialization, checkpointing) it is recorded on its own."""
    if type(name) is str and name:
        return _Region(name)
    checked = _arguments.name_argument(name, "annotate-name", "annotate()")
    return _NO_REGION if checked is None else _Region(checked)


def _region_name(name: object, what: str) -> str | None:
    return name if type(name) is str and name else _arguments.name_argument(name, "annotate-name", what)


def annotation_begin(name: str) -> None:
    """Start a region that does not nest lexically; close it with :func:`annotation_end`."""
    if _active is None:
        return
    checked = _region_name(name, "annotation_begin()")
    if checked is None:
        return
    if len(_open_regions) >= MAX_STEP_ANNOTATIONS and checked not in _open_regions:  # begun, never ended
        _arguments.reject("annotation-begin", "more than %d regions begun with annotation_begin() and not ended",
                          MAX_STEP_ANNOTATIONS)
        return
    step = _tls.step
    if step is None and (native := _native[0]) is not None:
        native()
        step = _tls.step
    _open_regions[checked] = (perf_counter_ns(), step)


def annotation_end(name: str) -> None:
    """Close the region opened by ``annotation_begin(name)``; an unknown name is ignored (one warning)."""
    end_ns = perf_counter_ns()
    if _active is None:
        return
    checked = _region_name(name, "annotation_end()")
    if checked is None:
        return
    opened = _open_regions.pop(checked, None)
    if opened is None:
        _arguments.reject("annotation-end", "annotation_end(%s) without annotation_begin", _arguments.describe(checked))
        return
    _close_region(checked, opened[0], end_ns, opened[1], 0, None)


def record(name: str, value: Any) -> None:
    """Record a training scalar: ``loss``, ``learning_rate`` (or ``lr``), ``grad_norm``,
    ``samples`` and ``tokens`` (per step; their rate is throughput), or any other name
    (kept in spans and the recording). The value is the one at the call, also for a tensor changed in place
    afterwards: a CPU tensor's number is read now, a GPU tensor is copied on its stream and converted off the
    hot path (:func:`_value_now`); a list of numbers or tensors counts as their sum."""
    recorder = _active
    if recorder is None:
        return
    kind = type(value)
    if kind is not float and kind is not int:  # a tensor may change in place later: its value now
        value = _value_now(value)
    current = _tls.step
    if current is None and (native := _native[0]) is not None:
        native()
        current = _tls.step
    if current is not None:
        if current.scalars is None:
            current.scalars = {}
        try:  # free unless it raises: the name and value are checked on the recorder's thread
            current.scalars[name] = value
        except Exception:  # an unhashable name
            _arguments.reject("record-name", "record() got a name that is not a non-empty string (%s)",
                              _arguments.type_name(name))
    else:
        recorder.submit((SCALAR, name, value, _phase[0], perf_counter_ns()))


def _value_now(value: Any) -> Any:
    """What ``record()`` keeps of ``value``: its value at the call, so that an object changed in place afterwards
    (a running-loss tensor accumulated with ``+=`` and reset) is recorded as it was. A one-element tensor on a
    CPU, a NumPy scalar or 0-d array: the number (``item()``, no synchronisation there); a one-element tensor on
    another device: a detached copy queued on its stream (converted off the hot path, as before); any other array
    (JAX, CuPy, TensorFlow: ``item()`` would wait on its device) as it is, read on the recorder's thread; a list:
    its items so. Anything else as it is (the recorder rejects what is not a number)."""
    try:
        if type(value) is list:
            return [_item_now(item) for item in value]
        return _item_now(value)
    except Exception:
        return value


def _item_now(value: Any) -> Any:
    is_cpu = getattr(value, "is_cpu", None)
    if is_cpu is False:  # a tensor on a device: copied there, never read here
        return value.detach().clone() if value.numel() == 1 else value
    if is_cpu is None and not type(value).__module__.startswith("numpy"):
        # not a torch tensor nor NumPy's (a JAX, CuPy or TensorFlow array): reading it may wait on its device,
        # so the recorder's thread reads it (``_arguments.to_float``), never the training thread
        return value
    item = getattr(value, "item", None)
    if item is None:
        return value
    try:
        return item()
    except Exception:  # more than one element: rejected by the recorder, as before
        return value


class _PhaseContext:
    __slots__ = ("_previous",)

    def __init__(self, previous: str) -> None:
        self._previous = previous

    def __enter__(self) -> _PhaseContext:
        return self

    def __exit__(self, *exc: object) -> None:
        _set_phase(self._previous)


def _set_phase(name: str) -> None:
    if _phase[0] == name:
        return
    _phase[0] = name
    recorder = _active
    if recorder is not None:
        recorder.submit((PHASE, name, perf_counter_ns()))


def phase(name: str) -> _PhaseContext:
    """Switch the current phase (train, eval, ...) for the steps that follow.

    As a context manager (``with otelprof.phase("eval"):``) the previous phase
    comes back on exit; as a plain call the switch stays. A name that is not a non-empty string switches
    nothing (one warning)."""
    previous = _phase[0]
    checked = name if type(name) is str and name else _arguments.name_argument(name, "phase-name", "phase()")
    if checked is not None:
        _set_phase(_arguments.clean_name(checked))
    return _PhaseContext(previous)
