"""How big a profiling window may grow: an event cap, what an event costs, and the watch that ends a window early.

``torch.profiler`` keeps every event of a window in memory until the window stops, and stopping it, exporting the
trace and summarising it cost time in proportion to the events. A step of a few hundred thousand tiny operators
(an LBFGS closure, a Python loop over a sequence) makes a window of millions of events: gigabytes and minutes.
So a window holds at most ``OTELPROF_PROFILE_MAX_EVENTS`` events:

* it is planned that short: with the events per step measured by earlier windows of the same phase, a window
  gets at most ``max_events / events_per_step`` steps (at least one);
* it is watched while it runs: at each step boundary and each module call (at most once a millisecond), the
  process's resident memory growth since the window began, less what the steps themselves allocate (measured in
  the steps before it; a window over a job's first steps with none measured before it is not judged by memory),
  divided by the memory an event takes while recorded (measured, :data:`LIVE_BYTES_PER_EVENT` until then), and
  its busy time so far (:func:`busy_seconds`) at the event rate the last window of the phase
  measured, estimate the events so far; past the cap the window stops there, mid-step if need be;
* its trace is read with the same cap: events past it are counted as dropped, never held.

Every figure the watch uses is learned again from each window (:class:`EventCosts`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

LIVE_BYTES_PER_EVENT = 120.0
"""Heap a recorded event takes while the profiler runs (CPU, ``profile_memory`` on: 130 MiB for 1.1 M events,
measured with torch 2.13; 350 B without the memory events), before an earlier window measured it."""
STOPPED_BYTES_PER_EVENT = 1900
"""Heap an event takes once the profiler stopped and built its results (measured: 2.0 GiB for 1.1 M events), the
largest the window gets; documented with the cap (docs/performance.md)."""
CHECK_INTERVAL_NS = 1_000_000
"""Module calls between two memory reads are at least this far apart (a read costs a few microseconds)."""
MIN_BYTES_PER_EVENT, MAX_BYTES_PER_EVENT = 40.0, 4000.0
"""Bounds of a learned bytes-per-event figure (heap growth is noisy: a window that freed memory learns nothing)."""


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_statm: dict[int, int] = {}
"""Process id -> its open ``/proc/<pid>/statm`` (a forked child opens its own)."""


def heap_in_use() -> int:
    """The memory the window watch reads: the process's resident size in bytes (``/proc/<pid>/statm``, a few
    microseconds), 0 where it cannot be read. (glibc's ``mallinfo2`` would count reused heap too, but it walks
    every free chunk: 0.4 s on a heap of 200,000 freed tensors.)"""
    pid = os.getpid()
    try:
        fd = _statm.get(pid)
        if fd is None:
            fd = _statm[pid] = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
        return int(os.pread(fd, 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


@dataclass
class EventCosts:
    """What profiler events cost this process, learned from each window."""

    live_bytes_per_event: float = LIVE_BYTES_PER_EVENT
    events_per_step: dict[str, float] = field(default_factory=dict)
    """Per phase, the events of one step in the last window of that phase that covered whole steps."""
    step_heap: int = 0
    """The most the heap grew within a step before a window (the steps' own allocations, not the profiler's)."""
    events_per_second: dict[str, float] = field(default_factory=dict)
    """Per phase, the events a busy second the last window recorded while it ran."""

    def plan(self, requested: int, phase: str | None, max_events: int) -> int:
        """Steps of a window asked to cover ``requested`` steps that stay within ``max_events``."""
        per_step = self.events_per_step.get(phase or "")
        if not per_step or max_events <= 0:
            return requested
        return max(1, min(requested, int(max_events // per_step)))

    def learn(self, phase: str | None, events: int, whole_steps: int, heap_growth: int, seconds: float = 0.0) -> None:
        """A window of ``events`` events (kept and dropped) over ``whole_steps`` complete steps (0: it stopped within
        its first step), that ran ``seconds`` (busy seconds), grew the heap by ``heap_growth`` bytes
        beyond its steps' own allocations."""
        if events <= 0:
            return
        if seconds > 0:
            self.events_per_second[phase or ""] = events / seconds
        if whole_steps > 0:
            self.events_per_step[phase or ""] = events / whole_steps
        else:  # one step makes more than the window held: at least that many
            key = phase or ""
            self.events_per_step[key] = max(self.events_per_step.get(key, 0.0), float(events))
        if heap_growth > 0:
            measured = min(max(heap_growth / events, MIN_BYTES_PER_EVENT), MAX_BYTES_PER_EVENT)
            self.live_bytes_per_event = measured


RATE_MARGIN = 1.5
"""The events a second a window records are taken as this much more than the last window measured (the machine
may be less busy than it was)."""
FIRST_RATE = 200_000.0
"""Events a busy second (:func:`busy_seconds`) assumed before any window of the phase measured its rate, so that a
first window stops after max_events / FIRST_RATE busy seconds at the latest (0.5 s at the default cap; a step that
sleeps or waits for I/O records no events while it waits, and is not cut short for it). Resident memory
alone missed it: an LBFGS step of pytorch/examples' time_sequence_prediction frees and reuses so much memory that
a window recorded 2.0 M events while the resident size grew by 12 MB. The profiler records up to 0.65-2 M tiny CPU
operators' events a second (measured), so a first window can still run past the cap by a few times, once."""


MIN_CPU_SHARE = 0.5
"""A thread that runs gets at least this share of a core while the machine is busy (its CPU time then lags the
wall clock)."""


def busy_seconds(wall: float, cpu: float) -> float:
    """The time a window's thread spent recording events: its CPU time, over :data:`MIN_CPU_SHARE` for the time it
    waited for a core, never more than the wall clock. A step that sleeps, waits for I/O or for another thread
    records no events meanwhile (the wall clock alone cut a window of 0.3 s steps at its second step)."""
    return min(wall, cpu / MIN_CPU_SHARE)


class HeapWatch:
    """A running window: :meth:`events` estimates the events recorded so far, the larger of its resident memory's
    growth over the memory an event takes and its busy time so far at the event rate of the last window (memory
    freed before the window, by the steps or the last window's results, is reused without growing it). Made and
    read on the window's thread (the CPU time it reads is that thread's)."""

    def __init__(self, bytes_per_event: float, step_heap: int | None, events_per_second: float = 0.0) -> None:
        self.bytes_per_event = bytes_per_event
        self.step_heap = step_heap
        """None: the window covers the job's first steps and no step was measured before it (the warm-up's lazy
        allocations are no events): the time estimate alone bounds it, and its growth teaches nothing."""
        self.rate = events_per_second * RATE_MARGIN if events_per_second > 0 else FIRST_RATE
        self.start = heap_in_use()
        self.peak = self.start
        self.began_ns = time.perf_counter_ns()
        self.began_cpu_ns = time.thread_time_ns()
        self.busy_seconds = 0.0
        """The window's busy time at the last estimate (:func:`busy_seconds`; a window's rate is per busy second)."""
        self._next_ns = 0

    def growth(self) -> int:
        """Heap growth so far beyond what the steps allocate of their own (bytes, at least 0; 0 when the steps'
        own growth is unknown)."""
        if self.step_heap is None:
            return 0
        return max(self.peak - self.start - self.step_heap, 0)

    def events(self, force: bool = False) -> float:
        """Estimated events so far; between heap reads (at most one per :data:`CHECK_INTERVAL_NS`) the last
        estimate, unless ``force``."""
        now = time.perf_counter_ns()
        if force or now >= self._next_ns:
            self._next_ns = now + CHECK_INTERVAL_NS
            self.peak = max(self.peak, heap_in_use())
        self.busy_seconds = busy_seconds((now - self.began_ns) / 1e9, (time.thread_time_ns() - self.began_cpu_ns) / 1e9)
        return max(self.growth() / self.bytes_per_event, self.busy_seconds * self.rate)


class StepHeap:
    """The most the heap grows within a step, over the steps before a window (read at the same checkpoints)."""

    def __init__(self) -> None:
        self.begin = 0
        self.most = 0
        self.measured = False
        """A step was read before a window (else ``most`` says nothing)."""
        self._next_ns = 0

    def step_began(self) -> None:
        self.begin = heap_in_use()

    def checkpoint(self) -> None:
        now = time.perf_counter_ns()
        if self.begin and now >= self._next_ns:
            self._next_ns = now + CHECK_INTERVAL_NS
            self.most = max(self.most, heap_in_use() - self.begin)
            self.measured = True
