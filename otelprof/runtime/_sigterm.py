"""SIGTERM: flush what otelprof holds, then let the signal take the course it would take without otelprof.

A pod deletion, ``torchrun`` tearing its workers down or a scheduler's preemption sends SIGTERM. What the
process does then belongs to the application: die (no handler), ignore it, or run its own handler (finish the
step, save a checkpoint, exit with its own code) — installed before ``init()`` or after it, where frameworks
chain to the handler they found. otelprof only flushes on a thread of its own and hands the signal on:

* the previous handler is a Python function: the recording is flushed (a short bounded wait, so that a
  handler that ends the process at once loses nothing recorded), the exporters go on flushing in the
  background, and the function is called, as it would have been. otelprof keeps recording the steps and
  regions the application runs after the signal until it exits (``atexit`` then shuts the session down);
* the previous disposition is the default action (no handler): the session is shut down (bounded by
  ``OTELPROF_SHUTDOWN_TIMEOUT``), then the default action ends the process, killed by SIGTERM as it would
  have been. When a handler installed after ``init()`` calls this one (it found it as the previous
  handler), the process is not ended here: without otelprof that handler would have found the default
  action, which frameworks do not call, and the application's own graceful stop goes on;
* SIG_IGN, or a handler installed outside Python: otelprof installs nothing (an ignored SIGTERM is
  inherited by child processes, a Python handler is not).

A second SIGTERM is handed on at once. In a forked child (a DataLoader worker) the handler only hands on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from types import FrameType
from typing import Any, Protocol

from otelprof._log import logger
from otelprof.config import Config

RECORDING_WAIT = 1.0
"""Longest wait, in the signal handler, for the recording to be flushed before the application's own handler
runs (a few milliseconds in the usual case; the bound is for a flush stuck behind a lock the interrupted main
thread holds)."""


class Session(Protocol):
    """What the handler needs of the session it flushes (:class:`otelprof.runtime.session.Session`)."""

    config: Config

    @property
    def pid(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def note_signal(self, name: str) -> None: ...

    def flush_recording(self) -> None: ...

    def flush(self, timeout: float | None = None) -> None: ...

    def shutdown(self, timeout: float | None = None) -> None: ...


class SigtermHandler:
    """The SIGTERM handler of one session; ``previous`` is what it found installed."""

    def __init__(self, session: Session, previous: Any) -> None:
        self.session = session
        self.previous = previous
        self.received = 0
        self._flusher: threading.Thread | None = None
        self._recorded = threading.Event()  # the recording is flushed (or the flusher gave up)
        self._done = threading.Event()  # the flusher is done

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        first = self.received == 1
        previous = self.previous
        installed = signal.getsignal(signal.SIGTERM) is self  # else a later handler chained to this one
        default = not callable(previous)  # SIG_DFL: nothing else is installed over (see install())
        live = self._start_flush(shutdown=default and installed) if first else False
        if not default:
            if live:
                self._recorded.wait(min(RECORDING_WAIT, self.session.config.shutdown_timeout))
            previous(signum, frame)
            return
        if not installed:
            return  # see the module docstring: the handler that called this one goes on with its own course
        if live:
            self._done.wait(self.session.config.shutdown_timeout + 1.0)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # the default action: the process ends, killed by SIGTERM

    def _start_flush(self, shutdown: bool) -> bool:
        """Start the flusher thread; False when this process has no session to flush (closed, forked child)."""
        session = self.session
        if session.closed or os.getpid() != session.pid:
            return False
        thread = threading.Thread(target=self._flush, args=(shutdown,), name="otelprof-sigterm", daemon=True)
        self._flusher = thread
        try:
            thread.start()
        except RuntimeError:  # no thread can start (interpreter shutting down): nothing to wait for
            return False
        return True

    def _flush(self, shutdown: bool) -> None:
        session = self.session
        try:
            session.note_signal("SIGTERM")
            if shutdown:
                session.shutdown()
            else:
                session.flush_recording()
                self._recorded.set()
                session.flush()
        except Exception:
            logger.exception("otelprof: internal error while flushing on SIGTERM")
        finally:
            self._recorded.set()
            self._done.set()


def install(session: Session) -> SigtermHandler | None:
    """Install the session's SIGTERM handler (main thread only); None when it should not or cannot."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):
        return None
    if previous is None or previous == signal.SIG_IGN:  # see the module docstring
        return None
    handler = SigtermHandler(session, previous)
    try:
        signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):
        return None
    return handler


def uninstall(handler: SigtermHandler) -> None:
    """Put the previous handler back if this one is still the installed one (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = handler.previous
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) is handler:
            signal.signal(signal.SIGTERM, previous)
