"""What integrations add to every session: they register a starter here, each session runs them.

The runtime core never imports an integration. An integration that must live as long as a session (the periodic
operator-profiling windows of :mod:`otelprof.integrations.profile_schedule`) registers a starter; every session
calls each starter once its hot path is active and keeps what it returns, and stops them, in reverse order, when
it shuts down (with the time left before its deadline, before the recording closes) or is discarded (no time).
A starter or a stop that raises is logged and skipped: the session and the training job go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from otelprof._log import logger
from otelprof.config import Config


class Extension(Protocol):
    """What a starter returns: something the session stops when it ends."""

    def stop(self, timeout: float) -> None:
        """Stop within ``timeout`` seconds (0: at once, without waiting for work in flight)."""


Starter = Callable[[Config], Extension]

_starters: list[Starter] = []


def register(starter: Starter) -> None:
    """Run ``starter`` in every session that starts from now on (registering the same one again does nothing)."""
    if starter not in _starters:
        _starters.append(starter)


def start_all(config: Config) -> list[Extension]:
    """Run every registered starter for a session with ``config``; the extensions that started."""
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
