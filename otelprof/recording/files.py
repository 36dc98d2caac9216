"""Reading a recording's files safely: regular files only (never a FIFO or device that could block),
lines in bounded blocks forwards or backwards, never holding a line longer than its limit."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from otelprof.recording.errors import RecordingError
from otelprof.recording.limits import MAX_LINE_BYTES


def open_regular(path: Path) -> IO[bytes]:
    """``path`` opened for reading; OSError when it is not a regular file (a directory, or a FIFO or
    device, which could block or never end)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
            raise OSError(f"not a regular file ({kind})")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def reason(exc: OSError) -> str:
    """Why a file could not be read, for a one-line message."""
    return exc.strerror or str(exc) if exc.errno is not None else str(exc)


def check_file(path: Path) -> None:
    """RecordingError when ``path`` is there but is not a readable regular file."""
    if not os.path.lexists(path):
        return
    try:
        with open_regular(path):
            pass
    except OSError as exc:
        raise RecordingError(f"cannot read {path}: {reason(exc)}") from exc


def blocks(path: Path, max_line: int) -> Iterator[tuple[str, int]]:
    """The lines of ``path`` a block at a time: (text of whole lines, lines longer than ``max_line`` bytes
    skipped since the previous block). Reads at most ``max_line`` bytes at a time and never holds a
    longer line; stops at the size the file had when opened (a live recording keeps growing). The
    text's last line may lack its newline (the file ends inside a line: a killed writer)."""
    with open_regular(path) as handle:
        remaining = os.fstat(handle.fileno()).st_size
        head = b""  # the start of a line that began in the previous block (at most max_line bytes)
        skipping = False  # inside a line already longer than max_line
        over = 0
        while remaining > 0:
            block = handle.read(min(max_line, remaining))
            if not block:
                break
            remaining -= len(block)
            first = b""
            start = 0
            if head or skipping:
                newline = block.find(b"\n")
                if newline < 0:
                    if not skipping and len(head) + len(block) > max_line:
                        head, skipping, over = b"", True, over + 1
                    elif not skipping:
                        head += block
                    continue
                if not skipping:
                    if len(head) + newline > max_line:
                        over += 1
                    else:
                        first = head + block[:newline + 1]
                head, skipping, start = b"", False, newline + 1
            cut = block.rfind(b"\n", start)
            body = block[start:cut + 1] if cut >= 0 else b""
            head = block[cut + 1:] if cut >= 0 else block[start:]
            text = first + body
            if text or over:
                yield text.decode("utf-8", errors="replace"), over
                over = 0
        if head and not skipping:
            yield head.decode("utf-8", errors="replace"), over
        elif over:
            yield "", over


def lines_backwards(handle: IO[bytes], max_line: int, chunk: int = 2**20) -> Iterator[bytes | None]:
    """The non-blank lines of a file from its end, newest first; None for each line longer than
    ``max_line`` bytes (never held whole). Reads ``chunk`` bytes at a time."""
    position = os.fstat(handle.fileno()).st_size
    carry = b""  # the line that goes on after the block being read
    skipping = False  # that line is already longer than max_line
    while position > 0:
        start = max(position - chunk, 0)
        handle.seek(start)
        pieces = handle.read(position - start).split(b"\n")
        position = start
        if not skipping:
            carry = pieces[-1] + carry
            if len(carry) > max_line:
                carry, skipping = b"", True
                yield None
        if len(pieces) == 1:
            continue  # no newline here: the line goes on backwards
        if not skipping and carry.strip():
            yield carry
        for piece in reversed(pieces[1:-1]):
            if piece.strip():
                yield piece if len(piece) <= max_line else None
        carry, skipping = pieces[0], len(pieces[0]) > max_line
        if skipping:
            carry = b""
            yield None
    if not skipping and carry.strip():
        yield carry


def lines(path: Path) -> Iterator[str | None]:
    """Non-blank lines of ``path``, stripped; None for each line longer than its file's limit. Nothing
    when the file is missing or cannot be read."""
    if not os.path.lexists(path):
        return
    try:
        for text, over in blocks(path, MAX_LINE_BYTES.get(path.name, 2**20)):
            for _ in range(over):
                yield None
            for line in text.split("\n"):
                line = line.strip()
                if line:
                    yield line
    except OSError:
        return
