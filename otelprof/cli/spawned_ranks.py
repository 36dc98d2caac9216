"""``otelprof run`` and ranks a training process starts itself with multiprocessing: ``torch.multiprocessing.spawn``
(``mp.spawn``) or ``Process(target=...)`` with the spawn or forkserver start method, each child calling
``torch.distributed.init_process_group(backend, rank=..., world_size=...)`` — the shape of PyTorch's DDP examples.

* **The spawner.** The process ``otelprof run`` starts, when no launcher gave it a rank (no ``RANK`` or
  ``WORLD_SIZE``), records as usual and names itself in :data:`SPAWNER` (its pid, run id, recording directory and
  a handover path), which its children inherit. The ``sitecustomize`` of a multiprocessing child that has it wraps
  ``init_process_group`` when the child imports ``torch.distributed`` (nothing else of otelprof is imported).
* **A child becomes a rank** when its ``init_process_group`` returns (:func:`become_rank`): rank and world size
  are the default group's, the local rank is ``LOCAL_RANK`` if the child's environment has it, else the process
  index ``mp.spawn`` passes (the examples' GPU index on the node), else the rank (all ranks on one node). It
  records in the spawner's run like a rank of torchrun and prints nothing; its own children stay helpers.
* **Handover.** The spawner's session holds rank 0's directory, its ``/metrics`` and control ports (local
  rank 0) and the node's sampling, which rank 0 and the local ranks 0 need. A child calling
  ``init_process_group`` first asks the spawner to stand down (``<handover>.request``); the spawner, which watches
  for it once it has started a spawn or forkserver child, discards its session (recording deleted, ports closed,
  PyTorch hooks removed) and answers (``<handover>.done``). The children that need what it held wait for the answer
  (at most :data:`HANDOVER_TIMEOUT`) before they start; the others start at once. The spawner still says the exit
  line at its exit: the run is its children's.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otelprof import environment_variables as ev
from otelprof._log import logger

SPAWNER = ev.OTELPROF_RUN_SPAWNER
REQUEST = ".request"
DONE = ".done"
HANDOVER_TIMEOUT = 5.0
"""Longest wait of rank 0 (and of a local rank 0) for the spawner to stand down; past it the rank starts anyway."""
POLL = 0.05
"""How often the spawner looks for a request, and a waiting rank for the answer (seconds)."""


@dataclass(frozen=True)
class Spawner:
    """What a spawner tells its children (:data:`SPAWNER`, JSON)."""

    pid: int
    run_id: str
    record_dir: str
    job_name: str
    handover: str

    def encode(self) -> str:
        return json.dumps({"pid": self.pid, "run_id": self.run_id, "record_dir": self.record_dir,
                           "job_name": self.job_name, "handover": self.handover})

    @classmethod
    def decode(cls, text: str) -> Spawner | None:
        try:
            data = json.loads(text)
            spawner = cls(int(data["pid"]), str(data["run_id"]), str(data["record_dir"]), str(data["job_name"]),
                          str(data["handover"]))
        except (ValueError, TypeError, KeyError):
            return None
        return spawner if spawner.run_id and spawner.handover else None

    def answered(self) -> bool:
        return os.path.exists(self.handover + DONE)

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except OSError:  # exists, another user's: not ours, but alive
            return True
        return True


def _create(path: str) -> None:
    """An empty file at ``path``, unless something is there (never through a link)."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o600))


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


# ---------------------------------------------------------------------- the spawner
class _Watch:
    """The spawner's side: started at its first spawn or forkserver child."""

    def __init__(self, spawner: Spawner) -> None:
        self.spawner = spawner
        self.started = False
        self.stopped = threading.Event()
        self.lock = threading.Lock()

    def child_starting(self) -> None:
        with self.lock:
            if self.started or os.getpid() != self.spawner.pid:
                return
            self.started = True
        import atexit

        atexit.register(self.clean_up)
        threading.Thread(target=self._run, name="otelprof-spawner", daemon=True).start()

    def _run(self) -> None:
        request = self.spawner.handover + REQUEST
        while not self.stopped.wait(POLL):
            if os.path.exists(request):
                self.stand_down()
                return

    def stand_down(self) -> None:
        """A child became a rank: record nothing here any more (nothing this process recorded is kept)."""
        try:
            import otelprof
            from otelprof.integrations import autoattach
            from otelprof.integrations import torch as otorch

            session = otelprof.get_session()
            if session is not None:
                session.discard()
            otorch.uninstrument()
            autoattach.uninstall()
        except Exception:
            logger.exception("otelprof: internal error while handing the run over to the ranks")
        finally:
            _create(self.spawner.handover + DONE)
            _remove(self.spawner.handover + REQUEST)

    def clean_up(self) -> None:
        self.stopped.set()
        if os.getpid() == self.spawner.pid:
            _remove(self.spawner.handover + REQUEST)
            _remove(self.spawner.handover + DONE)


_watch: list[_Watch] = []


def offer(session: Any) -> None:
    """In the process ``otelprof run`` starts, after ``init()``: let its multiprocessing children become ranks, unless
    a launcher gave it a rank. Its ``otelprof run`` children that are not multiprocessing children are unaffected."""
    from otelprof.runtime.session import Session

    if not isinstance(session, Session) or ev.RANK in os.environ or ev.WORLD_SIZE in os.environ or _watch:
        return
    config = session.config
    handover = os.path.join(tempfile.gettempdir(), f"otelprof-spawner-{os.getpid()}-{secrets.token_hex(8)}")
    spawner = Spawner(os.getpid(), config.run_id, str(Path(config.record_dir).resolve()), config.job_name, handover)
    watch = _Watch(spawner)
    import multiprocessing.spawn as mp_spawn

    original = mp_spawn.get_preparation_data

    def get_preparation_data(name: str) -> dict[str, Any]:
        try:
            watch.child_starting()
        except Exception:  # the child starts regardless; without a watch it waits HANDOVER_TIMEOUT at most
            logger.debug("otelprof: cannot watch for spawned ranks", exc_info=True)
        return original(name)

    mp_spawn.get_preparation_data = get_preparation_data
    _watch.append(watch)
    os.environ[SPAWNER] = spawner.encode()


# ---------------------------------------------------------------------- a child
_became: list[bool] = []


def become_rank() -> None:
    """In a multiprocessing child of a spawner, after its first successful ``init_process_group``: start otelprof as
    that rank, in the spawner's run. Never raises; prints nothing."""
    if _became:
        return
    _became.append(True)
    try:
        spawner = Spawner.decode(os.environ.pop(SPAWNER, ""))  # this process's own children are its helpers
        if spawner is None:
            return
        import torch.distributed as dist

        rank, world_size = dist.get_rank(), dist.get_world_size()
        local_rank = _local_rank(rank)
        if not spawner.answered():
            _create(spawner.handover + REQUEST)  # the sitecustomize asked before init_process_group; if it could not
            if rank == 0 or local_rank == 0:  # what the spawner held: rank 0's directory, local rank 0's ports
                _wait_for(spawner)
        from otelprof.cli import launch

        launch.start(spawned=True, rank=rank, world_size=world_size, local_rank=local_rank,
                     run_id=spawner.run_id, record_dir=spawner.record_dir, job_name=spawner.job_name)
        import multiprocessing.util

        # A multiprocessing child ends through its finalizers (a forkserver child through os._exit, no atexit).
        multiprocessing.util.Finalize(None, launch.finish, exitpriority=-100)
    except Exception as exc:  # the rank trains regardless
        from otelprof import _log

        _log.say(f"otelprof: automatic instrumentation failed: {_log.escape(repr(exc))}\n")


def _wait_for(spawner: Spawner) -> None:
    deadline = time.monotonic() + HANDOVER_TIMEOUT
    while not spawner.answered() and time.monotonic() < deadline and spawner.alive():
        time.sleep(POLL)


def _local_rank(rank: int) -> int:
    """``LOCAL_RANK`` from the environment, else ``mp.spawn``'s process index, else ``rank``."""
    text = os.environ.get(ev.LOCAL_RANK, "").strip()
    if text.isdigit():
        return int(text)
    index = _spawn_index()
    return index if index is not None else rank


def _spawn_index() -> int | None:
    """The ``i`` that ``torch.multiprocessing.spawn`` passes to the function it runs (``fn(i, *args)``), from the
    frame of its ``_wrap`` below this call; None outside ``mp.spawn``."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_wrap" and frame.f_globals.get("__name__") == "torch.multiprocessing.spawn":
            index = frame.f_locals.get("i")
            return index if type(index) is int and index >= 0 else None
        frame = frame.f_back  # type: ignore[assignment]
    return None
