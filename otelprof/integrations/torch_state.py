"""What the PyTorch integration's modules share: the running instrumentation, the C extension, the session's
registry, and the names their hooks use (as module globals: one lookup on the hot path)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from otelprof import semconv as sc
from otelprof.runtime import hotpath as hot

_lock = threading.RLock()
_active: list[Any] = []
"""The :class:`~otelprof.integrations.torch.TorchInstrumentation` in use (``instrument()`` makes one per
process), where the process-wide patches (``Tensor.backward``, ``DataLoader``, DDP, ``GradScaler``) find it."""


def _load_native() -> Any:
    """The hot path in C (``_torch_native.c``, built by setup.py where a compiler is available), or None."""
    from otelprof.integrations import native

    return native.load()[0]


_native = _load_native()


def _native_wanted() -> bool:
    """``OTELPROF_TORCH_NATIVE`` / ``init(torch_native=...)``, and the extension is there."""
    if _native is None:
        return False
    session = _session()
    config = getattr(session, "config", None)
    if config is None:
        from otelprof.config import Config

        config = Config.from_env()
    return bool(config.torch_native)


def _session() -> Any:
    from otelprof.runtime.session import get_session

    return get_session()


def _with_registry(action: Callable[[Any], None]) -> None:
    session = _session()
    if session is None:
        return
    with session.registry.lock:
        action(session.registry)


def _open_step() -> hot.StepContext | None:
    """The step open on this thread (the user's or an automatic one)."""
    return hot._tls.step


FETCH, FORWARD, BACKWARD, OPTIMIZER = "fetch", "forward", "backward", "optimizer"
"""The events that start or continue an automatic step."""
EVAL_PHASE = "eval"
"""The phase of automatic steps that evaluate (their forwards in eval mode or without gradients)."""
_NATIVE_KINDS = (FETCH, FORWARD, BACKWARD, OPTIMIZER)
"""The C code's event kinds, by number."""

# Region names as module globals: one lookup on the hot path instead of two.
_DATALOADER, _FORWARD = sc.REGION_DATALOADER, sc.REGION_FORWARD
_BACKWARD, _OPTIMIZER = sc.REGION_BACKWARD, sc.REGION_OPTIMIZER
_SAMPLES, _LOSS, _LEARNING_RATE = sc.SCALAR_SAMPLES, sc.SCALAR_LOSS, sc.SCALAR_LEARNING_RATE
_Sum, _Mean = hot.Sum, hot.Mean
_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_cuda = torch.cuda
_cuda_globals = vars(torch.cuda)
_OpenRegion = tuple[int, "hot.StepContext | None", int]
"""A region a hook opened with ``hot._begin_region``: (start_ns, step, depth), closed by ``hot._end_region``."""

HOOK_CUDA_EVENTS = "cuda_events"
"""``hook`` label of ``otelprof.integration.errors`` when the CUDA event API failed and device timing stopped."""
HOOK_NATIVE = "native"
"""``hook`` label of ``otelprof.integration.errors`` when the C hot path failed (the Python hooks carry on)."""
