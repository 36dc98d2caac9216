"""A progress bar on stderr for the commands that read many ranks (``otelprof report``, ``check``, ``compare``).

Drawn in place (carriage return) when stderr is a terminal or when asked (``--progress``), never with
``--quiet``, never on stdout; redrawn at most ten times a second, and once at the end.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30
"""Characters of the bar itself."""


class ProgressBar:
    """``[#########.....]  512/1024 ranks  41 s`` on ``stream``; :meth:`close` ends its line."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()
        self._drawn = 0.0
        self._open = False

    def ranks(self, done: int, total: int) -> None:
        """Ranks ``done`` of ``total`` read (the reader's ``ranks_done`` callback)."""
        now = time.monotonic()
        if done < total and now - self._drawn < 0.1:
            return
        self._drawn = now
        filled = WIDTH * done // max(total, 1)
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {done:>{len(str(total))}}/"
                          f"{total} ranks {now - self.started:5.0f} s")
        self.stream.flush()
        self._open = True

    def close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


def progress_bar(label: str, quiet: bool, asked: bool, stream: TextIO | None = None) -> ProgressBar | None:
    """A bar when stderr is a terminal or ``asked``, none when ``quiet``."""
    stream = stream if stream is not None else sys.stderr
    if quiet:
        return None
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return ProgressBar(label, stream) if tty or asked else None
