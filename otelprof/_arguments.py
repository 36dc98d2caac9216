"""Arguments of the public API that otelprof cannot use: checked, never raised.

The hot path only checks what it must to go on (a type before arithmetic or hashing); names and values
are checked on the recorder's thread. An argument that cannot be used is dropped, counted in
``otelprof.exporter.dropped{exporter="invalid_argument"}`` and reported once per kind of argument
(``reject``); the call it came with goes on without it.
"""

from __future__ import annotations

import operator
import threading

from otelprof._log import warn_once

MAX_NAME_LENGTH = 200
"""Characters kept of a step phase, region or scalar name; longer names are cut (in the recording, spans and
metric labels alike)."""
MAX_STEP_SCALARS = 256
"""Scalar names kept per step (in the recording and spans); a step that records more keeps the first ones."""
MAX_STEP_NUMBER = 2**63 - 1
"""The largest explicit ``step(number=...)``: step numbers are 64-bit integers in every format otelprof writes."""

rejected = 0
"""Arguments dropped in this process; the recorder reports the growth as ``invalid_argument`` drops."""
_lock = threading.Lock()


def reject(kind: str, message: str, *args: object, count: int = 1) -> None:
    """Count ``count`` unusable arguments; warn the first time this ``kind`` of argument is seen.

    ``message`` is completed by "; dropped and counted (...)". It must only format what cannot fail or flood
    (type names, :func:`describe` of a name), never the argument itself."""
    global rejected
    with _lock:
        rejected += count
    warn_once(f"argument:{kind}", "otelprof: " + message + "; dropped and counted in "
              "otelprof_exporter_dropped_total{exporter=\"invalid_argument\"}, training goes on", *args)


def type_name(value: object) -> str:
    """The type of ``value`` for a warning (never calls the object's own methods)."""
    return type(value).__qualname__[:MAX_NAME_LENGTH]


def describe(name: str) -> str:
    """A name for a warning: quoted, cut, printable."""
    return repr(clean_name(name)[:60])


def clean_name(name: str) -> str:
    """``name`` as otelprof writes it: a plain ``str`` of at most ``MAX_NAME_LENGTH`` characters that encodes to
    UTF-8 (a lone surrogate, which no exporter could encode, becomes ``?``)."""
    if type(name) is not str:  # a str subclass: its characters, not its __str__
        name = str.__str__(name)
    if len(name) > MAX_NAME_LENGTH:
        name = name[:MAX_NAME_LENGTH]
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            name = name.encode("utf-8", "replace").decode("utf-8")
    return name


def encodable(text: str) -> str:
    """``text`` with every character UTF-8 cannot encode (a lone surrogate: a byte that is not UTF-8 in an
    environment variable, or half a pair in an argument) written as ``?``: what every exporter can encode."""
    if type(text) is not str:
        text = str.__str__(text)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def name_argument(name: object, kind: str, what: str) -> str | None:
    """The name to use for a name argument that is not a plain ``str`` (or is empty), or None to drop it."""
    if isinstance(name, str) and str.__len__(name):
        return clean_name(name)
    reject(kind, "%s got a name that is not a non-empty string (%s)", what, type_name(name))
    return None


def number_argument(number: object) -> int | None:
    """An explicit ``step(number=...)`` that is not a plain ``int`` in range: the number, or None (automatic)."""
    try:
        if not isinstance(number, float):  # 3.0 is not a step number; numpy integers and bools are
            value = operator.index(number)  # type: ignore[arg-type]
            if 0 <= value <= MAX_STEP_NUMBER:
                return value
    except Exception:
        pass
    reject("step-number", "step(number=...) got %s, not an integer from 0 to 2**63-1; the step gets the next "
           "number instead", type_name(number))
    return None


def to_float(value: object) -> float | None:
    """A recorded value as a float (tensors and numpy scalars through ``item()``), or None when it is none.

    Strings and bytes are not numbers here; a number too large for a float is not one either."""
    try:
        if isinstance(value, (str, bytes, bytearray)):
            raise TypeError
        item = getattr(value, "item", None)
        if item is not None:  # torch / numpy scalars; resolved here, off the hot path
            value = item()
        return float(value)  # type: ignore[arg-type]
    except Exception:
        reject("record-value", "record() got a value that is not a number (%s, or a number too large for "
               "a float)", type_name(value))
        return None


def timeout_argument(timeout: object, default: float) -> float:
    """A ``timeout`` argument in seconds: a finite number >= 0 (None: ``default``)."""
    if timeout is None:
        return default
    try:
        if not isinstance(timeout, (str, bytes, bytearray)):
            seconds = float(timeout)  # type: ignore[arg-type]
            if seconds == seconds and seconds != float("inf"):
                return max(seconds, 0.0)
    except Exception:
        pass
    reject("timeout", "a timeout of %s is not a number of seconds; using %ss", type_name(timeout), default)
    return default
