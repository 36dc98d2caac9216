"""The records a recording holds, as the reader hands them out: steps, regions, device times, spans."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Annotation:
    name: str
    start_ns: int
    duration_ns: int
    depth: int = 0
    phase: str | None = None


@dataclass(frozen=True)
class Step:
    phase: str
    number: int
    start_ns: int
    duration_ns: int
    annotations: tuple[Annotation, ...] = ()
    scalars: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def duration(self) -> float:
        """Seconds."""
        return self.duration_ns / 1e9

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns


@dataclass(frozen=True)
class DeviceTime:
    """Device (CUDA event) time of one region of the step ``phase``/``number`` (None: outside steps)."""

    phase: str
    number: int | None
    name: str
    duration_ns: int


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
