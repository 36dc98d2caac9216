"""Loaded by ``otelprof run`` through PYTHONPATH: start otelprof (:mod:`otelprof.launch`) in the training
process, then hand over to any other ``sitecustomize`` further down the path. Imports nothing of otelprof in
other processes. Never stops the program from starting.

``OTELPROF_RUN=1`` (set by ``otelprof run``): start here, unless this is a launcher (torchrun and the like:
the processes it starts are the training processes; it names their run) or a multiprocessing helper. A
process that starts sets it to ``started``, so the Python processes it starts in turn (compile workers,
data-loader workers, helpers) record nothing."""

import os
import sys

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


def _start(role: str) -> None:
    try:
        from otelprof import launch

        if role == "training":
            launch.start()
        else:
            launch.name_run()
    except Exception as exc:  # the training program must start regardless
        sys.stderr.write(f"otelprof: automatic instrumentation failed: {exc!r}\n")


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
                    sys.stderr.write(f"otelprof: the original sitecustomize failed: {exc!r}\n")
            return


if os.environ.get("OTELPROF_RUN") == "1":
    _ROLE = _role(list(getattr(sys, "orig_argv", sys.argv)))
    if _ROLE == "training":
        os.environ["OTELPROF_RUN"] = "started"
    if _ROLE != "helper":
        _start(_ROLE)
_chain()
