"""Loaded by ``otelprof run`` through PYTHONPATH: start otelprof (:mod:`otelprof.cli.launch`) in the training
process, then hand over to any other ``sitecustomize`` further down the path. Imports nothing of otelprof in
other processes. Never stops the program from starting.

``OTELPROF_RUN=1`` (set by ``otelprof run``): start here, unless this is a launcher (torchrun and the like:
the processes it starts are the training processes; it names their run) or a multiprocessing helper. A
process that starts sets it to ``started``, so the Python processes it starts in turn (compile workers,
data-loader workers, helpers) record nothing.

A multiprocessing child of a process that started, when that one offers its children to become ranks
(``OTELPROF_RUN_SPAWNER``, :mod:`otelprof.cli.spawned_ranks`): when the program imports ``torch.distributed``, its
``init_process_group`` is wrapped; the child becomes that rank when the call returns. Until then nothing of
otelprof is imported."""

from __future__ import annotations

import contextlib
import os
import sys

TYPE_CHECKING = False  # no typing import: this module runs in every Python process of `otelprof run`
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

def _say(line: str) -> None:
    """One line to stderr, escaped; never raises (stderr may be closed, full or a pipe nobody reads) and never
    leaves the line in Python's buffer, where it would fail again at the exit."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in line[:500]) + "\n"
    stream = sys.stderr
    if stream is None:  # fd 2 closed
        return
    with contextlib.suppress(Exception):
        stream.flush()
    with contextlib.suppress(Exception):
        os.write(stream.fileno(), text.encode("utf-8", "backslashreplace"))


LAUNCHERS = frozenset({
    "torchrun", "torch.distributed.run", "torch.distributed.launch", "accelerate", "accelerate.commands.launch",
    "accelerate.commands.accelerate_cli", "deepspeed", "deepspeed.launcher.runner", "deepspeed.launcher.launch",
})
"""Programs and ``-m`` modules that start the training processes rather than train."""


def _program(argv: list[str]) -> str:
    """The script, ``-m`` module or ``-c`` that ``argv`` (``sys.orig_argv``: the interpreter, its options, then
    the program and its arguments) runs."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-m", "-c"):
            return argv[i + 1] if arg == "-m" and i + 1 < len(argv) else arg
        if not arg.startswith("-"):
            return arg
        i += 2 if arg in ("-W", "-X", "--check-hash-based-pycs") else 1
    return ""


def _role(argv: list[str]) -> str:
    """``launcher``, ``helper`` (a multiprocessing child) or ``training``."""
    program = _program(argv)
    text = " ".join(argv)
    if "--multiprocessing-fork" in text or (program == "-c" and "multiprocessing" in text):
        return "helper"
    name = os.path.basename(program)
    if program in LAUNCHERS or name in LAUNCHERS:
        return "launcher"
    return "training"


SPAWNER = "OTELPROF_RUN_SPAWNER"
C10D = "torch.distributed.distributed_c10d"
"""The module that defines ``init_process_group`` (``torch.distributed`` re-exports it)."""


def _armed(role: str, env: Mapping[str, str]) -> bool:
    """Whether this process may become a rank: a multiprocessing child of a process that offers it."""
    return role == "helper" and env.get("OTELPROF_RUN") == "started" and bool(env.get(SPAWNER))


def _ask_spawner() -> None:
    """Ask the spawner to stand down (see otelprof.cli.spawned_ranks) unless it has; never raises."""
    try:
        import json

        handover = json.loads(os.environ.get(SPAWNER, ""))["handover"]
        if not os.path.exists(handover + ".done"):
            flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0)
            os.close(os.open(handover + ".request", flags, 0o600))
    except Exception:  # asked already, or no spawner: otelprof.cli.spawned_ranks tries again
        pass


def _wrap_init(module: Any) -> None:
    import functools

    original = getattr(module, "init_process_group", None)
    if not callable(original) or getattr(original, "_otelprof_rank", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if os.environ.get(SPAWNER):
            _ask_spawner()
        result = original(*args, **kwargs)
        if os.environ.get(SPAWNER):
            try:
                from otelprof.cli import spawned_ranks

                spawned_ranks.become_rank()
            except Exception as exc:  # the rank trains regardless
                _say(f"otelprof: automatic instrumentation failed: {exc!r}")
        return result

    init_process_group._otelprof_rank = True  # type: ignore[attr-defined]
    module.init_process_group = init_process_group


class _C10dLoader:
    """The module's own loader, then :func:`_wrap_init`."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: Any) -> None:
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:  # the module keeps its own loader
            spec.loader = self._loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        self._loader.exec_module(module)
        import contextlib

        with contextlib.suppress(Exception):  # torch.distributed stays as it is
            _wrap_init(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _C10dFinder:
    """Finds :data:`C10D` through the other finders and wraps its loader; ignores every other module."""

    _otelprof_c10d = True

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != C10D:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if getattr(finder, "_otelprof_c10d", False) or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _C10dLoader(spec.loader)
                return spec
        return None

    def invalidate_caches(self) -> None:
        pass


def _arm() -> None:
    if not any(getattr(finder, "_otelprof_c10d", False) for finder in sys.meta_path):
        sys.meta_path.insert(0, _C10dFinder())  # type: ignore[arg-type]


def _start(role: str) -> None:
    try:
        from otelprof.cli import launch

        if role == "training":
            from otelprof.cli import spawned_ranks

            launch.start(on_hooked=spawned_ranks.offer)
        else:
            launch.name_run()
    except Exception as exc:  # the training program must start regardless
        _say(f"otelprof: automatic instrumentation failed: {exc!r}")


def _chain() -> None:
    """Run the next sitecustomize on sys.path, the one ours shadows."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_otelprof_next_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                try:
                    spec.loader.exec_module(importlib.util.module_from_spec(spec))
                except Exception as exc:
                    _say(f"otelprof: the original sitecustomize failed: {exc!r}")
            return


if os.environ.get("OTELPROF_RUN") == "1":
    _ROLE = _role(list(getattr(sys, "orig_argv", sys.argv)))
    if _ROLE == "training":
        os.environ["OTELPROF_RUN"] = "started"
    if _ROLE != "helper":
        _start(_ROLE)
elif os.environ.get(SPAWNER) and _armed(_role(list(getattr(sys, "orig_argv", sys.argv))), os.environ):
    _arm()
_chain()
