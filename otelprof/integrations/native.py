"""Which PyTorch hooks run: the C extension ``_torch_native`` or the same hooks in Python, and why.

The extension is optional: a wheel built for this interpreter and platform carries it; an install from
the source distribution without a compiler (or an interpreter no wheel was built for) does not, and
``OTELPROF_TORCH_NATIVE=false`` turns it off. ``otelprof doctor`` prints the answer. Nothing here
imports torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType

MODULE = "otelprof.integrations._torch_native"


def load() -> tuple[ModuleType | None, str]:
    """The extension module, or None and why it could not be imported."""
    try:
        return importlib.import_module(MODULE), ""
    except ImportError as exc:
        return None, str(exc) or type(exc).__name__


@dataclass(frozen=True)
class HookStatus:
    path: str
    """``C`` or ``Python``."""
    reason: str

    def line(self) -> str:
        return f"{self.path} hooks: {self.reason}"


def status(env: Mapping[str, str] | None = None) -> HookStatus:
    """The hooks the PyTorch integration would use in a process started with ``env`` (default: os.environ)."""
    from otelprof import environment_variables as ev
    from otelprof.config import Config

    module, error = load()
    if module is None:
        return HookStatus("Python", f"the C extension {MODULE} is not installed ({error}): the wheel for this "
                                    "platform was not used, or the source install had no C compiler")
    if not Config.from_env(env).torch_native:  # as init() reads it: an invalid value warns and keeps the default
        return HookStatus("Python", f"the C extension is installed but disabled by {ev.OTELPROF_TORCH_NATIVE}")
    return HookStatus("C", f"the C extension {MODULE} ({module.__file__})")
