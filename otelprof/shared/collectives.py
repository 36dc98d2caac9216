"""A step's communication time from the intervals of its regions, not from their sum.

DDP reduces gradients in buckets, each launched as soon as its gradients are ready, so several
all-reduces are in flight at once: their ``collective`` regions overlap one another and the
``backward`` region that launched them. Per step:

* **collective time** — the union of the collective intervals, clipped to the step: wall time with at
  least one all-reduce in flight (never more than the step);
* **exposed communication** — the part of it during which the rank could only wait. DDP launches the last
  bucket when the backward pass has computed the last gradient, and ``backward()`` then waits for every
  bucket before it returns; so a backward region counts as compute from its start to the launch of the
  last collective inside it, and collective time outside that is exposed. A step with collectives but no
  backward region (steps marked by hand, no backward hook) has all its collective time exposed.

Compute time per step is then step time less exposed communication (and less data-loader wait where that
is judged apart): never negative, and a rank that waits for a straggler shows the wait as exposed time
while the straggler shows little.
"""

from __future__ import annotations

import operator
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import chain, compress, repeat
from typing import TYPE_CHECKING

from otelprof import semconv as sc

if TYPE_CHECKING:
    from otelprof.recording.columns import StepColumns

COLLECTIVE = sc.REGION_COLLECTIVE
BACKWARD = sc.REGION_BACKWARD


def merged(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint intervals covering the same time as ``intervals`` (empty ones dropped)."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def covered(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> int:
    """Time in both of two lists of sorted, disjoint intervals."""
    total = i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            total += end - start
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def communication(step_start: int, step_end: int, collectives: Sequence[tuple[int, int]],
                  backwards: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """(collective time, exposed communication) of one step, in the unit of its times, from the
    (start, end) of its collective and backward regions."""
    if not collectives:
        return 0, 0
    flight = merged([(s if s > step_start else step_start, e if e < step_end else step_end) for s, e in collectives])
    union = 0
    for s, e in flight:
        union += e - s
    if not backwards:
        return union, union
    heads = []
    for start, end in backwards:
        launches = [s for s, _ in collectives if start <= s <= end]
        heads.append((start, max(launches) if launches else end))
    return union, union - covered(flight, heads if len(heads) == 1 else merged(heads))


def step_communication(start_ns: int, end_ns: int,
                       annotations: Iterable[tuple[str, int, int, int, str | None]]) -> tuple[int, int]:
    """:func:`communication` of a step record's annotations ``(name, start_ns, end_ns, depth, error)``."""
    collectives, backwards = [], []
    for name, a_start, a_end, _, _ in annotations:
        if name == COLLECTIVE:
            collectives.append((a_start, a_end))
        elif name == BACKWARD:
            backwards.append((a_start, a_end))
    return communication(start_ns, end_ns, collectives, backwards)


def columns_communication(names: Sequence[str], index: Sequence[int], codes: Sequence[int],
                          offsets: Sequence[int], durations: Sequence[int],
                          step_durations: Sequence[int], step_of: Sequence[int] | None = None
                          ) -> tuple[array[int], array[int]]:
    """Per step of a recording's step columns (annotations of step ``i`` at ``index[i]:index[i + 1]``, times
    as offsets from the step start; ``step_of``: each annotation's step, when known): (collective time, exposed
    communication) in ns, zero without collectives."""
    n = len(step_durations)
    union, exposed = array("q", bytes(8 * n)), array("q", bytes(8 * n))
    if COLLECTIVE not in names:
        return union, exposed
    coll = names.index(COLLECTIVE)
    back = names.index(BACKWARD) if BACKWARD in names else -1
    if step_of is None:
        step_of = list(chain.from_iterable(map(repeat, range(n), map(operator.sub, index[1:n + 1], index[:n]))))
    positions = range(len(codes))
    found = list(compress(positions, map(operator.eq, codes, repeat(coll))))
    steps = list(map(step_of.__getitem__, found))
    backs: dict[int, list[int]] = {}  # per step: its backward regions
    if back >= 0:
        for j in compress(positions, map(operator.eq, codes, repeat(back))):
            backs.setdefault(step_of[j], []).append(j)
    many = {i for i, count in Counter(steps).items() if count > 1}
    for i, j in zip(steps, found):  # one bucket and at most one backward region (the usual step): inline
        if i in many:
            continue
        backward = backs.get(i)
        if backward is not None and len(backward) > 1:
            many.add(i)
            continue
        step = step_durations[i]
        launch = offsets[j]
        start, end = launch, launch + durations[j]
        start, end = (start if start > 0 else 0), (end if end < step else step)
        if end <= start:
            continue
        union[i] = time = end - start
        if backward is None:
            exposed[i] = time
            continue
        b_start = offsets[backward[0]]
        b_end = b_start + durations[backward[0]]
        head_end = launch if b_start <= launch <= b_end else b_end
        both = min(end, head_end) - max(start, b_start)
        exposed[i] = time - both if both > 0 else time
    for i in sorted(many):
        lo, hi = index[i], index[i + 1]
        collectives, backwards = [], []
        for j in range(lo, hi):
            code = codes[j]
            if code == coll:
                collectives.append((offsets[j], offsets[j] + durations[j]))
            elif code == back:
                backwards.append((offsets[j], offsets[j] + durations[j]))
        union[i], exposed[i] = communication(0, step_durations[i], collectives, backwards)
    return union, exposed


def of_columns(columns: StepColumns) -> tuple[array[int], array[int]]:
    """:func:`columns_communication` of one rank's step columns, computed once per read."""
    cached: tuple[int, tuple[array[int], array[int]]] | None = columns.__dict__.get("_communication")
    if cached is None or cached[0] != len(columns):
        cached = columns.__dict__["_communication"] = (len(columns), columns_communication(
            columns.ann_names, columns.ann_index, columns.ann_name, columns.ann_offset, columns.ann_duration,
            columns.duration_ns, columns.step_of_annotations()))
    return cached[1]
