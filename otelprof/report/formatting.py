"""How a figure reads on the report page: shares, seconds, counts, sizes, rates, times and histogram
buckets, with a dash for a value that is missing or not finite.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable

from otelprof.analysis import diagnosis as dg
from otelprof.analysis.stats import Bucket

DASH = "-"


def finite(v: float | None) -> bool:
    """A number to show: not None, NaN or infinite."""
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def pct(v: float | None, digits: int = 1) -> str:
    return f"{v * 100:.{digits}f} %" if finite(v) else DASH  # type: ignore[operator]


def secs(v: float | None) -> str:
    if not finite(v):
        return DASH
    return "0 s" if v == 0 else dg.secs(v)


def num(v: float | None, digits: int = 4) -> str:
    if not finite(v):
        return DASH
    assert v is not None
    return f"{v:,.0f}" if float(v).is_integer() and abs(v) < 1e15 else f"{v:.{digits}g}"


def size(v: float | None) -> str:
    if not finite(v):
        return DASH
    assert v is not None
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{v:.0f} B"


def rate(v: float | None) -> str:
    return f"{size(v)}/s" if finite(v) else DASH


def when(unix: float | None) -> str:
    if not finite(unix):
        return DASH
    assert unix is not None
    return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def bounds(b: Bucket | None, fmt: Callable[[float], str] = secs) -> str:
    """A value known only to a histogram bucket, as that bucket: "≤ 25 ms", "> 25 ms, ≤ 50 ms", "> 600 s"."""
    if b is None:
        return DASH
    if not finite(b.high):
        return f"> {fmt(b.low)}"
    if b.low <= 0:
        return f"≤ {fmt(b.high)}"
    return f"> {fmt(b.low)}, ≤ {fmt(b.high)}"


def extreme(value: float, bucket: Bucket | None, fmt: Callable[[float], str] = secs) -> str:
    """An exact minimum or maximum when known, else the histogram bucket that holds it."""
    return fmt(value) if finite(value) or bucket is None else bounds(bucket, fmt)


def pct0(v: float) -> str:
    """A share in whole percent (chart axes)."""
    return pct(v, 0)


def elapsed(v: float) -> str:
    """Time since the job started (chart axes)."""
    return secs(v) if v else "0"
