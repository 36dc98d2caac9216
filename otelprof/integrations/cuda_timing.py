"""Device-side region times on CUDA: pairs of CUDA events, resolved lazily.

At a region's begin and end the :class:`DeviceTimer` records a ``torch.cuda.Event(enable_timing=True)``
on the current stream. ``record()`` only queues a marker behind the work already queued; the host does
not wait. Recorded pairs wait in a bounded queue; :meth:`DeviceTimer.poll` (the integration calls it
at each forward, i.e. once per iteration) asks the oldest ones ``end.query()``, which never blocks,
and only for pairs the GPU has reached reads ``start.elapsed_time(end)``. No ``synchronize()``, no
``elapsed_time()`` on an unfinished event, ever. A pair measures the stream from reaching the region's
start marker to finishing the region's last queued work: kernel time plus any gaps in which the GPU
waited for the host to queue more.

Resolved times go to the recorder as one queued record (``hotpath.DEVICE``): the histogram
``otelprof.region.device.duration`` and a late ``steps.jsonl`` line keyed by the step's phase and number.

Bounds: at most ``PENDING_PAIRS`` recorded pairs wait for the GPU; past that the oldest is dropped and
counted (``otelprof.exporter.dropped{exporter="cuda_events"}``). Events of resolved pairs are reused.
Never harm training: an exception from the event API turns the timer off (the integration counts it
and warns once) and host times go on; nothing is recorded or queried while a CUDA graph is being
captured (an event query would invalidate the capture).

The seam is :data:`backend`: tests put fake events there.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from otelprof import semconv as sc
from otelprof.runtime import hotpath as hot

__all__ = ["CUDA", "DROPPED_LABEL", "PENDING_PAIRS", "Backend", "DeviceTimer", "backend"]

PENDING_PAIRS = 128
"""Recorded pairs that may wait for the GPU (about 40 iterations of forward, backward, optimizer)."""
POOL_PAIRS = 16
"""Resolved pairs kept for reuse."""
MAX_OPEN = 8
"""Begun pairs of one region whose end has not come (a forward that raised skips its end hook)."""
DROPPED_LABEL = sc.DROPPED_CUDA_EVENTS
"""``exporter`` label of ``otelprof.exporter.dropped`` for pairs dropped from the pending queue."""


def _module_on_cuda(module: Any) -> bool | None:
    """Whether the module's first parameter (or buffer) is on a CUDA device; None when it has neither."""
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        return bool(tensor.device.type == "cuda")
    return None


def _timing_event() -> Any:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class Backend:
    """Everything the timer asks of CUDA."""

    on_cuda: Callable[[Any], bool | None]
    """module -> True when it lives on a CUDA device, False when not, None when it cannot tell."""
    available: Callable[[], bool]
    capturing: Callable[[], bool]
    """True while the current stream is capturing a CUDA graph."""
    new_event: Callable[[], Any]
    """A timing event: ``record()``, ``query()``, ``elapsed_time(end)`` (milliseconds)."""


CUDA = Backend(_module_on_cuda, torch.cuda.is_available, torch.cuda.is_current_stream_capturing, _timing_event)
backend: Backend = CUDA


class _Pair:
    __slots__ = ("start", "end", "region", "phase", "number")

    def __init__(self, start: Any, end: Any) -> None:
        self.start = start
        self.end = end
        self.region = ""
        self.phase = ""
        self.number: int | None = None


class DeviceTimer:
    """CUDA event pairs around regions; all calls on the training thread, none of them waits for the GPU."""

    def __init__(self, backend: Backend, on_error: Callable[[Exception], None],
                 on_dropped: Callable[[int], None], capacity: int = PENDING_PAIRS) -> None:
        self.capacity = capacity
        self.disabled = False
        self.dropped = 0
        self._reported_dropped = 0
        self._capturing = backend.capturing
        self._new_event = backend.new_event
        self._on_error = on_error
        self._on_dropped = on_dropped
        self._pending: deque[_Pair] = deque()
        self._open: dict[str, list[_Pair]] = {}
        self._pool: list[_Pair] = []

    @property
    def pending(self) -> int:
        """Recorded pairs the GPU has not been seen to finish."""
        return len(self._pending)

    def begin(self, region: str) -> None:
        if self.disabled or hot._active is None:
            return
        try:
            if self._capturing():
                return
            pair = self._pool.pop() if self._pool else _Pair(self._new_event(), self._new_event())
            step = hot._tls.step
            if step is not None:
                pair.phase, pair.number = step.phase, step.number
            else:
                pair.phase, pair.number = hot._phase[0], None
            pair.region = region
            pair.start.record()
        except Exception as exc:
            self._fail(exc)
            return
        stack = self._open.get(region)
        if stack is None:
            stack = self._open[region] = []
        elif len(stack) >= MAX_OPEN:
            del stack[0]
        stack.append(pair)

    def end(self, region: str) -> None:
        stack = self._open.get(region)
        if not stack or self.disabled:
            return
        pair = stack.pop()
        try:
            if self._capturing():
                return
            pair.end.record()
        except Exception as exc:
            self._fail(exc)
            return
        pending = self._pending
        if len(pending) >= self.capacity:
            pending.popleft()  # its events may still be queued on the GPU: not reused
            self.dropped += 1
        pending.append(pair)

    def poll(self) -> None:
        """Resolve the pairs the GPU has finished, oldest first; stop at the first it has not."""
        if self.disabled:
            return
        pending = self._pending
        if pending:
            done: list[tuple[str, int | None, str, int]] = []
            try:
                if self._capturing():
                    return
                pool = self._pool
                while pending:
                    pair = pending[0]
                    if not (pair.end.query() and pair.start.query()):
                        break
                    ms = pair.start.elapsed_time(pair.end)
                    pending.popleft()
                    if ms >= 0:
                        done.append((pair.phase, pair.number, pair.region, int(ms * 1e6)))
                    if len(pool) < POOL_PAIRS:
                        pool.append(pair)
            except Exception as exc:
                self._fail(exc)
                return
            recorder = hot._active
            if done and recorder is not None:
                recorder.submit((hot.DEVICE, done))
        if self.dropped != self._reported_dropped:
            count, self._reported_dropped = self.dropped - self._reported_dropped, self.dropped
            self._on_dropped(count)

    def close(self) -> None:
        """A last non-blocking poll, then off: pairs the GPU has not finished are forgotten."""
        self.poll()
        self.disabled = True
        self._clear()

    def _clear(self) -> None:
        self._pending.clear()
        self._open.clear()
        self._pool.clear()

    def _fail(self, exc: Exception) -> None:
        self.disabled = True
        self._clear()
        self._on_error(exc)
