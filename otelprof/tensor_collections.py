"""Tensor collections: which tensors of the model are reduced to statistics, and at which steps.

A collection is a built-in kind (``weights``, ``biases``, ``gradients``, ``outputs``, ``inputs``,
``optimizer``, ``losses``) or a custom name with an ``include`` regex over tensor names (all kinds), each
with optional ``include``/``exclude`` regexes, a save interval and a step range. Tensor names:

* ``weights`` / ``biases``: the parameter's name (``fc1.weight``, ``fc1.bias``)
* ``gradients``: ``gradients/<parameter>``
* ``outputs`` / ``inputs``: ``<module>/output``, ``<module>/input`` (leaf modules; the first tensor)
* ``optimizer``: ``update/<parameter>`` (the step's update, with its ``ratio`` to the weight's L2 norm)
* ``losses``: ``losses/<phase>`` (the recorded loss scalar of each saved step)

``OTELPROF_COLLECTIONS`` holds them as a comma list of ``NAME[=INCLUDE][!EXCLUDE][@EVERY][#START-END]``
(regexes without ``,!@#``), e.g. ``gradients,weights@50,attn=attn\\.[0-9]+/output#0-1000``.
This module has no torch import: the config validates the variable with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BUILTIN = ("weights", "biases", "gradients", "outputs", "inputs", "optimizer", "losses")
"""The built-in collections, each selecting one kind of tensor."""
DEFAULT_SAVE_INTERVAL = 500

_ITEM = re.compile(r"^(?P<name>[A-Za-z_][\w.-]*)(?:=(?P<include>[^!@#]*))?(?:!(?P<exclude>[^@#]*))?"
                   r"(?:@(?P<every>\d+))?(?:#(?P<start>\d+)-(?P<end>\d+))?$")


@dataclass(frozen=True)
class Collection:
    """One collection. ``every`` None: the configured save interval; ``start``/``end``: steps start..end
    (inclusive) only, counting ``every`` from ``start``."""

    name: str
    include: str | None = None
    exclude: str | None = None
    every: int | None = None
    start: int = 0
    end: int | None = None

    def __post_init__(self) -> None:
        if self.include is None and self.name not in BUILTIN:
            raise ValueError(f"collection {self.name!r} is not built in ({', '.join(BUILTIN)}): give it an include "
                             "regex (NAME=REGEX)")
        for regex in (self.include, self.exclude):
            if regex is not None:
                try:
                    re.compile(regex)
                except re.error as exc:
                    raise ValueError(f"collection {self.name!r}: bad regex {regex!r} ({exc})") from None
        if self.every is not None and self.every < 1:
            raise ValueError(f"collection {self.name!r}: the save interval must be at least 1")
        if self.start < 0 or (self.end is not None and self.end < self.start):
            raise ValueError(f"collection {self.name!r}: bad step range {self.start}-{self.end}")

    @property
    def kind(self) -> str | None:
        """The tensor kind a built-in collection selects (None: a custom one, any kind)."""
        return self.name if self.name in BUILTIN else None

    def saves(self, step: int, default_every: int) -> bool:
        """Whether this collection saves at ``step`` (0-based optimizer steps)."""
        if step < self.start or (self.end is not None and step > self.end):
            return False
        return (step - self.start) % (self.every or default_every) == 0

    def selects(self, kind: str, name: str) -> bool:
        """Whether the tensor ``name`` of ``kind`` belongs to this collection."""
        if self.kind is not None and kind != self.kind:
            return False
        if self.include is not None and not re.search(self.include, name):
            return False
        return self.exclude is None or not re.search(self.exclude, name)


def parse_collections(text: str) -> tuple[Collection, ...]:
    """``OTELPROF_COLLECTIONS``'s value as collections; ValueError names the bad item."""
    out: list[Collection] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        match = _ITEM.match(item)
        if match is None:
            raise ValueError(f"bad collection {item!r}: expected NAME[=INCLUDE][!EXCLUDE][@EVERY][#START-END]")
        g = match.groupdict()
        out.append(Collection(g["name"], g["include"] or None, g["exclude"] or None,
                              int(g["every"]) if g["every"] else None, int(g["start"] or 0),
                              int(g["end"]) if g["end"] else None))
    names = [c.name for c in out]
    if len(set(names)) < len(names):
        raise ValueError("a collection is named twice")
    return tuple(out)


def as_collections(spec: object) -> tuple[Collection, ...]:
    """Collections from code: a string as in ``OTELPROF_COLLECTIONS``, or an iterable of names and
    :class:`Collection` objects."""
    if isinstance(spec, str):
        return parse_collections(spec)
    if isinstance(spec, Collection):
        return (spec,)
    out: list[Collection] = []
    for item in spec:  # type: ignore[attr-defined]
        out.extend(as_collections(item) if isinstance(item, str) else (item,))
    return tuple(out)
