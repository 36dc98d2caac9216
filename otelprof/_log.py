"""The ``otelprof`` logger and warn-once: a training loop must never be flooded."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("otelprof")

_warned: set[str] = set()
_lock = threading.Lock()


def warn_once(key: str, message: str, *args: object) -> None:
    """Log ``message`` as a warning the first time ``key`` is seen in this process."""
    if _first(key):
        logger.warning(message, *args)


def info_once(key: str, message: str, *args: object) -> None:
    """Log ``message`` at info level (shown only where the application configured logging) the first time
    ``key`` is seen in this process: what otelprof does about something that needs no action."""
    if _first(key):
        logger.info(message, *args)


def _first(key: str) -> bool:
    with _lock:
        if key in _warned:
            return False
        _warned.add(key)
        return True


def reset_warnings() -> None:
    """Forget which warnings were given (tests, and a new ``init()`` after ``shutdown()``)."""
    with _lock:
        _warned.clear()
