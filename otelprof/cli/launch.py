"""What ``otelprof run`` does inside the program it starts (called by its ``sitecustomize``).

* **Which processes** (decided by the ``sitecustomize``). The process ``otelprof run`` starts, or, when
  that is a launcher (torchrun, ``python -m torch.distributed.run``, ``accelerate launch``, DeepSpeed's),
  the processes the launcher starts, which share one run id (:func:`name_run`). Python processes those
  start in turn (``torch.compile``'s compile workers, data-loader workers, helpers) are not instrumented:
  they would record runs of their own — except the ranks a process starts itself with multiprocessing
  (``mp.spawn``): a child that calls ``init_process_group`` records as that rank in its run, and the process
  that started it stands down (:mod:`otelprof.cli.spawned_ranks`).
* **What.** ``otelprof.init()``, with a stop request ending the program (:mod:`otelprof.runtime._stop_exit`: at the
  next step boundary, with exit status 3); with PyTorch importable, its global hooks
  (:func:`otelprof.integrations.torch.auto_instrument`) and the trainer callbacks
  (:mod:`otelprof.integrations.autoattach`).
* **What it says.** On rank 0 only (for ranks started with multiprocessing: the process that started them),
  one line to stderr at the start (the run id and where the recording goes) and one at the exit (the report
  command); nothing with ``OTELPROF_QUIET=true`` (``otelprof run --quiet``).

Never stops the program: a failure is one line on stderr and the program runs uninstrumented.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from otelprof import _log

RUN_TORCH = "OTELPROF_RUN_TORCH"
RUN_GRAD_NORM = "OTELPROF_RUN_GRAD_NORM"

_exit: tuple[str, Path, int, bool] | None = None
"""The exit line, the recording it names (said only if it is there) and the process that says it (not a forked
child, which inherits the exit handlers); last, whether the recording is to be there: not when it was uploaded
(object storage), the line is said only once the local spool is empty."""


def name_run() -> None:
    """In a launcher: one run id for the processes it starts, unless the user or torchrun gives one."""
    from otelprof import environment_variables as ev
    from otelprof.runtime.session import new_run_id

    if not os.environ.get(ev.OTELPROF_RUN_ID) and not os.environ.get(ev.OTELPROF_RUN_LAUNCH_ID):
        os.environ[ev.OTELPROF_RUN_LAUNCH_ID] = new_run_id()


def start(spawned: bool = False, on_hooked: Callable[[Any], None] | None = None, **overrides: Any) -> None:
    """Start otelprof (``overrides`` go to ``init()``) and hook PyTorch and the trainers. Never raises.
    ``spawned``: this is a rank its spawner started (:mod:`otelprof.cli.spawned_ranks`), which speaks for the run.
    ``on_hooked``: called with the session once PyTorch is hooked (the ``sitecustomize`` passes
    :func:`otelprof.cli.spawned_ranks.offer`)."""
    try:
        import otelprof

        if not spawned:
            atexit.register(_say_exit)  # before init(): runs after the session's shutdown
        session = otelprof.init(**overrides)
        _exit_on_stop(session)
        if not spawned:
            _announce(session)
        if os.environ.get(RUN_TORCH, "1") != "0":
            try:
                import torch  # noqa: F401
            except ImportError:
                return
            from otelprof.integrations import autoattach
            from otelprof.integrations.torch import auto_instrument

            auto_instrument(grad_norm=os.environ.get(RUN_GRAD_NORM) == "1")
            autoattach.install()
            if on_hooked is not None:
                on_hooked(session)
    except Exception as exc:  # the training program must start regardless
        _log.say(f"otelprof: automatic instrumentation failed: {_log.escape(repr(exc))}\n")


def _exit_on_stop(session: object) -> None:
    """A stop request ends the program (:mod:`otelprof.runtime._stop_exit`): it was not written to ask for one."""
    from otelprof.runtime.session import Session

    if isinstance(session, Session):  # not when disabled (OTEL_SDK_DISABLED)
        session._exit_on_stop(before_exit=_say_exit)


def finish() -> None:
    """End the step still open and shut otelprof down (a multiprocessing child's last finalizer)."""
    try:
        import otelprof
        from otelprof.integrations import torch as otorch

        otorch._end_open_steps()
        otelprof.shutdown()
    except Exception as exc:
        _log.say(f"otelprof: shutting down failed: {_log.escape(repr(exc))}\n")


def shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it, else absolute."""
    absolute = path.resolve()
    try:
        return str(absolute.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(absolute)


def _announce(session: object) -> None:
    global _exit
    from otelprof.runtime.session import Session

    if not isinstance(session, Session):  # disabled (OTEL_SDK_DISABLED)
        return
    config = session.config
    if config.quiet or config.rank != 0:
        return
    if session.run_dir is None:
        _log.say(f"otelprof: run {_log.escape(config.run_id)}, not recorded locally (OTELPROF_RECORD=false)\n")
        return
    run = session.run_dir.parent
    where, run_id = _log.escape(shown(run)), _log.escape(config.run_id)
    from otelprof.recording import remote

    if remote.is_url(config.record_dir):  # the spool is deleted once the upload is complete
        url = _log.escape(f"{config.record_dir.rstrip('/')}/{config.run_id}")
        _log.say(f"otelprof: recording run {run_id} to {url} (spooled in {where})\n")
        _exit = (f"otelprof: run {run_id} uploaded; report: otelprof report {url}\n", run.resolve(), os.getpid(), False)
        return
    _log.say(f"otelprof: recording run {run_id} to {where}\n")
    _exit = (f"otelprof: run {run_id} recorded; report: otelprof report {where}\n", run.resolve(), os.getpid(), True)


def _say_exit() -> None:
    if _exit is None or _exit[2] != os.getpid() or any(_exit[1].glob("rank-*/manifest.json")) != _exit[3]:
        return  # a local recording is there; an uploaded one is no longer in the spool
    _log.say(_exit[0])
