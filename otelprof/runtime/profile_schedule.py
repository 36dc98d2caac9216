"""Periodic operator-profiling windows: a few steps under a framework's profiler every few minutes, by default.

A daemon thread sleeps until a window is due, then arms one on the profiler an integration registered with
:mod:`otelprof.runtime.extensions` (PyTorch's: ``torch.profiler``, :mod:`otelprof.integrations.torch_profiler`;
nothing runs on the training thread until the window's steps). The first window is due ``OTELPROF_PROFILE_WARMUP``
seconds after ``init()`` and starts no earlier than step ``OTELPROF_PROFILE_WARMUP_STEPS``; then one every
``OTELPROF_PROFILE_EVERY`` seconds. A window that cost X seconds (its whole cost to training as the profiler
measures it: its steps beyond the pace of the steps just before it, the FLOP-counted step after it, and the CPU
time of summarising it, which holds the interpreter's lock) delays the next one by at least
X / ``OTELPROF_PROFILE_BUDGET``, so the amortized cost stays within the budget; the interval in force is
``otelprof.profile.interval``. Each turn first loads the integrations whose framework has been imported since
(:func:`~otelprof.runtime.extensions.load_deferred`): jobs that never import torch load no integration and are
never profiled; a window already armed, running or being summarised (``profile_window``, a capture) makes the
schedule skip its turn.

The schedule is framework-neutral: it imports no integration. Every session runs one (``otelprof`` registers
:func:`start` with :mod:`otelprof.runtime.extensions`); when the session ends it closes the registered profilers'
windows.
"""

from __future__ import annotations

import threading
from typing import Any

from otelprof import semconv as sc
from otelprof._log import logger
from otelprof.config import Config
from otelprof.runtime import extensions
from otelprof.runtime import hotpath as hot

RETRY = 5.0
"""Seconds between looks for a profiler (a framework imported after ``init()``) or for a busy one."""
FINISH_TIMEOUT = 600.0
"""Longest wait for an armed window to finish (a job that stopped stepping)."""


class PeriodicWindows:
    def __init__(self, config: Config) -> None:
        self.every = config.profile_every
        self.steps = config.profile_steps
        self.warmup = config.profile_warmup
        self.warmup_steps = config.profile_warmup_steps
        self.budget = config.profile_budget
        self.top = config.profile_top_k
        self.windows_run = 0
        self.next_delay = self.warmup
        """Seconds from the end of the last window (from the start at first) to the next one."""
        self._stop = threading.Event()
        self._finished = threading.Event()
        self._overhead = 0.0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.every <= 0:
            return
        self._thread = threading.Thread(target=self._run, name="otelprof-profile-schedule", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 0.0) -> None:
        """The session ends: no more windows; the profilers' windows close, those being summarised get
        ``timeout`` seconds (at most the profiler's ``close_wait``) to finish."""
        self._stop.set()
        self._finished.set()
        for profiler in extensions.profilers():
            profiler.close(max(min(profiler.close_wait, timeout), 0.0))

    def interval_after(self, overhead: float) -> float:
        """The wait before the next window after one that cost ``overhead`` seconds."""
        if self.budget <= 0:
            return self.every
        return max(self.every, overhead / self.budget)

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:
            logger.exception("otelprof: the periodic profiling schedule stopped")

    def _loop(self) -> None:
        delay = self.warmup
        while not self._stop.wait(delay):
            extensions.load_deferred()
            profiler = extensions.profiler()
            if profiler is None or hot._active is None or profiler.busy:
                delay = RETRY
                continue
            phase = hot.current_phase()
            start = max(hot.next_step_number(phase) + profiler.baseline_steps, self.warmup_steps)
            self._finished.clear()
            profiler.arm(start, self.steps, top=self.top, trigger="periodic", phase=phase,
                         on_finished=self._on_finished)
            self._finished.wait(FINISH_TIMEOUT)
            if self._stop.is_set():
                return
            self.windows_run += 1
            delay = self.next_delay = self.interval_after(self._overhead)
            self._export_interval(delay)

    @staticmethod
    def _export_interval(seconds: float) -> None:
        from otelprof.runtime.session import get_session

        session = get_session()
        if session is not None:
            with session.registry.lock:
                session.registry.gauge(sc.PROFILE_INTERVAL).set(seconds)

    def _on_finished(self, overhead: float) -> None:
        self._overhead = overhead
        self._finished.set()


def start(config: Config) -> PeriodicWindows:
    """A new session's schedule (its extension): what earlier sessions' windows left is reset first."""
    for profiler in extensions.profilers():
        profiler.reset()
    schedule = PeriodicWindows(config)
    schedule.start()
    return schedule


def of(session: Any) -> PeriodicWindows | None:
    """The periodic schedule ``session`` runs (None when it runs none)."""
    return next((e for e in getattr(session, "extensions", ()) if isinstance(e, PeriodicWindows)), None)
