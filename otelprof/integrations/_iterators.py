"""The data-loader iterator stand-in the integrations time fetches with."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class IteratorProxy:
    """Stands in for a data-loader iterator: its length and attributes are the wrapped iterator's;
    subclasses define ``__next__``."""

    def __init__(self, iterator: Iterator[Any]) -> None:
        self._iterator = iterator

    def __iter__(self) -> IteratorProxy:
        return self

    def __len__(self) -> int:
        return len(self._iterator)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterator, name)
