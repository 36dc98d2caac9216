"""Recordings in object storage (``OTELPROF_RECORD_DIR=s3://bucket/prefix``, ``gs://``, ``az://``) via fsspec.

Writing: the recording is written to a local spool directory as usual; a daemon thread uploads it every
``OTELPROF_RECORD_UPLOAD_INTERVAL`` seconds, on SIGTERM and at exit. Object stores cannot append, so each
``*.jsonl`` file goes up as parts: the uploader takes what the file holds over from the writer (a rename under
the writer's lock; the writer goes on with an empty file), keeps it in ``.upload/`` and puts it as
``<file>.parts/<stamp>`` (``stamp``: 20-digit nanoseconds, increasing; the parts' order is the file's order).
A part leaves the disk only once it is stored, so a failed upload is retried as it stands: the same name again,
never a duplicate line. ``manifest.json`` and other files go up whole when they changed. The spool holds at
most ``OTELPROF_RECORD_SPOOL_MAX_BYTES`` of parts not uploaded yet; past that the oldest are deleted and their
lines counted as dropped. Nothing here blocks a step or raises into the job.

Adopting: at start the upload thread looks in the spool for rank folders a previous process left (killed before
it could upload them: their lock is free, :mod:`otelprof.recording.spool`) and uploads them to their own
destination with the same parts, counted in the spool's bound.

Reading: :func:`local_copy` downloads one run (parts joined back into their files) to a temporary directory
the readers take as any local recording.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from otelprof._log import escape, info_once, logger, redact, sanitize, warn_once
from otelprof.recording import schema, spool

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
MERGE_BYTES = 16 * 2**20
"""While the storage is away, a file's new lines join its newest waiting part up to this size (or an eighth of the
spool's bound): an outage leaves a few parts, not one per upload interval."""
PARTS = ".parts"
"""Suffix of the folder of a file's parts: ``steps.jsonl.parts/<stamp>``."""
PENDING = ".upload"
"""Spool folder (in the rank directory) of parts taken over from the writer and not uploaded yet."""
APPENDED = (schema.STEPS, schema.SPANS, schema.METRICS, schema.SAMPLES, schema.PROFILES)
INSTALL_HINT = "pip install 'otelprof[storage]' (fsspec and s3fs; gcsfs or adlfs for gs:// or az://)"


def is_url(text: str) -> bool:
    """Whether ``text`` names object storage (``scheme://...``, not ``file://``) rather than a local path."""
    match = _URL.match(text)
    return match is not None and match.group(1).lower() != "file"


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem and path of ``url`` (a new instance: no listing cached from an earlier call).
    Raises ImportError or ValueError when it cannot be used."""
    import fsspec  # an optional dependency: the storage extra

    fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True)
    _quiet_lost_connections(fs)
    return fs, str(path).rstrip("/")


class _QuietHandler:
    """An event loop's exception handler that drops what a storage outage leaves behind: an async client's task
    that failed on a lost connection and that nobody awaited (asyncio would print each to the training job's
    stderr as "Task exception was never retrieved"). Anything else goes to the handler the loop had, or its
    default."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(self, loop: Any, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), OSError) and "never retrieved" in str(context.get("message", "")):
            return  # a connection error (ConnectionResetError and the client libraries' errors built on OSError)
        if self.previous is not None:
            self.previous(loop, context)
        else:
            loop.default_exception_handler(context)


def _quiet_lost_connections(fs: Any) -> None:
    """On the event loop an async fsspec filesystem runs on (fsspec's own I/O thread), unawaited tasks that
    failed on a lost connection are dropped instead of printed."""
    try:
        loop = fs.loop  # AsyncFileSystem only; RuntimeError in a forked child
    except (AttributeError, RuntimeError):
        return
    if loop is not None and not isinstance(loop.get_exception_handler(), _QuietHandler):
        loop.set_exception_handler(_QuietHandler(loop.get_exception_handler()))


def _problem(url: str) -> str:
    """Why ``url`` cannot be written ("" when it may be): checked at init without importing the storage client."""
    match = _URL.match(url)
    scheme = match.group(1).lower() if match else ""
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:
        return f"needs {INSTALL_HINT}"
    if scheme in registry:
        return ""
    if scheme not in known_implementations:
        return f"cannot be used (fsspec knows no {scheme}:// storage)"
    package = str(known_implementations[scheme]["class"]).split(".")[0]
    if importlib.util.find_spec(package) is None:
        return f"needs the {package} package ({INSTALL_HINT})"
    return ""


def local_root(config: Any) -> Path:
    """Where the recording is written on this machine: ``record_dir``, or the spool when it is a URL."""
    if not is_url(config.record_dir):
        return Path(config.record_dir)
    return Path(config.record_spool_dir or os.path.join(tempfile.gettempdir(), "otelprof-spool"))


def _lines(path: Path) -> int:
    try:
        with open(path, "rb") as handle:
            return sum(block.count(b"\n") for block in iter(lambda: handle.read(1 << 20), b""))
    except OSError:
        return 0


def _append(source: Path, target: Path) -> None:
    """Move what ``source`` holds to the end of ``target`` (both parts of one file; ``source`` goes)."""
    size = _size(target)
    try:
        with open(source, "rb") as taken, open(target, "ab") as part:
            shutil.copyfileobj(taken, part)
        source.unlink()
    except OSError:  # both stay parts, in their order (no line in both)
        with contextlib.suppress(OSError):
            os.truncate(target, size)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class Uploader:
    """Uploads one rank's spooled recording to ``<url>/<run-id>/rank-<rank>/`` on a daemon thread."""

    def __init__(self, url: str, remote_subdir: str, rank_dir: Path, writer: Any, interval: float, max_bytes: int,
                 on_dropped: Callable[[int], None], shown: str, spool_dir: Path | None = None,
                 on_adopted: Callable[[int], None] | None = None) -> None:
        """``spool_dir``: where to look for folders a previous process left (None: nowhere); ``on_adopted(n)``
        is told about their parts once stored."""
        self._url = url
        self._fs: Any = None  # made on first use, off the training thread (the storage client imports slowly)
        self._subdir = remote_subdir
        self._root = ""
        self._remote = ""
        self._dir = rank_dir
        self._pending = rank_dir / PENDING
        self._writer = writer
        self._interval = interval
        self._max_bytes = max_bytes
        self._on_dropped = on_dropped
        self._shown = shown
        self._stamp = 0
        self._sent: dict[str, tuple[int, int]] = {}  # whole files: (mtime_ns, size) last uploaded
        self._failing = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.uploaded_bytes = 0
        self.dropped_lines = 0
        self._spool = spool_dir
        self._on_adopted = on_adopted
        self._orphans: list[spool.Orphan] = []
        self._filesystems: dict[str, tuple[Any, str] | None] = {}
        self._discarded = False
        self.adopted_parts = 0
        self._thread = threading.Thread(target=self._run, name="otelprof-upload", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Upload now (SIGTERM), without waiting."""
        self._wake.set()

    def _run(self) -> None:
        with self._lock:
            spool.record_destination(self._dir, self._url)  # here, not in init(): a step never waits for a file
            self._connect()  # now, not at exit: the interpreter's exit allows no new threads for the client
            try:
                self._adopt()
            except Exception:
                logger.exception("otelprof: internal error while looking for recordings left in the spool")
        if self._orphans and not self._stop.is_set():
            self.sync(final=False)  # at once: a process killed again soon (a crash loop) still moves them on
        while not self._stop.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            self.sync(final=False)
        if self._discarded:
            with self._lock:
                self._release_orphans()

    def close(self, timeout: float) -> bool:
        """Stop the thread and upload everything left (bounded by ``timeout``). True when all is stored; then
        the local spool of this rank is deleted."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        self._wake.set()
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        result: list[bool] = []
        final = threading.Thread(target=lambda: result.append(self.sync(final=True)), name="otelprof-upload-final",
                                 daemon=True)
        final.start()
        final.join(max(deadline - time.monotonic(), 0.0))
        done = bool(result and result[0])
        if done:
            shutil.rmtree(self._dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                self._dir.parent.rmdir()  # the run's spool folder, once no rank of this node is left in it
        elif not result:
            warn_once("recording:upload-exit", "otelprof: the upload of the run recording to %s did not finish "
                      "before the shutdown timeout; what is left stays in %s", self._shown, self._dir)
        return done

    def discard(self) -> None:
        """Stop without uploading more (the session's recording is discarded)."""
        self._discarded = True
        self._stop.set()
        self._wake.set()

    # ------------------------------------------------------------------ one round
    def sync(self, final: bool) -> bool:
        """Take over, bound and upload; True when nothing is left to upload. Never raises."""
        try:
            with self._lock:
                self._take_over(final)
                self._bound()
                done = self._upload()
                if done and self._orphans:
                    self._upload_orphans()
                if final:
                    self._release_orphans()  # what is left waits for the next process
                return done
        except Exception:
            logger.exception("otelprof: internal error while uploading the run recording")
            return False

    def _next_stamp(self) -> str:
        self._stamp = max(self._stamp + 1, time.time_ns())
        return f"{self._stamp:020d}"

    def _take_over(self, final: bool) -> None:
        try:
            self._pending.mkdir(exist_ok=True)
        except OSError:
            return
        parts = self._parts() if self._failing else []
        for name in APPENDED:
            target = self._pending / f"{self._next_stamp()}.{name}"
            if final:  # the writer is closed: its files are ours
                source = self._dir / name
                with contextlib.suppress(OSError):
                    if source.stat().st_size > 0:
                        os.replace(source, target)
                continue
            last = next((p for p in reversed(parts) if p.name.partition(".")[2] == name), None)
            if last is not None and _size(last) < min(MERGE_BYTES, self._max_bytes // 8):
                # the storage is away: what the file got since goes into its newest waiting part, not one more
                # small part every interval (the part keeps its name: stored once the storage is back)
                if self._writer.rotate(name, target):
                    _append(target, last)
            else:
                self._writer.rotate(name, target)

    def _parts(self) -> list[Path]:
        try:
            return sorted(p for p in self._pending.iterdir() if p.is_file())
        except OSError:
            return []

    def _bound(self) -> None:
        parts = sorted(self._parts() + [p for o in self._orphans for p in spool.parts(o)], key=lambda p: p.name)
        sizes = {p: _size(p) for p in parts}
        total = sum(sizes.values())
        for part in parts:
            if total <= self._max_bytes:
                return
            lines = _lines(part)
            with contextlib.suppress(OSError):
                part.unlink()
            total -= sizes[part]
            self.dropped_lines += lines
            self._on_dropped(lines)
            warn_once("recording:spool", "otelprof: the upload spool %s passed OTELPROF_RECORD_SPOOL_MAX_BYTES (%d); "
                      "its oldest parts are deleted and their lines counted as dropped", self._dir, self._max_bytes)

    def _connect(self) -> bool:
        if self._fs is not None:
            return True
        try:
            self._fs, root = filesystem(self._url)
        except Exception as exc:
            warn_once("recording:remote", "otelprof: OTELPROF_RECORD_DIR=%s cannot be used (%s); the recording "
                      "stays in %s", self._shown, sanitize(f"{type(exc).__name__}: {exc}"), self._dir)
            self._stop.set()
            return False
        self._root = root
        self._remote = "/".join(p for p in (root, self._subdir) if p)
        # One request now makes the client's connection pool: at the interpreter's exit (the last upload) the
        # client could not make it any more (it starts a thread for that). Its failure is the next put's to tell.
        with contextlib.suppress(Exception):
            self._fs.exists(self._remote)
        return True

    def _put(self, local: Path, remote: str, fs: Any = None, left_for: str = "") -> bool:
        """Store ``local`` as ``remote``; ``left_for``: the URL of a folder a previous process left (its
        failure is told apart from this process's own)."""
        try:
            (fs or self._fs).put_file(str(local), remote)
        except Exception as exc:  # whatever the storage client raises: the job goes on
            if left_for:
                warn_once("recording:adopt-upload", "otelprof: uploading a recording a previous process left to "
                          "%s failed (%s); it waits in %s and is retried every %g s", sanitize(left_for, 200),
                          sanitize(f"{type(exc).__name__}: {exc}"), escape(str(local.parent)), self._interval)
                return False
            if not self._failing:
                self._failing = True
                warn_once("recording:upload", "otelprof: uploading the run recording to %s failed (%s); it waits "
                          "in %s (at most OTELPROF_RECORD_SPOOL_MAX_BYTES) and is retried every %g s; training "
                          "goes on", self._shown, sanitize(f"{type(exc).__name__}: {exc}"), self._dir,
                          self._interval)
            return False
        if self._failing:
            self._failing = False
            info_once("recording:upload-resumed", "otelprof: uploading the run recording to %s resumed", self._shown)
        return True

    def _upload(self) -> bool:
        if not self._connect():
            return False
        for part in self._parts():
            stamp, _, name = part.name.partition(".")
            size = _size(part)
            if not self._put(part, f"{self._remote}/{name}{PARTS}/{stamp}"):
                return False
            with contextlib.suppress(OSError):
                part.unlink()
            self.uploaded_bytes += size
        try:
            whole = sorted(p for p in self._dir.iterdir() if p.is_file() and p.name not in APPENDED
                           and not p.name.endswith(".tmp") and not p.name.startswith("."))  # not the writer's .lock
        except OSError:
            return False
        # Other files first, the manifest last: a reader that sees the final manifest sees everything.
        whole.sort(key=lambda p: p.name == schema.MANIFEST)
        for path in whole:
            try:
                stat = path.stat()
            except OSError:
                continue
            key = (stat.st_mtime_ns, stat.st_size)
            if self._sent.get(path.name) == key:
                continue
            if not self._put(path, f"{self._remote}/{path.name}"):
                return False
            self._sent[path.name] = key
            self.uploaded_bytes += stat.st_size
        return True

    # ------------------------------------------------------------------ what a previous process left
    def _adopt(self) -> None:
        """Take the spool's orphaned rank folders (bounded), their writers' files made parts; one warning."""
        if self._spool is None:
            return
        found = spool.find(self._spool, self._dir)
        for orphan in found.orphans:
            self._stamp = max(self._stamp, spool.latest_stamp(orphan))
            spool.take_over(orphan, self._next_stamp())
        self._orphans = found.orphans
        for orphan in found.orphans:  # their clients made now: none can be made at the interpreter's exit
            self._orphan_fs(orphan.url)
        count = sum(len(spool.parts(o)) for o in found.orphans)
        self._bound()  # what they hold counts in this process's spool bound from now on
        if count:
            warn_once("recording:adopt", "otelprof: uploading %d parts a previous process left in %s%s", count,
                      escape(str(self._spool)), " (more folders wait for the next start)" if found.truncated else "")
        if found.unknown:
            warn_once("recording:adopt-unknown", "otelprof: %s%s was left by a previous process with no upload "
                      "destination recorded; it stays there", escape(str(found.unknown[0])),
                      f" (and {len(found.unknown) - 1} more folders)" if len(found.unknown) > 1 else "")

    def _orphan_fs(self, url: str) -> tuple[Any, str] | None:
        """The filesystem and root of an orphan's URL (made once; None, one warning, when it cannot be used)."""
        if url != self._url and url == redact(self._url):  # saved without this process's credentials
            url = self._url
        if url == self._url and self._fs is not None:
            return self._fs, self._root
        if url not in self._filesystems:
            problem = _problem(url) if is_url(url) else "is not object storage"
            try:
                if problem:
                    raise ValueError(problem)
                fs, root = self._filesystems[url] = filesystem(url)
                with contextlib.suppress(Exception):  # its connection pool made now, not at the interpreter's exit
                    fs.exists(root)
            except Exception as exc:
                self._filesystems[url] = None
                warn_once("recording:adopt-url", "otelprof: a recording a previous process left for %s stays in the "
                          "spool (%s)", sanitize(url, 200), sanitize(f"{type(exc).__name__}: {exc}"))
        return self._filesystems[url]

    def _upload_orphans(self) -> None:
        """Upload the orphans' parts and files to their own destinations; a finished one is emptied to its
        manifest and released. Stops at the first failed upload (retried next round)."""
        for orphan in list(self._orphans):
            connection = self._orphan_fs(orphan.url)
            if connection is None:
                self._orphans.remove(orphan)
                spool.release(orphan)
                continue
            fs, root = connection
            remote = "/".join(p for p in (root, orphan.subdir) if p)
            for part in spool.parts(orphan):
                if not spool.readable(part):
                    orphan.unreadable.add(part.name)
                    continue
                stamp, _, name = part.name.partition(".")
                size = _size(part)
                if not self._put(part, f"{remote}/{name}{PARTS}/{stamp}", fs, orphan.url):
                    return
                with contextlib.suppress(OSError):
                    part.unlink()
                self.uploaded_bytes += size
                self.adopted_parts += 1
                if self._on_adopted is not None:
                    self._on_adopted(1)
            for path in spool.whole_files(orphan):
                if spool.readable(path) and not self._put(path, f"{remote}/{path.name}", fs, orphan.url):
                    return
            self._orphans.remove(orphan)
            if orphan.unreadable:
                warn_once("recording:adopt-unreadable", "otelprof: %d parts in %s cannot be read; they stay there",
                          len(orphan.unreadable), escape(str(orphan.pending)))
                spool.release(orphan)
            else:
                spool.finish(orphan)

    def _release_orphans(self) -> None:
        for orphan in self._orphans:
            spool.release(orphan)
        self._orphans = []


def start_uploader(config: Any, rank_dir: Path, writer: Any, on_dropped: Callable[[int], None],
                   on_adopted: Callable[[int], None] | None = None) -> Uploader | None:
    """The uploader of ``rank_dir`` to ``config.record_dir`` (a URL), started; None (one warning) when the URL
    cannot be used: the recording stays in the spool. Its thread records the URL in ``rank_dir`` (a process that
    finds the folder orphaned uploads it there) and takes over what previous processes left in the spool."""
    url = config.record_dir
    shown = sanitize(url, 200)
    problem = _problem(url)
    if problem:
        warn_once("recording:remote", "otelprof: OTELPROF_RECORD_DIR=%s %s; the recording stays in %s", shown,
                  problem, rank_dir)
        return None
    uploader = Uploader(url, f"{config.run_id}/{rank_dir.name}", rank_dir, writer, config.record_upload_interval,
                        config.record_spool_max_bytes, on_dropped, shown, local_root(config), on_adopted)
    # Storage clients close their connections from weakref finalizers at exit; registering that exit hook now,
    # before init() registers the session's shutdown, makes the shutdown (and its last upload) run first.
    weakref.finalize(uploader, int)
    uploader.start()
    return uploader


# ---------------------------------------------------------------------- reading

class RemoteError(Exception):
    """A recording URL that cannot be read (one line, for the command's error)."""


def local_copy(url: str) -> Path:
    """Download the run ``url`` names (a rank folder, a run folder, or a folder of runs: its newest) into a
    temporary directory deleted at exit, joining parts back into files; the local run directory."""
    shown = sanitize(url, 200)
    try:
        fs, root = filesystem(url)
    except ImportError as exc:
        raise RemoteError(f"reading {shown} needs {INSTALL_HINT} ({sanitize(str(exc))})") from None
    except Exception as exc:
        raise RemoteError(f"{shown} cannot be used: {sanitize(f'{type(exc).__name__}: {exc}')}") from None
    try:
        listing = fs.find(root, detail=True)
    except Exception as exc:
        raise RemoteError(f"cannot list {shown}: {sanitize(f'{type(exc).__name__}: {exc}')}") from None
    files = {path[len(root):].lstrip("/"): info for path, info in listing.items() if path.startswith(root)}
    run = _pick_run(files)
    if run is None:
        raise RemoteError(f"{shown} is not an otelprof recording (no manifest.json, no rank-*/ folders, no runs "
                          "inside)")
    prefix, name = run
    name = name or root.rsplit("/", 1)[-1]
    dest = Path(tempfile.mkdtemp(prefix="otelprof-remote-"))
    atexit.register(shutil.rmtree, dest, True)
    run_dir = dest / (name or "run")
    try:
        _download(fs, root, prefix, {k[len(prefix):]: v for k, v in files.items() if k.startswith(prefix)}, run_dir)
    except Exception as exc:
        raise RemoteError(f"cannot download {shown}: {sanitize(f'{type(exc).__name__}: {exc}')}") from None
    return run_dir


def _pick_run(files: dict[str, Any]) -> tuple[str, str] | None:
    """(prefix of the run inside the listing, the run's name) — the newest run when the URL holds several."""
    if schema.MANIFEST in files or any(re.fullmatch(r"rank-\d+/" + schema.MANIFEST, k) for k in files):
        return "", ""
    runs: dict[str, float] = {}
    for key, info in files.items():
        match = re.fullmatch(r"([^/]+)/rank-\d+/" + re.escape(schema.MANIFEST), key)
        if match:
            runs[match.group(1)] = max(runs.get(match.group(1), 0.0), _mtime(info))
    if not runs:
        return None
    newest = max(runs, key=lambda r: (runs[r], r))
    return f"{newest}/", newest


def _mtime(info: Any) -> float:
    value = info.get("LastModified") or info.get("mtime") or info.get("updated") or info.get("last_modified")
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _download(fs: Any, root: str, prefix: str, files: dict[str, Any], run_dir: Path) -> None:
    """Fetch every file of the run; ``<file>.parts/<stamp>`` objects are appended to ``<file>`` in stamp order."""
    base = "/".join(p for p in (root, prefix.rstrip("/")) if p)
    for key in sorted(files):
        if files[key].get("type") == "directory":
            continue
        parts = key.split("/")
        if ".." in parts or any(not p for p in parts):
            continue
        if len(parts) >= 2 and parts[-2].endswith(PARTS):
            target = run_dir.joinpath(*parts[:-2], parts[-2][: -len(PARTS)])
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "ab") as out:
                out.write(fs.cat_file(f"{base}/{key}"))
        else:
            target = run_dir.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(f"{base}/{key}", str(target))
