"""The ``collective`` region: a DDP model's gradient all-reduce, timed by otelprof's communication hook.

DDP takes one communication hook per model, for good. otelprof's times each bucket's reduction as a ``collective``
region and runs the reduction itself inside: DDP's all-reduce, or the user's hook when they register one after
otelprof's — ``register_comm_hook`` is patched to hand it over, so theirs wins and is timed. A model that has a
hook of its own before otelprof sees it keeps it alone (no collective regions).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

import torch

from otelprof import semconv as sc
from otelprof._log import info_once, warn_once
from otelprof.integrations.torch_hooks import _Hooks
from otelprof.integrations.torch_state import _active, _open_step, _session
from otelprof.runtime import hotpath as hot

_ddp_hooks: weakref.WeakKeyDictionary[Any, _CommHook] = weakref.WeakKeyDictionary()
"""The DDP models that carry otelprof's communication hook."""
_original_ddp_init: Callable[..., Any] | None = None
_original_register_comm_hook: Callable[..., Any] | None = None
_original_register_builtin_comm_hook: Callable[..., Any] | None = None


def _ddp_class() -> Any:
    return getattr(torch.nn.parallel, "DistributedDataParallel", None)


class _CommHook:
    """The reduction otelprof's communication hook of one DDP model runs: DDP's default all-reduce over the
    model's process group, until the user registers a hook of their own."""

    __slots__ = ("hook", "state", "users")

    def __init__(self, process_group: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.hook: Callable[[Any, Any], Any] = default_hooks.allreduce_hook
        self.state: Any = process_group
        self.users = False
        """The user's hook is inside: a second registration fails as DDP's would."""


def _average(process_group: Any, bucket: Any) -> Any:
    """``default_hooks.allreduce_hook`` without its Python layers (``dist.all_reduce``'s checks, a second
    ``then``): the bucket divided by the group's size, all-reduced on the group itself. Its future's value is
    a list of the one tensor."""
    group: Any = process_group if process_group is not None else torch.distributed.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(group.size())
    return group.allreduce([tensor]).get_future()


def _timed_comm_hook(inner: _CommHook) -> Callable[[Any, Any], Any]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    default = default_hooks.allreduce_hook

    def otelprof_collective(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations: none here
        hook, hook_state = inner.hook, inner.state
        step: hot.StepContext | None = None
        try:
            inst: _Hooks | None = _active[-1] if _active and hot._active is not None else None
            if inst is not None:  # the step may be open on another thread (autograd's device threads)
                step = inst.auto.current if inst.auto.current is not None else _open_step()
            start = perf_counter_ns()
        except Exception:
            step = None
        if hook is default:  # DDP's own reduction, done here: the callback unwraps its value (a list of one)
            future, unwrap = _average(hook_state, bucket), True
        else:  # the user's hook, timed
            future, unwrap = hook(hook_state, bucket), False
            if step is None:
                return future

        def done(fut):  # type: ignore[no-untyped-def]
            if step is not None and not step.closed and len(step.annotations) < hot.MAX_STEP_ANNOTATIONS:
                step.annotations.append((sc.REGION_COLLECTIVE, start, perf_counter_ns(), 1, None))
            value = fut.value()
            return value[0] if unwrap else value

        return future.then(done)

    return otelprof_collective


def _hook_ddp(model: Any) -> None:
    """Give a DDP model otelprof's communication hook, unless it has one (a hook of its own, or DDP's mixed
    precision or optimizer-in-backward hook): DDP allows one, so otelprof leaves it alone, and says so once."""
    if model in _ddp_hooks:
        return
    if getattr(model, "_comm_hooks", None) or getattr(model, "_use_python_reducer", False):
        info_once("torch:comm-hook-own", "otelprof: a DDP model already has a communication hook; otelprof leaves "
                  "it alone, so its gradient reduction is not timed (no collective regions). Register your hook "
                  "after otelprof.torch.instrument() (or under `otelprof run`) to have it timed.")
        return
    _patch_register_comm_hook()
    inner = _CommHook(getattr(model, "process_group", None))
    register = _original_register_comm_hook
    assert register is not None
    try:
        register(model, None, _timed_comm_hook(inner))
    except Exception as exc:  # a built-in (C++) hook is registered already, or an unforeseen DDP
        info_once("torch:comm-hook", "otelprof: cannot time this DDP model's gradient reduction (%s); no collective "
                  "regions", exc)
        return
    _ddp_hooks[model] = inner


def _patch_register_comm_hook() -> None:
    """``register_comm_hook`` on a model with otelprof's hook puts the user's hook inside it (theirs runs, timed);
    DDP's own checks of the hook run as before. Kept for the process's life: the models keep otelprof's hook."""
    global _original_register_comm_hook, _original_register_builtin_comm_hook
    ddp = _ddp_class()
    if ddp is None or _original_register_comm_hook is not None:
        return
    original = _original_register_comm_hook = ddp.register_comm_hook
    original_builtin = _original_register_builtin_comm_hook = ddp._register_builtin_comm_hook

    @functools.wraps(original)
    def register_comm_hook(self: Any, state: object, hook: Callable[..., Any]) -> None:
        inner = _ddp_hooks.get(self)
        if inner is None or inner.users:
            original(self, state, hook)
            return
        self._check_comm_hook(hook)  # DDP's own checks: the same errors as without otelprof
        inner.hook, inner.state, inner.users = hook, state, True
        with contextlib.suppress(Exception):
            self.logger._set_comm_hook_name(hook.__qualname__)
        info_once("torch:comm-hook-user", "otelprof: your DDP communication hook %s runs inside otelprof's, which "
                  "times it as the collective region", getattr(hook, "__qualname__", hook))

    @functools.wraps(original_builtin)
    def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        inner = _ddp_hooks.get(self)
        python = {"ALLREDUCE": default_hooks.allreduce_hook,
                  "FP16_COMPRESS": default_hooks.fp16_compress_hook}.get(getattr(comm_hook_type, "name", ""))
        if inner is None or inner.users or python is None:
            original_builtin(self, comm_hook_type)
            return
        register_comm_hook(self, self.process_group, python)  # the same reduction, written in Python

    ddp.register_comm_hook = register_comm_hook
    ddp._register_builtin_comm_hook = _register_builtin_comm_hook


def _patch_ddp_class() -> None:
    """``otelprof run``: each DDP model built from now on gets otelprof's communication hook."""
    global _original_ddp_init
    ddp = _ddp_class()
    if ddp is None or _original_ddp_init is not None:
        return
    original = _original_ddp_init = ddp.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        owner: _CollectiveHooks | None = _active[-1] if _active else None
        if owner is not None and not owner.closed:
            try:
                owner._add_comm_hook(self)
            except Exception as exc:  # never the job's failure
                warn_once("torch:comm-hook-auto", "otelprof: cannot time DDP's gradient reduction (%r); no "
                          "collective regions", exc)

    ddp.__init__ = __init__


def _unpatch_ddp_class() -> None:
    global _original_ddp_init
    ddp = _ddp_class()
    if ddp is not None and _original_ddp_init is not None:
        ddp.__init__ = _original_ddp_init
        _original_ddp_init = None


class _CollectiveHooks(_Hooks):
    """The DDP hook of an instrumentation: a model it instruments that is a DDP model gets the communication
    hook."""

    def _add_comm_hook(self, model: Any) -> None:
        """Time a DDP model's gradient all-reduce (:func:`_hook_ddp`); the C hot path then leaves steps to Python,
        where the collective regions go."""
        ddp = _ddp_class()
        if ddp is None or not isinstance(model, ddp) or not getattr(getattr(_session(), "config", None),
                                                                    "ddp_collectives", True):
            return
        self._comm_hooked = True
        _hook_ddp(model)
        self.sync_native()
