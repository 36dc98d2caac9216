"""Sample columns made comparable (every column and count, NaN as a string): for the reader's tests, none of
which needs an optional extra to use it."""

from __future__ import annotations

import math


def columns(c: object) -> dict[str, object]:
    """Every column and count, NaN made comparable."""
    out: dict[str, object] = {}
    for name, value in vars(c).items():
        if name.startswith("_"):
            continue
        out[name] = _comparable(value)
    return out


def _comparable(value: object) -> object:
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "array":
        return [_comparable(v) for v in value]  # type: ignore[union-attr]
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value
