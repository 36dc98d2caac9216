"""torch.compile seen from otelprof: compile time as a ``compile`` region, hooks that stay out of the compiler's way,
and torch's warning about global module hooks kept off the job's stderr.

* Dynamo runs ``torch._dynamo.callback``'s start and end callbacks around each compilation (a frame, a backward
  compiled lazily at its first run, a CUDA graph recorded): the time between them becomes a ``compile`` region
  (:data:`otelprof.semconv.REGION_COMPILE`) of the step that compiled, and that step is never judged as an outlier.
* Before the first compilation starts, the listeners of :func:`on_first_compile` run (once): the tensor
  collections' activation hooks go on for good, never added or removed again (Dynamo guards on a module's
  hooks: a change recompiles). Every module hook otelprof installs is traced as nothing
  (:func:`skipped_while_compiling`), and the instrumented forward is a Python function that torch.compile can
  inspect and trace (the original forward while compiling).
* ``torch._dynamo.reset()`` clears the callbacks; the next ``instrument()`` registers them again.
* While any global module hook of otelprof's is installed, calling a ``torch.compile``'d module makes torch warn
  (once per call site) that global hooks fire for the ``OptimizedModule`` too; that exact warning is filtered
  while otelprof's hooks are in place (:func:`quiet_global_hooks`), no other.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from otelprof import _warnings
from otelprof import semconv as sc
from otelprof.runtime import hotpath as hot

GLOBAL_HOOKS_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"
"""The start of torch's UserWarning at each call of a compiled module while global module hooks exist."""

_lock = threading.RLock()
_first: list[Callable[[], None]] = []
"""Called once as the first compilation starts (or at once when one already did)."""
_compiled = [False]
_open = threading.local()
"""``start``: (start_ns, step, depth) of the compilation under way on this thread."""
_quiet = [0]
"""otelprof's global module hooks in place (the warning's filter is in while this is above 0)."""


def compiling() -> bool:
    """True while Dynamo traces (the compiler sees a constant True: code behind it is traced as nothing)."""
    import torch

    return bool(torch.compiler.is_compiling())


def skipped_while_compiling(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` as a module hook that the compiler traces as a plain return (it runs on eager calls only)."""
    import torch

    is_compiling = torch.compiler.is_compiling

    def hook_outside_compile(*args: Any) -> Any:
        if is_compiling():
            return None
        return hook(*args)

    run_eagerly(hook_outside_compile)
    return hook_outside_compile


def run_eagerly(function: Callable[..., Any]) -> None:
    """Dynamo never compiles a frame of ``function`` (or one it calls) on its own: called from eager code under a
    compiled module (the hooks of the user module torch.compile wraps run outside its graph, with Dynamo
    catching the frames they call), it runs as written; inlined into a frame Dynamo traces, it is traced as usual
    (our hooks: as nothing). Compiled on its own, a hook would become what Dynamo traced (nothing) and never run
    again."""
    code = getattr(function, "__code__", None)
    if code is None:
        return
    try:
        from torch._dynamo import eval_frame
        from torch._dynamo import types as dynamo_types

        # this frame and every frame it calls (otelprof's own code) run eagerly; again at each call: cheap, and a
        # torch._dynamo.reset() may have cleared it
        skip = getattr(dynamo_types, "FrameAction").SKIP  # noqa: B009  (not re-exported in the stubs)
        strategy = getattr(dynamo_types, "FrameExecStrategy")(skip, skip)  # noqa: B009
        getattr(eval_frame, "set_code_exec_strategy")(code, strategy)  # noqa: B009
    except Exception:  # a torch without it: such hooks run as Dynamo compiles them
        return


def has_compiled() -> bool:
    """A compilation started since :func:`install` (or torch.compile compiled a frame before it)."""
    if _compiled[0]:
        return True
    from otelprof.integrations import flops

    return flops.compiled()


def on_first_compile(listener: Callable[[], None]) -> None:
    """Run ``listener`` as the first compilation starts, before Dynamo traces anything (at once if one already
    ran). A listener that raises is dropped (logged), never into the compiler."""
    with _lock:
        if not has_compiled():
            _first.append(listener)
            return
    _call(listener)


def _call(listener: Callable[[], None]) -> None:
    from otelprof._log import logger

    try:
        listener()
    except Exception:
        logger.exception("otelprof: preparing for torch.compile failed")


def install() -> None:
    """Register the compile callbacks (idempotent; again after ``torch._dynamo.reset()``, which clears them)."""
    try:
        from torch._dynamo.callback import callback_handler
    except Exception:  # a torch without Dynamo: nothing compiles
        return
    with _lock:
        if _on_start not in callback_handler.start_callbacks:
            callback_handler.register_start_callback(_on_start)
        if _on_end not in callback_handler.end_callbacks:
            callback_handler.register_end_callback(_on_end)


def uninstall() -> None:
    """Remove the compile callbacks; the next instrumentation starts over (listeners, first compilation)."""
    with _lock:
        _first.clear()
        _compiled[0] = False
    try:
        from torch._dynamo.callback import callback_handler
    except Exception:
        return
    with _lock:
        for callbacks in (callback_handler.start_callbacks, callback_handler.end_callbacks):
            for callback in (_on_start, _on_end):
                while callback in callbacks:
                    callbacks.remove(callback)


def _on_start(args: Any) -> None:
    """A compilation starts on this thread (Dynamo calls this once for nested ones)."""
    try:
        with _lock:
            first, _first[:] = _first[:], []
            _compiled[0] = True
        for listener in first:
            _call(listener)
        if hot._active is None:
            return
        step = hot._tls.step
        if step is None and (native := hot._native[0]) is not None:  # a step the C hooks hold: hand it over
            native()
            step = hot._tls.step
        depth = 0
        if step is not None:
            depth = step.depth
            step.depth = depth + 1
        _open.start = (perf_counter_ns(), step, depth)
    except Exception:  # never into the compiler
        _open.start = None


def _on_end(args: Any) -> None:
    """The compilation ends: its time becomes a ``compile`` region of the step under way (or one of its own)."""
    try:
        opened, _open.start = getattr(_open, "start", None), None
        if opened is None or hot._active is None:
            return
        start_ns, step, depth = opened
        if step is not None:
            step.depth = depth
        hot._close_region(sc.REGION_COMPILE, start_ns, perf_counter_ns(), step, depth, None)
    except Exception:
        return


def quiet_global_hooks() -> None:
    """otelprof installs a global module hook: torch's warning about global hooks at compiled modules' calls is
    filtered (that message only) until as many :func:`unquiet_global_hooks` calls."""
    with _lock:
        _quiet[0] += 1
        if _quiet[0] == 1:
            with _warnings.untouched():  # the warnings the job was already shown stay shown
                warnings.filterwarnings("ignore", message=GLOBAL_HOOKS_WARNING, category=UserWarning)


def unquiet_global_hooks() -> None:
    """One of otelprof's global hooks is gone; with the last, the warning's filter goes too."""
    with _lock:
        if _quiet[0] <= 0:
            return
        _quiet[0] -= 1
        if _quiet[0] == 0:
            with _warnings.untouched():
                for entry in [f for f in warnings.filters if f[0] == "ignore"
                              and getattr(f[1], "pattern", None) == GLOBAL_HOOKS_WARNING]:
                    with contextlib.suppress(ValueError):
                        warnings.filters.remove(entry)  # type: ignore[attr-defined]

