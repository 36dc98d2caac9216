"""Regions nested in a region of the same name are one region, counted once.

A user's ``annotate("backward")`` around ``loss.backward()`` holds the PyTorch hooks' own ``backward``
region: two records of the same time. The outer one counts (its count, total and histogram observation);
an inner one of the same name inside it is not counted again, wherever the totals are made (the live
region histogram, the report's region table and breakdown), so they all agree.

A region's *self* time is its time less the time of the regions directly inside it (their union, should
they overlap).
"""

from __future__ import annotations

from collections.abc import Sequence


def repeats(annotations: Sequence[tuple[str, int, int, int, str | None]]) -> set[int] | None:
    """Indexes of the step record's annotations ``(name, start_ns, end_ns, depth, error)`` that lie inside
    an annotation of the same name at a smaller depth; None when there are none (the usual case, found
    without a loop over pairs: no name recurs at two depths)."""
    deep = {a[0] for a in annotations if a[3]}
    if not deep:  # nothing nested (the usual step without DDP)
        return None
    seen: dict[str, int] = {}
    for name, _, _, depth, _ in annotations:
        if name in deep and seen.setdefault(name, depth) != depth:
            break
    else:  # each name nested at one depth only (DDP's all-reduces)
        return None
    out = set()
    for i, (name, start, end, depth, _) in enumerate(annotations):
        if depth and any(other[0] == name and other[3] < depth and other[1] <= start and end <= other[2]
                         for other in annotations):
            out.add(i)
    return out or None


def step_regions(codes: Sequence[int], offsets: Sequence[int], durations: Sequence[int],
                 depths: Sequence[int], apart: int = -1) -> tuple[list[bool], list[int]]:
    """One step's annotations (name codes, offsets from the step start, durations, depths): per annotation,
    whether it counts (not inside one of the same name) and its self time in ns (0 for one that does not
    count). Regions of code ``apart`` (the all-reduces, timed on another thread beside the work of the region
    they fall in) take nothing from their parent's self time."""
    n = len(codes)
    order = sorted(range(n), key=lambda j: (offsets[j], depths[j], -durations[j]))
    counts = [True] * n
    cover = [0] * n
    """Per annotation: ns of it covered by the counted regions directly inside it."""
    last = list(offsets)
    """Per annotation: where its last child (so far) ends: children come in start order."""
    stack: list[tuple[int, int, int]] = []  # (index, end, depth) of the regions enclosing the next one
    for j in order:
        start, end, depth = offsets[j], offsets[j] + durations[j], depths[j]
        while stack and (stack[-1][1] <= start or stack[-1][2] >= depth):
            stack.pop()
        code = codes[j]
        if any(codes[k] == code for k, _, _ in stack):
            counts[j] = False  # the same region again: its time is its ancestor's, its children too
        elif code != apart:
            parent = next((k for k, _, _ in reversed(stack) if counts[k]), None)
            if parent is not None:
                child_start, child_end = max(start, last[parent]), min(end, offsets[parent] + durations[parent])
                if child_end > child_start:
                    cover[parent] += child_end - child_start
                    last[parent] = child_end
        stack.append((j, end, depth))
    return counts, [max(durations[j] - cover[j], 0) if counts[j] else 0 for j in range(n)]
