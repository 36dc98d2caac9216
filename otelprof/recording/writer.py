"""Writes one rank's run recording. Never raises: a full disk costs records, not the job."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from otelprof import semconv as sc
from otelprof._log import escape, warn_once
from otelprof.recording import schema
from otelprof.recording.sample_blocks import SampleBlock

_encode = json.JSONEncoder(separators=(",", ":"), check_circular=False, default=str).encode

LOCK = ".lock"
"""File in a rank directory that the process recording it holds an exclusive ``flock`` on while it runs."""
MAX_ATTEMPTS = 100
"""Run ids tried (``<run id>``, ``<run id>-2``, ...) before a process records where it was told to anyway."""
_held: list[int] = []
"""Lock descriptors this process holds; a forked child closes its copies (the parent keeps the locks)."""
_fork_hook: list[bool] = []


def claim(record_dir: Path, run_id: str, rank: int, pid: int, started: float) -> tuple[str, int | None]:
    """The run id this process records rank ``rank`` under, and the locked descriptor that keeps it: ``run_id``,
    unless another live process holds that rank's directory (two jobs given one run id: a fixed rendezvous id, a
    reused job id) or an earlier process recorded it (a restart); then the first free ``<run_id>-<n>`` (n = 2, 3,
    ...), so the ranks of one job that collides land together in the same new run. ``pid`` and ``started`` (its
    start time, Unix seconds) name this process: a restarted container's process may have the same pid. Never
    raises: when the directory cannot be made, the writer says so."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        candidate = run_id if attempt == 1 else f"{run_id}-{attempt}"
        directory = record_dir / candidate / schema.rank_dir_name(rank)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return run_id, None
        if not _lock(fd) or _recorded_by_another(directory, pid, started):
            os.close(fd)
            continue
        if not _fork_hook and hasattr(os, "register_at_fork"):  # installed at the first lock, not at import
            os.register_at_fork(after_in_child=_forget_locks)
            _fork_hook.append(True)
        _held.append(fd)
        return candidate, fd
    return run_id, None


def _lock(fd: int) -> bool:
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the manifest check alone
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _recorded_by_another(directory: Path, pid: int, started: float) -> bool:
    """Whether ``directory`` holds the manifest of a process other than process ``pid`` started at ``started``."""
    try:
        with open(directory / schema.MANIFEST, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    if not isinstance(manifest, dict) or not isinstance(manifest.get("resource"), dict):
        return True
    lifecycle = manifest.get("lifecycle")
    began = lifecycle.get("process_start") if isinstance(lifecycle, dict) else None
    return manifest["resource"].get(sc.PROCESS_PID) != pid or (
        isinstance(began, int | float) and abs(began - started) > 1.0)


def _release(fd: int | None) -> None:
    """Unlock, then close: a child forked meanwhile shares the lock until it closes its copy (its fork hook runs
    only once the child is scheduled, late on a loaded machine); unlocking releases it for both."""
    if fd is not None and fd in _held:
        _held.remove(fd)
        with contextlib.suppress(OSError, ImportError):
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(fd)


def _forget_locks() -> None:
    for fd in _held:
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()



class RecordingWriter:
    """Buffers lines per file and appends them on :meth:`flush` (called every flush interval).

    ``on_dropped(n)`` is told about lines that could not be written, ``on_written(bytes)``
    about bytes that were."""

    def __init__(
        self,
        directory: Path,
        manifest: dict[str, Any],
        on_dropped: Callable[[int], None],
        on_written: Callable[[int], None],
        lock: int | None = None,
    ) -> None:
        """``lock``: the descriptor :func:`claim` locked, released when the writer closes."""
        self.directory = directory
        self._lock_fd = lock
        self.manifest = manifest
        self._on_dropped = on_dropped
        self._on_written = on_written
        self._buffers: dict[str, list[str]] = {name: [] for name in (schema.STEPS, schema.SPANS, schema.METRICS,
                                                                      schema.SAMPLES, schema.PROFILES)}
        self._files: dict[str, IO[str]] = {}
        self._samples = SampleBlock()
        self._lock = threading.RLock()  # re-entrant: a SIGTERM flush may interrupt a flush
        self._ok = self._open()

    def _open(self) -> bool:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._write_manifest()
            for name in self._buffers:
                self._files[name] = open(self.directory / name, "a", encoding="utf-8")  # noqa: SIM115
            return True
        except OSError as exc:
            warn_once("recording:open", "otelprof: cannot write the run recording in %s (%s); "
                      "training goes on without it", escape(str(self.directory)), escape(str(exc)))
            return False

    def add(self, file: str, line: str) -> None:
        """Queue one line for ``file`` (a schema file name)."""
        self._buffers[file].append(line)

    def add_json(self, file: str, record: dict[str, Any]) -> None:
        self._buffers[file].append(_encode(record))

    def add_sample(self, sample: dict[str, Any]) -> None:
        """Queue one sample for samples.jsonl, written in a block (:mod:`otelprof.recording.sample_blocks`)."""
        with self._lock:
            try:
                block = self._samples.add(sample, time.monotonic())
            except (TypeError, ValueError, OverflowError, AttributeError, KeyError):
                self._on_dropped(1)  # not the sampler's numbers: the sample, not the block, is lost
                return
            if block is not None:
                self._buffers[schema.SAMPLES].append(_encode(block))

    def flush(self, complete: bool = True) -> None:
        """Append buffered lines to disk. Lines that cannot be written are dropped and counted. ``complete=False``
        (the periodic flush) keeps the samples of a block that is neither full nor old."""
        with self._lock:
            if complete or self._samples.due(time.monotonic()):
                block = self._samples.take()
                if block is not None:
                    self._buffers[schema.SAMPLES].append(_encode(block))
            for name, lines in self._buffers.items():
                if not lines:
                    continue
                batch = lines[:]
                lines.clear()
                if not self._ok:
                    self._on_dropped(len(batch))
                    continue
                text = "\n".join(batch) + "\n"
                try:
                    handle = self._files[name]
                    handle.write(text)
                    handle.flush()
                except (OSError, ValueError) as exc:
                    self._on_dropped(len(batch))
                    warn_once("recording:write", "otelprof: writing the run recording failed (%s); "
                              "records are dropped and counted, training goes on", exc)
                    continue
                self._on_written(len(text.encode("utf-8")))

    def update_manifest(self, **changes: Any) -> None:
        """Merge ``changes`` into the manifest and rewrite it atomically."""
        with self._lock:
            self.manifest.update(changes)
            if not self._ok:
                return
            try:
                self._write_manifest()
            except OSError as exc:
                warn_once("recording:manifest", "otelprof: cannot update %s (%s)", schema.MANIFEST, exc)

    def _write_manifest(self) -> None:
        path = self.directory / schema.MANIFEST
        tmp = path.with_suffix(".json.tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(self.manifest, handle, indent=2, sort_keys=True, default=str)
            handle.write("\n")
        os.replace(tmp, path)

    def remove(self, pid: int) -> None:
        """Close without writing what is buffered and delete the directory — unless the manifest there now is
        not the one of process ``pid`` (another process recording as the same rank took the directory over)."""
        with self._lock:
            for lines in self._buffers.values():
                lines.clear()
            self._samples.take()
            for handle in self._files.values():
                with contextlib.suppress(OSError):
                    handle.close()
            self._files.clear()
            self._ok = False
            _release(self._lock_fd)
            self._lock_fd = None
            try:
                with open(self.directory / schema.MANIFEST, encoding="utf-8") as handle:
                    manifest = json.load(handle)
                if manifest.get("resource", {}).get(sc.PROCESS_PID) != pid:
                    return
            except (OSError, ValueError, AttributeError):
                return
            shutil.rmtree(self.directory, ignore_errors=True)

    def rotate(self, name: str, target: Path) -> bool:
        """Move what file ``name`` holds to ``target`` and go on appending to an empty file (the uploader's
        hand-over, :mod:`otelprof.recording.remote`); False when there was nothing to move or it failed."""
        with self._lock:
            if not self._ok or name not in self._files:
                return False
            path = self.directory / name
            try:
                if path.stat().st_size == 0:
                    return False
            except OSError:
                return False
            with contextlib.suppress(OSError):
                self._files[name].close()
            try:
                os.replace(path, target)
                moved = True
            except OSError:
                moved = False
            try:
                self._files[name] = open(path, "a", encoding="utf-8")  # noqa: SIM115
            except OSError as exc:
                self._ok = False
                warn_once("recording:open", "otelprof: cannot write the run recording in %s (%s); "
                          "training goes on without it", self.directory, exc)
            return moved

    def close(self, keep_lock: bool = False) -> None:
        """Flush and close the files; ``keep_lock``: the folder stays claimed until :meth:`release_lock` (its
        last upload still runs)."""
        self.flush()
        with self._lock:
            for handle in self._files.values():
                with contextlib.suppress(OSError):
                    handle.close()
            self._files.clear()
            self._ok = False
            if not keep_lock:
                self.release_lock()

    def release_lock(self) -> None:
        """Let another process take the folder (a restart uploads what is left in it)."""
        with self._lock:
            _release(self._lock_fd)
            self._lock_fd = None
