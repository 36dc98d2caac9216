"""The runtime's seam for integrations: what they add to every session, and loading them when their framework is.

The runtime core never imports an integration; integrations register here, as OpenTelemetry instrumentations do
with the SDK:

- a *starter* (:func:`register`): every session calls each starter once its hot path is active and keeps what
  it returns, and stops them, in reverse order, when it shuts down (with the time left before its deadline, before
  the recording closes) or is discarded (no time);
- an operator *profiler* (:func:`register_profiler`): the periodic schedule of
  :mod:`otelprof.runtime.profile_schedule` arms its windows on it;
- a *deferred integration* (:func:`load_when_imported`): the composition root (``otelprof``) names the integration
  module to import once a framework is in ``sys.modules``; a session looks as it starts, and the periodic schedule
  at each of its turns, so ``import otelprof`` and a job that never imports the framework load no integration.

A starter, a stop or a deferred import that raises is logged and skipped: the session and the training job go on.
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from otelprof._log import logger
from otelprof.config import Config
from otelprof.runtime import hotpath as hot


class Extension(Protocol):
    """What a starter returns: something the session stops when it ends."""

    def stop(self, timeout: float) -> None:
        """Stop within ``timeout`` seconds (0: at once, without waiting for work in flight)."""


Starter = Callable[[Config], Extension]


class Profiler(Protocol):
    """An integration's operator profiler (PyTorch's: ``otelprof.integrations.torch_profiler.windows``)."""

    @property
    def baseline_steps(self) -> int:
        """Steps it measures just before a window: a periodic window is armed that many steps ahead."""

    @property
    def close_wait(self) -> float:
        """Longest wait, as a session shuts down, for windows being summarised."""

    @property
    def busy(self) -> bool:
        """A window is armed, running or being summarised."""

    def arm(self, start_step: int, num_steps: int, *, top: int = ..., trigger: str = ..., phase: str | None = ...,
            on_finished: Callable[[float], None] | None = ...) -> dict[str, Any]:
        """Profile ``num_steps`` steps from step ``start_step`` of ``phase``; ``on_finished(overhead_s)`` after."""

    def reset(self) -> None:
        """A new session: forget what earlier sessions armed and measured."""

    def close(self, timeout: float) -> None:
        """The session ends: armed windows are forgotten, those being summarised get ``timeout`` seconds."""


_starters: list[Starter] = []
_profilers: list[tuple[Profiler, str]] = []
"""Each registered profiler and its framework's module."""
_deferred: list[tuple[str, str]] = []
"""(framework module, integration module) pairs not imported yet."""
_lock = threading.Lock()


def register(starter: Starter) -> None:
    """Run ``starter`` in every session that starts from now on (registering the same one again does nothing)."""
    if starter not in _starters:
        _starters.append(starter)


def register_profiler(profiler: Profiler, framework: str) -> None:
    """Arm periodic windows on ``profiler`` from now on, while its ``framework`` is in ``sys.modules``; registered
    while a session runs, it joins that session as a session's start would (``profiler.reset()``)."""
    with _lock:
        if any(p is profiler for p, _ in _profilers):
            return
        _profilers.append((profiler, framework))
    if hot._active is not None:
        profiler.reset()


def profilers() -> list[Profiler]:
    """The profilers registered so far (each session resets them as it starts and closes them as it ends)."""
    with _lock:
        return [profiler for profiler, _ in _profilers]


def profiler() -> Profiler | None:
    """The first registered profiler whose framework has been imported (None: nothing to profile with)."""
    with _lock:
        return next((profiler for profiler, framework in _profilers if framework in sys.modules), None)


def load_when_imported(framework: str, integration: str) -> None:
    """Import the module ``integration`` (which registers what it adds) once ``framework`` is in ``sys.modules``:
    as the next session starts, or at the periodic schedule's next turn (nothing to do when it is imported)."""
    with _lock:
        if integration in sys.modules or (framework, integration) in _deferred:
            return
        _deferred.append((framework, integration))


def load_deferred() -> None:
    """Import the deferred integrations whose framework has been imported (each once; one that fails is logged
    and dropped)."""
    with _lock:
        due = [pair for pair in _deferred if pair[0] in sys.modules]
        _deferred[:] = [pair for pair in _deferred if pair not in due]
    for _, integration in due:
        try:
            importlib.import_module(integration)
        except Exception:
            logger.exception("otelprof: the integration %s did not load", integration)


def start_all(config: Config) -> list[Extension]:
    """Load the deferred integrations whose framework is there, then run every registered starter for a session
    with ``config``; the extensions that started."""
    load_deferred()
    started: list[Extension] = []
    for starter in list(_starters):
        try:
            started.append(starter(config))
        except Exception:
            logger.exception("otelprof: an extension did not start")
    return started


def stop_all(extensions: list[Extension], deadline: float | None) -> None:
    """Stop ``extensions``, the last started first, each within what is left until ``deadline`` (a
    ``time.monotonic()`` time; None: no waiting)."""
    for extension in reversed(extensions):
        timeout = 0.0 if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            extension.stop(timeout)
        except Exception:
            logger.exception("otelprof: an extension did not stop")
