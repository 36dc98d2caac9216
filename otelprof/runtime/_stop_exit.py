"""Under ``otelprof run``: a stop request ends the process, with exit status :data:`STOP_EXIT_STATUS`.

``otelprof run`` starts a program that was not written for otelprof: its loop does not call ``should_stop()``.
A stop (``POST /v1/stop`` on the control endpoint, the webhook acting on a stop alert, ``request_stop()``) then
ends it:

* at the next step boundary, on the training thread, after the ``on_stop`` callbacks: :class:`StopExit`, a
  ``SystemExit`` of status :data:`STOP_EXIT_STATUS`, is raised where ``StopTraining`` would be with
  ``OTELPROF_STOP_RAISES=true``. The program's ``finally`` blocks and exit handlers run and the session shuts down
  as at any exit (the recording finished); Python prints nothing for it;
* when no step boundary comes within ``OTELPROF_STOP_GRACE_SECONDS`` (a step stuck in a collective or a read):
  from otelprof's own thread, as SIGTERM with no handler would, the session is shut down (the recording
  finished) and the process exits with :data:`STOP_EXIT_STATUS` (``os._exit``: the stuck thread runs no further).

A program that handles stops itself (it called ``should_stop()``, directly or through a trainer integration), or
asked for ``StopTraining`` (``OTELPROF_STOP_RAISES=true``), is left to leave on its own, as with ``otelprof.init()``
in a program of its own; the grace period still ends a step that never reaches the boundary. Without
``otelprof run`` nothing here runs.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Protocol

from otelprof._log import logger

STOP_EXIT_STATUS = 3
"""The exit status of a process ``otelprof run`` started, ended by a stop request (at a step boundary or after the
grace period). Not 1 (an uncaught exception), 2 (a usage error) nor 128 + a signal (SIGTERM: 143), so that a
Kubernetes Job's ``podFailurePolicy`` can tell a stop from a crash or an eviction."""

STREAM_WAIT = 1.0
"""Longest wait, after the grace period, for the program's buffered stdout and stderr to be written (a pipe nobody
reads would block the write for ever)."""

BOUNDARY = "step boundary"
GRACE = "grace period"
_CANCELLED = "cancelled"


class StopExit(SystemExit):
    """Raised at the step boundary after a stop request in a program ``otelprof run`` started: it ends the
    program with :data:`STOP_EXIT_STATUS` (``except Exception`` does not catch it)."""


class Session(Protocol):
    """What the exit needs of its session (:class:`otelprof.runtime.session.Session`)."""

    def note_stop_exit(self, how: str, status: int) -> None: ...

    def shutdown(self, timeout: float | None = None) -> None: ...


class Exit:
    """Ends the process after a stop request: at the step boundary, or from its own thread after ``grace``
    seconds (0: never). ``before_exit`` runs just before a process ended from that thread exits (the launch's exit
    line, which ``atexit`` says otherwise)."""

    def __init__(self, session: Session, grace: float, before_exit: Callable[[], None] | None = None) -> None:
        self._session = session
        self._grace = grace
        self._before_exit = before_exit
        self._lock = threading.Lock()
        self._outcome: str | None = None
        self._wake = threading.Event()
        self._timer: threading.Thread | None = None

    def requested(self) -> None:
        """A stop was requested (any thread): the grace period begins."""
        with self._lock:
            if self._grace <= 0 or self._timer is not None or self._outcome is not None:
                return
            self._timer = _start(self._wait, "otelprof-stop-grace")

    def cancel(self) -> None:
        """The program leaves on its own (``should_stop()`` told it), or the session shuts down: no exit here."""
        self._settle(_CANCELLED)

    def reached(self) -> bool:
        """The step boundary came: the grace period ends. False when the process is ending already (the grace
        period ran out just now)."""
        self._settle(BOUNDARY)
        return self._outcome != GRACE

    def exit(self) -> None:
        """On the training thread, at the step boundary: end the program. Raises :class:`StopExit` on the main
        thread; on another one (a loop that trains on a thread of its own) the process is ended from a thread of
        otelprof's, as after the grace period, and the training thread goes on until then."""
        self._session.note_stop_exit(BOUNDARY, STOP_EXIT_STATUS)
        if threading.current_thread() is threading.main_thread():
            raise StopExit(STOP_EXIT_STATUS)
        if _start(self._end, "otelprof-stop-exit") is None:
            raise StopExit(STOP_EXIT_STATUS)  # no thread can start: this thread ends at least

    def _settle(self, outcome: str) -> bool:
        with self._lock:
            if self._outcome is not None:
                return False
            self._outcome = outcome
        self._wake.set()
        return True

    def _wait(self) -> None:
        if self._wake.wait(self._grace) or not self._settle(GRACE):
            return
        logger.warning("otelprof: no step boundary within %g s of the stop request (OTELPROF_STOP_GRACE_SECONDS); "
                       "ending the process with exit status %d", self._grace, STOP_EXIT_STATUS)
        self._session.note_stop_exit(GRACE, STOP_EXIT_STATUS)
        self._end()

    def _end(self) -> None:
        """Shut the session down (the recording finished), then end the process: on otelprof's own thread."""
        try:
            self._session.shutdown()
            if self._before_exit is not None:
                self._before_exit()
            _flush_streams(STREAM_WAIT)
        except Exception:
            logger.exception("otelprof: internal error while ending the process after a stop request")
        finally:
            os._exit(STOP_EXIT_STATUS)


def _start(target: Callable[[], None], name: str) -> threading.Thread | None:
    thread = threading.Thread(target=target, name=name, daemon=True)
    try:
        thread.start()
    except RuntimeError:  # the interpreter is shutting down
        return None
    return thread


def _flush_streams(timeout: float) -> None:
    """Write what the program left in ``sys.stdout`` and ``sys.stderr``, waiting at most ``timeout`` seconds."""

    def flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except Exception:
                pass

    thread = _start(flush, "otelprof-stop-flush")
    if thread is not None:
        thread.join(timeout)
