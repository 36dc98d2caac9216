"""Recordings in object storage (``OTELPROF_RECORD_DIR=s3://bucket/prefix``, ``gs://``, ``az://``) via fsspec.

Writing: the recording is written to a local spool directory as usual; a daemon thread uploads it every
``OTELPROF_RECORD_UPLOAD_INTERVAL`` seconds, on SIGTERM and at exit. Object stores cannot append, so each
``*.jsonl`` file goes up as parts: the uploader takes what the file holds over from the writer (a rename under
the writer's lock; the writer goes on with an empty file), keeps it in ``.upload/`` and puts it as
``<file>.parts/<stamp>`` (``stamp``: 20-digit nanoseconds, increasing; the parts' order is the file's order).
A part leaves the disk only once it is stored, so a failed upload is retried as it stands: the same name again,
never a duplicate line. ``manifest.json`` and other files go up whole when they changed. The spool holds at
most ``OTELPROF_RECORD_SPOOL_MAX_BYTES`` of parts not uploaded yet; past that the oldest are deleted and their
lines counted as dropped, whatever the store does: each storage call runs on a thread of its own with a
deadline, and while it waits the writer's files are still taken over and the bound kept every interval. Each
request has the connect and read timeouts of ``OTELPROF_STORAGE_TIMEOUT_SECONDS`` and at most :data:`ATTEMPTS`
attempts. Nothing here blocks a step or raises into the job.

Adopting: at start the upload thread looks in the spool for rank folders a previous process left (killed before
it could upload them: their lock is free, :mod:`otelprof.recording.spool`) and uploads them to their own
destination with the same parts, counted in the spool's bound.

Reading: :func:`local_copy` downloads one run (parts joined back into their files, in ranges of :data:`CHUNK`
bytes) to a temporary directory the readers take as any local recording; an object name that would leave that
directory (a ``.`` or ``..`` component) refuses the run.
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
TIMEOUT = 10.0
"""Default of ``OTELPROF_STORAGE_TIMEOUT_SECONDS``: the connect and the read timeout of each request."""
ATTEMPTS = 2
"""Attempts of each request to S3 (botocore's ``total_max_attempts``; s3fs's own retry loop is off): an upload
that failed is tried again at the next round anyway."""
CHUNK = 8 * 2**20
"""A download is read in ranges of this many bytes, each written to the local file as it comes."""
MIN_RATE = 256 * 2**10
"""Bytes a second a transfer must move on average: its deadline grows by its size over this."""
LISTING = 10
"""A listing (many requests: one per 1000 objects) has this many storage timeouts to finish."""


def deadline(timeout: float, size: int = 0) -> float:
    """Seconds one storage call may take: its attempts (and the client's back-off between them), and for a
    transfer of ``size`` bytes the time it takes at :data:`MIN_RATE`."""
    return timeout * (ATTEMPTS + 1) + size / MIN_RATE


def is_url(text: str) -> bool:
    """Whether ``text`` names object storage (``scheme://...``, not ``file://``) rather than a local path."""
    match = _URL.match(text)
    return match is not None and match.group(1).lower() != "file"


def filesystem(url: str, timeout: float = TIMEOUT) -> tuple[Any, str]:
    """The fsspec filesystem and path of ``url`` (a new instance: no listing cached from an earlier call), its
    requests bounded by ``timeout`` (S3: connect and read timeouts, :data:`ATTEMPTS` attempts). Raises
    ImportError or ValueError when it cannot be used."""
    import fsspec  # an optional dependency: the storage extra

    fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True, **_client_options(url, timeout))
    if _scheme(url) in S3_SCHEMES and isinstance(getattr(fs, "retries", None), int):
        fs.retries = 1  # s3fs's own loop of (5) tries around botocore's: once, botocore's attempts are the bound
    _quiet_lost_connections(fs)
    return fs, str(path).rstrip("/")


S3_SCHEMES = ("s3", "s3a")


def _scheme(url: str) -> str:
    match = _URL.match(url)
    return match.group(1).lower() if match else ""


def _client_options(url: str, timeout: float) -> dict[str, Any]:
    """The storage client's options that bound its requests (botocore's ``Config``, through s3fs's
    ``config_kwargs``); other stores keep their client's own and get the calls' deadlines only."""
    if _scheme(url) not in S3_SCHEMES:
        return {}
    return {"config_kwargs": {"connect_timeout": timeout, "read_timeout": timeout,
                              "retries": {"total_max_attempts": ATTEMPTS, "mode": "standard"}}}


def _is_async(fs: Any) -> bool:
    """Whether ``fs`` runs on fsspec's event loop: its blocking calls take a ``timeout`` (the call is cancelled
    past it and raises fsspec's FSTimeoutError, a TimeoutError)."""
    try:
        from fsspec.asyn import AsyncFileSystem
    except ImportError:
        return False
    return isinstance(fs, AsyncFileSystem)


def timed(fs: Any, call: Callable[..., Any], *args: Any, limit: float, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` of ``fs``, cancelled past ``limit`` seconds when ``fs`` is asynchronous."""
    if _is_async(fs):
        kwargs["timeout"] = limit
    return call(*args, **kwargs)


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


def reason(exc: BaseException) -> str:
    """``exc`` as a message's reason: one line, no credential; a timeout that says nothing says so."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return f"{type(exc).__name__}: no answer in time"
    return sanitize(f"{type(exc).__name__}: {exc}")


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
    scheme = _scheme(url)
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
                 on_adopted: Callable[[int], None] | None = None, timeout: float = TIMEOUT) -> None:
        """``spool_dir``: where to look for folders a previous process left (None: nowhere); ``on_adopted(n)``
        is told about their parts once stored; ``timeout``: ``OTELPROF_STORAGE_TIMEOUT_SECONDS``."""
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
        self._timeout = timeout
        self._sending: Path | None = None  # the part a storage call is reading: never deleted nor appended to
        self._final = False
        self._taken_at = time.monotonic()
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
            # an interval after the last take-over (a round that waited on the store took over meanwhile)
            self._wake.wait(max(self._taken_at + self._interval - time.monotonic(), 0.0))
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
                self._final = final
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

    def _take_over(self, final: bool, waiting: bool = False) -> None:
        """``waiting``: while a storage call waits (what is taken now goes up at the next round at best)."""
        self._taken_at = time.monotonic()
        try:
            self._pending.mkdir(exist_ok=True)
        except OSError:
            return
        parts = self._parts() if self._failing or waiting else []
        for name in APPENDED:
            target = self._pending / f"{self._next_stamp()}.{name}"
            last = next((p for p in reversed(parts) if p.name.partition(".")[2] == name and p != self._sending),
                        None)
            # the storage is away (or slow): what the file got since goes into its newest waiting part, not one
            # more small part every interval (the part keeps its name: stored once the storage is back)
            merge = last is not None and _size(last) < min(MERGE_BYTES, self._max_bytes // 8)
            if final:  # the writer is closed: its files are ours
                source = self._dir / name
                with contextlib.suppress(OSError):
                    if source.stat().st_size > 0:
                        os.replace(source, target)
                        if merge and last is not None:
                            _append(target, last)
            elif merge and last is not None:
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
            if part == self._sending:  # a storage call is reading it; it counts, and goes once stored
                continue
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
            self._fs, root = self._meanwhile(lambda: filesystem(self._url, self._timeout), None)
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
            self._call(self._fs, self._fs.exists, self._remote)
        return True

    def _call(self, fs: Any, call: Callable[..., Any], *args: Any, size: int = 0) -> Any:
        """One storage call, cancelled past its :func:`deadline` (run by :meth:`_meanwhile`). Raises what the
        call raised (TimeoutError past the deadline)."""
        limit = deadline(self._timeout, size)
        return self._meanwhile(lambda: timed(fs, call, *args, limit=limit), limit + 1.0)

    def _meanwhile(self, work: Callable[[], Any], limit: float | None) -> Any:
        """``work()`` on a thread of its own; while it runs, every upload interval the writer's files are taken
        over and the spool bounded, so that a store that does not answer (or a client slow to import) never
        lets the spool grow past its bound. Past ``limit`` seconds (None: none) it is left to end by itself and
        TimeoutError raised; else what it returned or raised."""
        if self._final:  # the writer is closed: nothing grows meanwhile
            return work()
        outcome: list[tuple[bool, Any]] = []

        def run() -> None:
            try:
                outcome.append((True, work()))
            except BaseException as exc:  # handed to the caller
                outcome.append((False, exc))

        worker = threading.Thread(target=run, name="otelprof-upload-call", daemon=True)
        try:
            worker.start()
        except RuntimeError:  # no new thread (the interpreter is exiting): on this one
            return work()
        end = None if limit is None else time.monotonic() + limit
        while True:
            wait = max(self._taken_at + self._interval - time.monotonic(), 0.0)
            worker.join(wait if end is None else max(min(wait, end - time.monotonic()), 0.0))
            if not worker.is_alive():
                break
            if end is not None and time.monotonic() >= end:  # a client that ignores its cancellation
                raise TimeoutError(f"no answer within {limit:g} s")
            self._take_over(False, waiting=True)
            self._bound()
        ok, value = outcome[0]
        if ok:
            return value
        raise value

    def _put(self, local: Path, remote: str, fs: Any = None, left_for: str = "") -> bool:
        """Store ``local`` as ``remote``; ``left_for``: the URL of a folder a previous process left (its
        failure is told apart from this process's own)."""
        client = fs or self._fs
        self._sending = local
        try:
            self._call(client, client.put_file, str(local), remote, size=_size(local))
        except Exception as exc:  # whatever the storage client raises: the job goes on
            if left_for:
                warn_once("recording:adopt-upload", "otelprof: uploading a recording a previous process left to "
                          "%s failed (%s); it waits in %s and is retried every %g s", sanitize(left_for, 200),
                          reason(exc), escape(str(local.parent)), self._interval)
                return False
            if not self._failing:
                self._failing = True
                warn_once("recording:upload", "otelprof: uploading the run recording to %s failed (%s); it waits "
                          "in %s (at most OTELPROF_RECORD_SPOOL_MAX_BYTES) and is retried every %g s; training "
                          "goes on", self._shown, reason(exc), self._dir, self._interval)
            return False
        finally:
            self._sending = None
        if self._failing:
            self._failing = False
            info_once("recording:upload-resumed", "otelprof: uploading the run recording to %s resumed", self._shown)
        return True

    def _upload(self) -> bool:
        if not self._connect():
            return False
        for part in self._parts():
            if not part.exists():  # deleted by the bound while an earlier part was being stored
                continue
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
                fs, root = self._filesystems[url] = filesystem(url, self._timeout)
                with contextlib.suppress(Exception):  # its connection pool made now, not at the interpreter's exit
                    self._call(fs, fs.exists, root)
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
                if not part.exists():  # deleted by the bound while an earlier part was being stored
                    continue
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
                        config.record_spool_max_bytes, on_dropped, shown, local_root(config), on_adopted,
                        config.storage_timeout)
    # Storage clients close their connections from weakref finalizers at exit; registering that exit hook now,
    # before init() registers the session's shutdown, makes the shutdown (and its last upload) run first.
    weakref.finalize(uploader, int)
    uploader.start()
    return uploader


# ---------------------------------------------------------------------- reading

class RemoteError(Exception):
    """A recording URL that cannot be read (one line, for the command's error)."""


def local_copy(url: str, timeout: float | None = None) -> Path:
    """Download the run ``url`` names (a rank folder, a run folder, or a folder of runs: its newest) into a
    temporary directory deleted at exit, joining parts back into files; the local run directory. ``timeout``
    bounds each request (default ``OTELPROF_STORAGE_TIMEOUT_SECONDS``). Raises RemoteError (one line)."""
    shown = sanitize(url, 200)
    if timeout is None:
        from otelprof.config import Config

        timeout = Config.from_env().storage_timeout
    try:
        fs, root = filesystem(url, timeout)
    except ImportError as exc:
        raise RemoteError(f"reading {shown} needs {INSTALL_HINT} ({sanitize(str(exc))})") from None
    except Exception as exc:
        raise RemoteError(f"{shown} cannot be used: {_read_reason(exc, timeout)}") from None
    try:
        listing = timed(fs, fs.find, root, detail=True, limit=timeout * LISTING)
    except Exception as exc:
        raise RemoteError(f"cannot list {shown}: {_read_reason(exc, timeout)}") from None
    files = {path[len(root):].lstrip("/"): info for path, info in listing.items() if path.startswith(root)}
    run = _pick_run(files)
    if run is None:
        raise RemoteError(f"{shown} is not an otelprof recording (no manifest.json, no rank-*/ folders, no runs "
                          "inside)")
    prefix, name = run
    name = name or root.rsplit("/", 1)[-1] or "run"
    inside = {k[len(prefix):]: v for k, v in files.items() if k.startswith(prefix)}
    unsafe = next((n for n in [name, *inside] if _leaves(n)), None)
    if unsafe is not None:
        raise RemoteError(f"{shown} is refused: the object name {sanitize(unsafe, 120)!r} has a '.' or '..' "
                          "component, which would leave the download directory")
    dest = Path(tempfile.mkdtemp(prefix="otelprof-remote-"))
    atexit.register(shutil.rmtree, dest, True)
    run_dir = dest / name
    try:
        _download(fs, root, prefix, inside, run_dir, timeout)
    except Exception as exc:
        raise RemoteError(f"cannot download {shown}: {_read_reason(exc, timeout)}") from None
    return run_dir


def _read_reason(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, TimeoutError) or type(exc).__name__ in ("ReadTimeoutError", "ConnectTimeoutError"):
        return (f"no answer within the storage timeout (OTELPROF_STORAGE_TIMEOUT_SECONDS={timeout:g}, "
                f"{ATTEMPTS} attempts)")
    return reason(exc)


def _leaves(name: str) -> bool:
    """Whether ``name`` (a run's name, or an object's key below the run) has a component that, as a local path,
    would leave the folder it is joined to (``.`` and ``..``; NUL, which no local name holds)."""
    return "\x00" in name or any(part in (".", "..") for part in name.split("/"))


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


def _download(fs: Any, root: str, prefix: str, files: dict[str, Any], run_dir: Path, timeout: float) -> None:
    """Fetch every file of the run; ``<file>.parts/<stamp>`` objects are appended to ``<file>`` in stamp order.
    Keys with an empty component (a folder marker) are passed over."""
    base = "/".join(p for p in (root, prefix.rstrip("/")) if p)
    inside = os.path.abspath(run_dir) + os.sep
    for key in sorted(files):
        if files[key].get("type") == "directory":
            continue
        parts = key.split("/")
        if any(not p for p in parts):
            continue
        if len(parts) >= 2 and parts[-2].endswith(PARTS):
            target, mode = run_dir.joinpath(*parts[:-2], parts[-2][: -len(PARTS)]), "ab"
        else:
            target, mode = run_dir.joinpath(*parts), "wb"
        if _leaves(key) or not os.path.abspath(target).startswith(inside):  # refused in local_copy already
            raise ValueError(f"{key!r} would leave the download directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, mode) as out:
            _copy(fs, f"{base}/{key}", files[key].get("size"), out, timeout)


def _copy(fs: Any, path: str, size: Any, out: Any, timeout: float) -> None:
    """Append the object ``path`` (``size`` bytes, None when the listing did not say) to ``out`` in ranges of
    :data:`CHUNK` bytes: memory holds one range, never the object."""
    if not isinstance(size, int):
        size = int(timed(fs, fs.size, path, limit=deadline(timeout)))
    offset = 0
    while offset < size:
        block = timed(fs, fs.cat_file, path, start=offset, end=min(offset + CHUNK, size),
                      limit=deadline(timeout, CHUNK))
        if not block:
            raise OSError(f"{path} ended at {offset} of {size} bytes")
        out.write(block)
        offset += len(block)
        del block
