"""Which ranks and steps to read: ``0,3,8-15`` and ``1000-1200`` as the timeline's options give them, and the
steps of one rank such a range selects."""

from __future__ import annotations

from dataclasses import dataclass

from otelprof.recording.columns import StepColumns

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


@dataclass(frozen=True)
class StepSelection:
    """The steps of one rank a step range selects: exactly those numbers of the phase, by row."""

    rows: frozenset[int]
    """Row indices into the rank's :class:`StepColumns`."""
    start_ns: int
    """The first selected step's start; with ``end_ns`` the span whatever else of the rank is read in."""
    end_ns: int
    """The last selected step's end (below ``start_ns`` when nothing is selected: an empty span)."""
    truncated: bool
    """More steps matched than ``limit``: the first ``limit`` (in start order) were kept."""


def select_steps(columns: StepColumns, phase: str, first: int | None, last: int | None,
                 limit: int | None = None) -> StepSelection:
    """The rank's steps of ``phase`` numbered ``first`` .. ``last`` (None: open), at most ``limit`` of them.

    Each rank gets its own steps A..B and its own span, however its timing differs from the other ranks'."""
    if phase not in columns.phase_names:
        return StepSelection(frozenset(), 0, -1, False)
    code = columns.phase_names.index(phase)
    rows = [i for i, (p, n) in enumerate(zip(columns.phase, columns.number))
            if p == code and (first is None or n >= first) and (last is None or n <= last)]
    rows.sort(key=lambda i: columns.start_ns[i])
    truncated = limit is not None and len(rows) > limit
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        return StepSelection(frozenset(), 0, -1, False)
    return StepSelection(frozenset(rows), min(columns.start_ns[i] for i in rows),
                         max(columns.start_ns[i] + columns.duration_ns[i] for i in rows), truncated)
