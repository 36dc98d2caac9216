"""The application's Python warnings state, kept as it was across work otelprof does on its behalf.

Python shows a warning of the ``default`` action once per location (``module``: per module, ``once``: once):
each module's ``__warningregistry__`` (and ``warnings.onceregistry``) remembers what was shown, stamped with a
version of the filter list. Any change of the filters — ``warnings.filterwarnings``/``simplefilter`` or a
``catch_warnings`` block, which the OpenTelemetry SDK's ``get_tracer()`` and libraries imported on first use
(torch.profiler's first start imports ``torch._inductor``) all run — bumps the version and makes Python forget
every registry, so a warning the job already printed prints again. :func:`untouched` runs otelprof's work and
then marks the registries that were current before it current again: the filters may have grown, but what the
job was already shown stays shown. Python versions without the hook (``warnings._filters_mutated``) are left
alone.
"""

from __future__ import annotations

import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_lock = threading.Lock()
_changes = 0
"""Changes of the filter list seen since the counter was installed (each bumps Python's version by one)."""
_original: Callable[[], None] | None = None


def _changed() -> None:
    global _changes
    _changes += 1
    if _original is not None:
        _original()


def _install() -> bool:
    """Count the filter changes (warnings calls its ``_filters_mutated`` as a module global); False: cannot."""
    global _original
    with _lock:
        if _original is None:
            original = getattr(warnings, "_filters_mutated", None)
            if not callable(original):
                return False
            _original = original
            warnings._filters_mutated = _changed  # type: ignore[attr-defined]
    return True


def _registries() -> Iterator[dict[Any, Any]]:
    """Every module's warning registry and the ``once`` registry."""
    for module in list(sys.modules.values()):
        if isinstance(module, types.ModuleType):  # (anything else in sys.modules is not asked for attributes)
            registry = module.__dict__.get("__warningregistry__")
            if isinstance(registry, dict):
                yield registry
    once = getattr(warnings, "onceregistry", None)
    if isinstance(once, dict):
        yield once


def _current_version() -> int | None:
    """The newest version any registry holds (the filters' version unless they changed since the last warning)."""
    versions = [v for r in _registries() if isinstance(v := r.get("version"), int)]
    return max(versions) if versions else None


@contextmanager
def untouched() -> Iterator[None]:
    """Run the body; the warnings the job was shown before it stay shown after it."""
    if not _install():
        yield
        return
    before, version = _changes, _current_version()
    try:
        yield
    finally:
        changes = _changes - before
        if changes and version is not None:
            for registry in _registries():
                if registry.get("version") == version:
                    registry["version"] = version + changes
