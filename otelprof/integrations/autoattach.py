"""``otelprof run`` and the trainers: the zero-code path records what the explicit integrations record.

When the program imports

* Hugging Face ``transformers``' ``Trainer`` or Lightning's ``Trainer`` (``lightning`` or
  ``pytorch_lightning``): every ``Trainer`` built (subclasses too) gets otelprof's callback
  (:mod:`otelprof.integrations.transformers`, :mod:`otelprof.integrations.lightning`) unless the user
  passed one, and the global PyTorch hooks of ``otelprof run`` hand steps over to it for the rest of the
  process (:meth:`~otelprof.integrations.torch.TorchInstrumentation.hand_over`): the callback knows the
  trainer's optimizer steps, gradient accumulation, evaluation batches and logged loss, which the global
  hooks can only guess;
* ``accelerate``: its prepared data loaders and ``Accelerator.backward`` are patched
  (:mod:`otelprof.integrations.accelerate`).

Nothing is imported ahead of the program: a finder on ``sys.meta_path`` patches each module right after
the program imports it. A patch that fails is warned about once; the program goes on unpatched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from otelprof._log import info_once, warn_once
from otelprof.integrations import accelerate

__all__ = ["install", "uninstall"]

TRANSFORMERS = "transformers"
LIGHTNING = "lightning"


def _hand_over(framework: str) -> None:
    """Put the trainer's callback in charge of steps, if the global hooks of ``otelprof run`` are on."""
    from otelprof.integrations.torch_state import _active

    inst = _active[-1] if _active else None
    if inst is not None and "everything" in inst._removers:
        inst.hand_over(framework)


def _attach_transformers(trainer: Any) -> None:
    from otelprof.integrations.transformers import OtelprofCallback

    if not any(isinstance(c, OtelprofCallback) for c in trainer.callback_handler.callbacks):
        callback = OtelprofCallback(shutdown=False)
        trainer.add_callback(callback)
        callback.on_init_end(trainer.args, trainer.state, trainer.control, model=trainer.model)
        info_once("autoattach:transformers", "otelprof: attached its callback to the transformers Trainer")
    _hand_over(TRANSFORMERS)


def _attach_lightning(trainer: Any) -> None:
    from otelprof.integrations.lightning import OtelprofCallback

    callbacks = trainer.callbacks
    if not any(isinstance(c, OtelprofCallback) for c in callbacks):
        callbacks.append(OtelprofCallback(shutdown=False))
        info_once("autoattach:lightning", "otelprof: attached its callback to the Lightning Trainer")
    _hand_over(LIGHTNING)


def _after_init(cls: type, attach: Callable[[Any], None], name: str) -> None:
    """Run ``attach(trainer)`` at the end of ``cls.__init__``; if it fails, the trainer runs as it would without
    otelprof's callback."""

    def failed(exc: Exception) -> None:
        warn_once(f"autoattach:{name}:attach", "otelprof: cannot attach its callback to the %s Trainer (%r); "
                  "steps are detected by the global PyTorch hooks instead", name, exc)

    accelerate.after_init(cls, attach, failed)


def _patch_transformers(module: ModuleType) -> None:
    _after_init(module.Trainer, _attach_transformers, TRANSFORMERS)


def _patch_lightning(module: ModuleType) -> None:
    _after_init(module.Trainer, _attach_lightning, LIGHTNING)


def _patch_accelerator(module: ModuleType) -> None:
    accelerate.patch_backward(module.Accelerator)


def _patch_data_loader(module: ModuleType) -> None:
    accelerate.patch_loaders(module.DataLoaderAdapter)


PATCHED: dict[str, tuple[tuple[str, str], ...]] = {
    "transformers.trainer": (("Trainer", "__init__"),),
    "lightning.pytorch.trainer.trainer": (("Trainer", "__init__"),),
    "pytorch_lightning.trainer.trainer": (("Trainer", "__init__"),),
    "accelerate.accelerator": (("Accelerator", "backward"),),
    "accelerate.data_loader": (("DataLoaderAdapter", "__init__"),),
}
"""What each patch below replaces: (class, method) in the module."""
PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "transformers.trainer": _patch_transformers,
    "lightning.pytorch.trainer.trainer": _patch_lightning,
    "pytorch_lightning.trainer.trainer": _patch_lightning,
    "accelerate.accelerator": _patch_accelerator,
    "accelerate.data_loader": _patch_data_loader,
}
"""Module that defines the class -> its patch."""


def _apply(name: str, module: ModuleType) -> None:
    try:
        PATCHES[name](module)
    except Exception as exc:  # a version whose classes look different: the program goes on unpatched
        warn_once(f"autoattach:{name}", "otelprof: cannot patch %s (%r); `otelprof run` records it through the "
                  "global PyTorch hooks only", name, exc)


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the patch."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create: Callable[[importlib.machinery.ModuleSpec], ModuleType | None] | None = getattr(
            self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:  # the module keeps its own loader (resources, reload)
            spec.loader = self._loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        self._loader.exec_module(module)
        _apply(self._name, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`PATCHES` through the other finders and wraps their loaders."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _Finder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                if spec.loader is None or not hasattr(spec.loader, "exec_module"):
                    return None
                spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


def install() -> None:
    """Patch the trainers and accelerate when the program imports them (already imported: now)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name in PATCHES:
        module = sys.modules.get(name)
        if module is not None:
            _apply(name, module)


def uninstall() -> None:
    """Undo :func:`install` (tests): the finder leaves ``sys.meta_path``, the patched methods are the originals
    again (trainers built meanwhile keep the callback they got)."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _Finder)]
    for name, methods in PATCHED.items():
        module = sys.modules.get(name)
        for class_name, method in methods:
            cls = getattr(module, class_name, None)
            patched = vars(cls).get(method) if isinstance(cls, type) else None
            if getattr(patched, accelerate.MARK, False):
                setattr(cls, method, patched.__wrapped__)  # type: ignore[union-attr]
