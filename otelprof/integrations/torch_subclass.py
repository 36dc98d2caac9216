"""An instrumented object's class: a subclass of its own with the timed methods, pickled and copied as the
original class (without the instrumentation)."""

from __future__ import annotations

import copyreg
from typing import Any

_object_class = object.__dict__["__class__"]
_NEWOBJ: Any = copyreg.__newobj__  # type: ignore[attr-defined]  # (not in the type stubs)
_RECONSTRUCTOR: Any = copyreg._reconstructor  # type: ignore[attr-defined]


def _instrumented_subclass(cls: type, namespace: dict[str, Any]) -> type:
    """A subclass of ``cls`` with ``namespace`` (the timed methods) that an instrumented object gets as its class:
    same name and module; pickled and copied (``copy.deepcopy``, ``torch.save``) as an object of ``cls``, i.e.
    without the instrumentation."""
    subclass: type

    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        reduced = cls.__reduce_ex__(self, protocol)  # type: ignore[call-arg]
        if isinstance(reduced, tuple) and len(reduced) > 1 and reduced[1] and reduced[1][0] is subclass:
            if reduced[0] is _NEWOBJ:  # pickle insists on the object's own class there
                return (_RECONSTRUCTOR, (cls, object, None), *reduced[2:])
            return (reduced[0], (cls, *reduced[1][1:]), *reduced[2:])
        return reduced

    subclass = type(cls.__name__, (cls,), {**namespace, "__reduce_ex__": __reduce_ex__, "__module__": cls.__module__,
                                           "__qualname__": cls.__qualname__, "_otelprof_instrumented": True})
    return subclass


def _set_class(obj: Any, cls: type) -> None:
    """``obj.__class__ = cls``, also for a wrapper whose ``__class__`` is a read-only property that names the
    wrapped object's class (accelerate's ``DataLoaderShard``): then object's own setter does it."""
    try:
        obj.__class__ = cls
    except AttributeError:
        _object_class.__set__(obj, cls)
