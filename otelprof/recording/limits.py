"""What the recording reader accepts: its limits, strict JSON, and checks of single values.

A line or value past a limit is skipped and counted in ``skipped_lines``, so time and memory of a
read stay proportional to the data kept, whatever the files hold:

* files are read in blocks of at most a line's limit, a line longer than :data:`MAX_LINE_BYTES` of
  its file is skipped without being held whole; manifest.json is at most :data:`MAX_MANIFEST_BYTES`;
* JSON nested deeper than the interpreter's recursion limit, integers outside 64 bits and numbers
  that overflow a double (``1e400``) make a line unreadable;
* strings (phase, region, scalar, error, operator names) hold at most :data:`MAX_STRING_CHARS`
  characters; a step at most :data:`MAX_STEP_REGIONS` regions and :data:`MAX_STEP_SCALARS` scalars;
  a rank at most :data:`MAX_NAMES` distinct phase, region and scalar names each (a line bringing one
  more is skipped); times lie in 0..:data:`MAX_TIME_NS`, durations in 0..:data:`MAX_DURATION_NS`;
* a sample at most :data:`MAX_CORES` per-CPU values and, per rank, :data:`MAX_GPUS` GPUs of at most
  :data:`MAX_GPU_KEYS` values; an operator-profiling window at most :data:`MAX_PROFILE_ENTRIES`
  operators and mix entries per list.
"""

from __future__ import annotations

import json
import math
import re
from array import array
from typing import Any

from otelprof.recording import schema

MAX_LINE_BYTES = {schema.STEPS: 2**20, schema.SAMPLES: 2**20, schema.PROFILES: 4 * 2**20,
                  schema.SPANS: 16 * 2**20, schema.METRICS: 16 * 2**20}
"""Longest line read per file (bytes, without the newline): a step with the recorder's 4,096 regions
of 100-character names takes about 0.5 MiB; an OTLP metrics snapshot of a large job a few MiB."""
MAX_MANIFEST_BYTES = 2**20
"""Largest manifest.json (the writer's is a few KiB)."""
MAX_STRING_CHARS = 4096
"""Longest name or other string value (CUDA kernel names in profiles reach a few hundred)."""
MAX_NAMES = 10_000
"""Distinct phase, region and scalar names per rank (each)."""
MAX_STEP_REGIONS = 4096
"""Regions in one step record: what the recorder keeps (``otelprof.runtime.hotpath.MAX_STEP_ANNOTATIONS``)."""
MAX_STEP_SCALARS = 1024
"""Scalars in one step record."""
MAX_TIME_NS = 2**62
"""Latest Unix time in nanoseconds (year 2116)."""
MAX_DURATION_NS = 2**50
"""Longest duration in nanoseconds (13 days): sums of a step's regions stay within 64 bits."""
MAX_CORES = 4096
"""Per-CPU values in one sample."""
MAX_GPUS = 64
"""GPUs per rank (distinct indexes in its samples)."""
MAX_GPU_KEYS = 64
"""Values per GPU in a sample."""
MAX_PROFILE_ENTRIES = 1000
"""Operators (and activity or precision entries) per list of an operator-profiling window."""
INT64 = 2**63 - 1


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number out of range: {text[:40]}")
    return value


def _int64(text: str) -> int:
    if len(text) > 20:
        raise ValueError(f"integer out of range: {text[:40]}")
    value = int(text)
    if not -INT64 - 1 <= value <= INT64:
        raise ValueError(f"integer out of range: {text}")
    return value


_decoder = json.JSONDecoder(parse_float=_finite, parse_int=_int64)
_plain = json.JSONDecoder()

try:  # the "fast" extra: orjson decodes a line of many numbers ~2.7 times faster than the json module
    from orjson import JSONDecodeError as _FastError
    from orjson import loads as _fast_loads
except ImportError:
    _fast_loads = None  # type: ignore[assignment]


_LONE_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                             r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")
"""A \\u escape of half a surrogate pair: it would decode to a string that cannot be written as UTF-8."""


def loads(text: str, exact: bool = True) -> Any:
    """JSON as the reader accepts it: integers within 64 bits, numbers that fit a double (NaN and
    Infinity only spelled so), strings that are text (no lone surrogate), nesting within the
    recursion limit; ValueError otherwise. ``exact=False`` leaves the numbers to the caller's checks
    (the json module's own number parsing, several times faster on lines of many numbers; orjson's, when
    installed, for what it accepts: the same values but for integers past 64 bits, which it gives as
    floats, so a caller must turn every number into a double before adding them up)."""
    if "\\u" in text and _LONE_SURROGATE.search(text):
        raise ValueError("a string holds half a surrogate pair")
    if not exact and _fast_loads is not None:
        try:
            return _fast_loads(text)
        except _FastError:
            pass  # NaN, Infinity, numbers past a double, nesting past 1,024: the json module judges them
    try:
        return _decoder.decode(text) if exact else _plain.decode(text)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc


def check_int(value: Any, low: int, high: int) -> int:
    """``value`` when it is an integer from ``low`` to ``high``; ValueError otherwise."""
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"not an integer from {low} to {high}: {value!r:.40}")
    return value


def check_str(value: Any) -> str:
    """``value`` when it is a string of at most :data:`MAX_STRING_CHARS` characters; ValueError otherwise."""
    if type(value) is not str or len(value) > MAX_STRING_CHARS:
        raise ValueError(f"not a string of at most {MAX_STRING_CHARS} characters: {value!r:.40}")
    return value


def check_number(value: Any) -> float:
    """A scalar's value: a number, or one written as a string ("nan", "inf", as the recorder does)."""
    kind = type(value)
    if kind is float:
        return value  # type: ignore[no-any-return]
    if kind is int:
        return float(value)
    if kind is str and len(value) <= 64:
        return float(value)
    raise ValueError(f"not a number: {value!r:.40}")


LINE_ERRORS = (ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError)
"""What checking a line that is not what the recorder writes raises: the line is skipped and counted."""


def within(values: array[int], low: int, high: int) -> bool:
    """Whether every value lies in ``low``..``high``."""
    return not values or (low <= min(values) and max(values) <= high)
