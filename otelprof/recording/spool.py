"""Rank folders a previous process left in the upload spool, found and taken over for upload.

Each uploading process holds an exclusive ``flock`` on its rank folder's ``.lock`` for its lifetime (the
writer's claim, kept until its last upload); the kernel releases it however the process ends (SIGKILL, the OOM
killer). A rank folder is therefore an orphan exactly when that lock can be taken: never judged by pid (pids are
reused; the other ranks of a pod run beside it in the same spool). Its upload destination is the URL its owner
recorded in ``.destination.json``; a folder without one is left alone. A folder without a manifest is not even
locked: a process claims its folder (takes the lock) before it writes its manifest, so the search never makes a
starting rank's claim fail.

Walking the spool never follows a symbolic link: only real directories below the spool are entered and only
regular files are taken, so hostile contents (a file where a folder belongs, a link out of the spool, a FIFO)
are passed over. Everything is bounded: at most :data:`MAX_FOLDERS` folders taken per start, at most
:data:`MAX_ENTRIES` directory entries looked at, within :data:`MAX_SECONDS`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from otelprof._log import redact
from otelprof.recording import schema

LOCK = ".lock"
"""The rank folder's lock file (the writer's: :data:`otelprof.recording.writer.LOCK`)."""
DESTINATION = ".destination.json"
"""In a rank folder: ``{"url": ...}``, where its owner uploads it (``<url>/<run-id>/rank-<rank>/``)."""
UPLOADED = ".uploaded"
"""In a rank folder an adopter finished: everything is stored; only the manifest (and the lock) stay, so that a
restart of that rank still sees the run was recorded and records as ``<run-id>-2``."""
PENDING = ".upload"
TRASH = ".otelprof-trash-"
"""Prefix of a spool entry being deleted."""
MAX_FOLDERS = 32
"""Orphaned rank folders taken per start."""
MAX_ENTRIES = 4096
"""Spool directory entries looked at per start."""
MAX_SECONDS = 10.0
"""Time the search for orphans may take per start (on the upload thread)."""
MAX_DESTINATION_BYTES = 4096
APPENDED = (schema.STEPS, schema.SPANS, schema.METRICS, schema.SAMPLES, schema.PROFILES)
PART_NAME = re.compile(r"(\d{20})\.(" + "|".join(re.escape(n) for n in APPENDED) + r")")
_RANK = re.compile(r"rank-\d{1,9}")
_KEPT = frozenset({schema.MANIFEST, LOCK, DESTINATION, UPLOADED})
_held: set[int] = set()
"""Lock descriptors of folders this process took; a forked child (a DataLoader worker) closes its copies, so
that the lock ends with this process and not with its longest-lived child."""
_fork_hook: list[bool] = []


@dataclass
class Orphan:
    """A rank folder this process took over: it holds the folder's lock until :func:`finish` or :func:`release`."""

    directory: Path
    url: str
    subdir: str
    """``<run-id>/rank-<rank>``: the same below the spool and below the URL."""
    fd: int
    unreadable: set[str] = field(default_factory=set)

    @property
    def pending(self) -> Path:
        return self.directory / PENDING


@dataclass
class Found:
    orphans: list[Orphan] = field(default_factory=list)
    unknown: list[Path] = field(default_factory=list)
    """Orphans without a recorded destination: left alone."""
    truncated: bool = False
    """The search stopped at a bound; more may be there."""


def record_destination(rank_dir: Path, url: str) -> None:
    """Write where ``rank_dir`` goes (atomically); a folder whose owner died is uploaded there. Never raises."""
    tmp = rank_dir / (DESTINATION + ".tmp")
    with contextlib.suppress(OSError):  # credentials in the URL are not saved: an adopter supplies its own
        tmp.write_text(json.dumps({"url": redact(url)}) + "\n", encoding="utf-8")
        os.replace(tmp, rank_dir / DESTINATION)


class _Budget:
    def __init__(self, entries: int, seconds: float) -> None:
        self.entries = entries
        self.deadline = time.monotonic() + seconds

    def spend(self) -> bool:
        """Look at one more entry: False once the bound is reached."""
        self.entries -= 1
        return self.entries >= 0 and time.monotonic() <= self.deadline


def _real_dirs(directory: Path, budget: _Budget, found: Found) -> Iterator[os.DirEntry[str]]:
    """The entries of ``directory`` that are directories, not links (none when it cannot be listed)."""
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if not budget.spend():
                    found.truncated = True
                    return
                if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
                    yield entry
    except OSError:
        return


def _lock(directory: Path) -> int | None:
    """An exclusive lock on ``directory``'s lock file, or None when a live process holds it (or it is no regular
    file, or it was replaced while we locked it: a finished adopter deleted the folder)."""
    try:
        import fcntl
    except ImportError:  # no flock: ownership cannot be told, nothing is adopted
        return None
    path = directory / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0),
                     0o644)
    except OSError:
        return None
    try:
        held = os.fstat(fd)
        if not stat.S_ISREG(held.st_mode):
            raise OSError("not a regular file")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        now = os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            raise OSError("replaced")
    except OSError:
        os.close(fd)
        return None
    if not _fork_hook and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget)
        _fork_hook.append(True)
    _held.add(fd)
    return fd


def _unlock(fd: int) -> None:
    """Unlock, then close: a child forked meanwhile shares the lock until its fork hook closes its copy."""
    _held.discard(fd)
    with contextlib.suppress(OSError, ImportError):
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_UN)
    with contextlib.suppress(OSError):
        os.close(fd)


def _forget() -> None:
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


def _destination(directory: Path) -> str | None:
    try:
        fd = os.open(directory / DESTINATION, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = json.loads(os.read(fd, MAX_DESTINATION_BYTES).decode("utf-8"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    url = data.get("url") if isinstance(data, dict) else None
    return url if isinstance(url, str) and url else None


def _inside(directory: Path, root: str) -> bool:
    return os.path.realpath(directory).startswith(root + os.sep)


def find(spool: Path, own: Path, max_folders: int = MAX_FOLDERS, max_entries: int = MAX_ENTRIES,
         max_seconds: float = MAX_SECONDS) -> Found:
    """Orphaned rank folders in ``spool`` (not ``own``), each locked; finished ones (:data:`UPLOADED`) are
    cleaned up on the way. Never raises."""
    found = Found()
    budget = _Budget(max_entries, max_seconds)
    try:
        root = os.path.realpath(spool)
    except (OSError, ValueError):
        return found
    _empty_trash(spool)
    for run in _real_dirs(spool, budget, found):
        for rank in _real_dirs(Path(run.path), budget, found):
            if len(found.orphans) >= max_folders:
                found.truncated = True
                return found
            directory = Path(rank.path)
            if not _RANK.fullmatch(rank.name) or directory == own or not _inside(directory, root):
                continue
            if not os.path.lexists(directory / schema.MANIFEST):
                continue  # being claimed (the manifest comes after the lock), or never recorded: not locked
            fd = _lock(directory)
            if fd is None:
                continue
            if os.path.lexists(directory / UPLOADED):
                _clean(directory)  # an adopter ended between marking it and cleaning it
                _unlock(fd)
                continue
            url = _destination(directory)
            if url is None:
                _unlock(fd)
                found.unknown.append(directory)
                continue
            found.orphans.append(Orphan(directory, url, f"{run.name}/{rank.name}", fd))
        if found.truncated:
            break
    return found


def take_over(orphan: Orphan, next_stamp: str) -> None:
    """Move what the dead writer's files hold into parts (after every part it left: ``next_stamp`` is later)."""
    with contextlib.suppress(OSError):
        os.mkdir(orphan.pending)
    for name in APPENDED:
        source = orphan.directory / name
        try:
            info = os.stat(source, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_size > 0:
            with contextlib.suppress(OSError):
                os.replace(source, orphan.pending / f"{next_stamp}.{name}")


def latest_stamp(orphan: Orphan) -> int:
    return max((int(p.name[:20]) for p in parts(orphan)), default=0)


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path, follow_symlinks=False).st_mode)
    except OSError:
        return False


def parts(orphan: Orphan) -> list[Path]:
    """The orphan's parts waiting for upload, oldest first: regular files named as parts (not links, not
    those that could not be read)."""
    if not stat.S_ISDIR(_mode(orphan.pending)):
        return []
    try:
        names = sorted(n for n in os.listdir(orphan.pending) if PART_NAME.fullmatch(n)
                       and n not in orphan.unreadable)
    except OSError:
        return []
    return [orphan.pending / n for n in names if _regular(orphan.pending / n)]


def whole_files(orphan: Orphan) -> list[Path]:
    """The orphan's other files (manifest last): regular, not hidden, not a temporary or a growing file."""
    try:
        names = sorted(n for n in os.listdir(orphan.directory) if not n.startswith(".") and not n.endswith(".tmp")
                       and n not in APPENDED)
    except OSError:
        return []
    names.sort(key=lambda n: n == schema.MANIFEST)
    return [orphan.directory / n for n in names if _regular(orphan.directory / n)]


def readable(path: Path) -> bool:
    """Whether ``path`` (a regular file, not a link) can be opened for reading."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    os.close(fd)
    return True


def _mode(path: Path) -> int:
    try:
        return os.stat(path, follow_symlinks=False).st_mode
    except OSError:
        return 0


def finish(orphan: Orphan) -> None:
    """Everything is stored: mark the folder, delete all but its manifest, release it."""
    with contextlib.suppress(OSError):
        (orphan.directory / UPLOADED).touch()
        _clean(orphan.directory)
    release(orphan)


def release(orphan: Orphan) -> None:
    if orphan.fd >= 0:
        _unlock(orphan.fd)
        orphan.fd = -1


def _clean(directory: Path) -> None:
    """Delete all of ``directory`` but :data:`_KEPT` (links are removed, never followed)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name in _KEPT:
            continue
        path = directory / name
        if stat.S_ISDIR(_mode(path)):
            trash = directory.parent.parent / f"{TRASH}{secrets.token_hex(6)}"
            try:
                os.replace(path, trash)  # away first: nothing else finds a half-deleted folder
            except OSError:
                trash = path
            shutil.rmtree(trash, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _empty_trash(spool: Path) -> None:
    """Delete what an adopter killed while deleting left (bounded by the spool's first entries)."""
    try:
        with os.scandir(spool) as entries:
            trash = [e.path for _, e in zip(range(MAX_ENTRIES), entries) if e.name.startswith(TRASH)]
    except OSError:
        return
    for path in trash:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
