"""The one error of the recording reader: a path that is not a recording otelprof can read."""

from __future__ import annotations


class RecordingError(Exception):
    """The path is not a recording otelprof can read (the message is one line, fit for the user)."""
