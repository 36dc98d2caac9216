"""The ``otelprof`` logger and warn-once: a training loop must never be flooded."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading

logger = logging.getLogger("otelprof")

_warned: set[str] = set()
_lock = threading.Lock()


def warn_once(key: str, message: str, *args: object) -> None:
    """Log ``message`` as a warning the first time ``key`` is seen in this process."""
    if _first(key):
        logger.warning(message, *args)


def info_once(key: str, message: str, *args: object) -> None:
    """Log ``message`` at info level (shown only where the application configured logging) the first time
    ``key`` is seen in this process: what otelprof does about something that needs no action."""
    if _first(key):
        logger.info(message, *args)


def _first(key: str) -> bool:
    with _lock:
        if key in _warned:
            return False
        _warned.add(key)
        return True


_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/\s@?#]*@")


_seen_userinfo: list[str] = []  # user info of URLs redacted so far: also hidden where a client quotes it alone


def _hide(match: re.Match[str]) -> str:
    userinfo = match.group(0)[len(match.group(1)):-1]
    if userinfo and userinfo not in _seen_userinfo and len(_seen_userinfo) < 16:
        _seen_userinfo.append(userinfo)
    return match.group(1) + "***@"


def redact(text: str) -> str:
    """``text`` with the user info of every URL in it (``s3://user:password@bucket``) replaced by ``***``, and
    any user info seen in such a URL before wherever it appears (a storage client's error quoting
    ``user:password@bucket`` as a bucket name): a credential given in a URL is never printed, logged or saved."""
    if "@" not in text:
        return text
    text = _USERINFO.sub(_hide, text)
    for userinfo in _seen_userinfo:
        text = text.replace(userinfo + "@", "***@")
    return text


def sanitize(text: str, limit: int = 160) -> str:
    """``text`` fit for one log line: printable ASCII only (anything else becomes ``?``), whitespace runs as one
    space, at most ``limit`` characters. For text that comes from outside (a server's reply, an exception about
    one): its bytes never reach the training job's terminal as they are."""
    cleaned = " ".join("".join(c if " " <= c <= "~" else "?" if c not in "\t\n\r" else " "
                               for c in redact(text[: limit * 4])).split())
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 3] + "..."


def escape(text: str, limit: int = 300) -> str:
    """``text`` fit for one printed line, nothing lost: control characters (newlines, terminal escapes, bidi
    overrides) and lone surrogates written as Python escapes (``\\x1b``, ``\\n``), cut at ``limit`` characters.
    For every printed or logged string that comes from outside (a recording, a request, an argument)."""
    clean = "".join(c if c.isprintable() else repr(c)[1:-1] for c in redact(text[:limit + 1]))
    return clean if len(clean) <= limit else clean[:limit - 3] + "..."


def say(text: str) -> None:
    """Write ``text`` to stderr; never raises and leaves nothing behind in Python's buffer when stderr is closed,
    full (``/dev/full``) or a pipe nobody reads (a buffered line that cannot be written makes the interpreter
    exit with status 120 at its end)."""
    text = redact(text)
    stream = sys.stderr
    if stream is None:  # started with fd 2 closed
        return
    try:
        fd = stream.fileno()
    except Exception:  # replaced by an object without a descriptor (an in-memory capture)
        try:
            stream.write(text)
            stream.flush()
        except Exception:
            pass
        return
    with contextlib.suppress(Exception):
        stream.flush()  # what the program wrote first comes first
    with contextlib.suppress(Exception):
        os.write(fd, text.encode(getattr(stream, "encoding", None) or "utf-8", "backslashreplace"))


def describe_exception(exc: BaseException) -> str:
    """``str(exc)``, or "" when even that raises."""
    try:
        return str(exc)
    except Exception:
        return ""


def reset_warnings() -> None:
    """Forget which warnings were given (tests, and a new ``init()`` after ``shutdown()``)."""
    with _lock:
        _warned.clear()
