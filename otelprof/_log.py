"""The ``otelprof`` logger and warn-once: a training loop must never be flooded."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("otelprof")

_warned: set[str] = set()
_lock = threading.Lock()


def warn_once(key: str, message: str, *args: object) -> None:
    """Log ``message`` as a warning the first time ``key`` is seen in this process."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message, *args)


def reset_warnings() -> None:
    """Forget which warnings were given (tests, and a new ``init()`` after ``shutdown()``)."""
    with _lock:
        _warned.clear()
