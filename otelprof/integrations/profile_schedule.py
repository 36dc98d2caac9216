"""Periodic operator-profiling windows: a few steps under ``torch.profiler`` every few minutes, by default.

A daemon thread sleeps until a window is due, then arms one on the process's
:data:`~otelprof.integrations.torch_profiler.windows` (nothing runs on the training thread until the window's
steps). The first window is due ``OTELPROF_PROFILE_WARMUP`` seconds after ``init()`` and starts no earlier
than step ``OTELPROF_PROFILE_WARMUP_STEPS``; then one every ``OTELPROF_PROFILE_EVERY`` seconds. A window
that cost X seconds (its whole cost to training as torch_profiler measures it: its steps beyond the pace of the
steps just before it, the FLOP-counted step after it, and the CPU time of summarising it, which holds the
interpreter's lock) delays the next one by at least X / ``OTELPROF_PROFILE_BUDGET``, so the amortized cost stays
within the budget; the interval in force is ``otelprof.profile.interval``. Jobs that never import torch are never
profiled; a window already armed, running or being summarised (``profile_window``, a capture) makes the schedule
skip its turn.

Every session runs one: ``otelprof`` registers :func:`start` with :mod:`otelprof.runtime.extensions`.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from otelprof import semconv as sc
from otelprof._log import logger
from otelprof.config import Config
from otelprof.integrations.torch_profiler import BASELINE_STEPS, CLOSE_WAIT, windows
from otelprof.runtime import hotpath as hot

RETRY = 5.0
"""Seconds between looks for torch (imported after ``init()``) or for a busy profiler."""
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
        """The session ends: no more windows; the process's windows close, those being summarised get
        ``timeout`` seconds (at most ``CLOSE_WAIT``) to finish."""
        self._stop.set()
        self._finished.set()
        windows.close(max(min(CLOSE_WAIT, timeout), 0.0))

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
            if "torch" not in sys.modules or hot._active is None:
                delay = RETRY
                continue
            if windows.busy:
                delay = RETRY
                continue
            phase = hot.current_phase()
            start = max(hot.next_step_number(phase) + BASELINE_STEPS, self.warmup_steps)
            self._finished.clear()
            windows.arm(start, self.steps, top=self.top, trigger="periodic", phase=phase,
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
    windows.reset()
    schedule = PeriodicWindows(config)
    schedule.start()
    return schedule


def of(session: Any) -> PeriodicWindows | None:
    """The periodic schedule ``session`` runs (None when it runs none)."""
    return next((e for e in getattr(session, "extensions", ()) if isinstance(e, PeriodicWindows)), None)
