"""Which ranks and steps to read: ``0,3,8-15`` and ``1000-1200`` as the timeline's options give them."""

from __future__ import annotations

MAX_RANK = 2**31 - 1
"""Largest rank number a selection names."""


def parse_ranks(spec: str) -> frozenset[int]:
    """``0,3,8-15`` as the set of ranks; ValueError (one line) for anything else."""
    ranks: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise ValueError(f"not a rank or a range of ranks (like 0,3,8-15): {part[:40]!r}") from None
        if not 0 <= first <= last <= MAX_RANK:
            raise ValueError(f"not a range of ranks from low to high: {part[:40]!r}")
        if last - first > 1_000_000:
            raise ValueError(f"range of more than a million ranks: {part[:40]!r}")
        ranks.update(range(first, last + 1))
    return frozenset(ranks)


def parse_steps(spec: str) -> tuple[int, int | None]:
    """``1000-1200`` (or ``1000-``: from 1000 on, or ``1000``: that step) as (first, last or None)."""
    low, dash, high = spec.strip().partition("-")
    try:
        first = int(low)
        last = (int(high) if high.strip() else None) if dash else first
    except ValueError:
        raise ValueError(f"not a step range (like 1000-1200): {spec[:40]!r}") from None
    if first < 0 or (last is not None and last < first):
        raise ValueError(f"not a step range from low to high: {spec[:40]!r}")
    return first, last
