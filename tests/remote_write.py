"""A small Prometheus remote-write receiver: what a Thanos Receive, Mimir or VictoriaMetrics would be sent.

Remote write 1.0 is a snappy-compressed (block format, not framed) protobuf ``WriteRequest``:
``WriteRequest{repeated TimeSeries timeseries = 1}``, ``TimeSeries{repeated Label labels = 1; repeated Sample
samples = 2}``, ``Label{string name = 1; string value = 2}``, ``Sample{double value = 1; int64 timestamp = 2}``.
Both are decoded by hand here (no snappy library is needed); anything else in the request is skipped.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY = 64 * 1024 * 1024


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def snappy_decompress(data: bytes) -> bytes:
    """Decode snappy's block format: a varint length, then literals and back-references."""
    length, pos = _varint(data, 0)
    out = bytearray()
    while pos < len(data):
        tag = data[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:  # literal
            size = tag >> 2
            if size >= 60:
                extra = size - 59
                size = int.from_bytes(data[pos:pos + extra], "little")
                pos += extra
            size += 1
            out += data[pos:pos + size]
            pos += size
            continue
        if kind == 1:
            size = 4 + ((tag >> 2) & 7)
            offset = ((tag >> 5) << 8) | data[pos]
            pos += 1
        elif kind == 2:
            size = 1 + (tag >> 2)
            offset = int.from_bytes(data[pos:pos + 2], "little")
            pos += 2
        else:
            size = 1 + (tag >> 2)
            offset = int.from_bytes(data[pos:pos + 4], "little")
            pos += 4
        if offset == 0 or offset > len(out):
            raise ValueError("bad snappy back-reference")
        start = len(out) - offset
        for i in range(size):  # may overlap what it writes
            out.append(out[start + i])
    if len(out) != length:
        raise ValueError(f"snappy: {len(out)} bytes decoded, {length} announced")
    return bytes(out)


def _fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of one protobuf message; length-delimited values as bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


@dataclass
class Series:
    labels: dict[str, str]
    samples: list[tuple[int, float]] = field(default_factory=list)


def decode_write_request(body: bytes) -> list[Series]:
    out = []
    for number, _, ts in _fields(body):
        if number != 1:
            continue  # metadata (3) and anything newer
        series = Series({})
        for sub, _, value in _fields(ts):
            if sub == 1:
                pair = {n: v.decode() for n, _, v in _fields(value)}
                series.labels[pair.get(1, "")] = pair.get(2, "")
            elif sub == 2:
                sample = dict((n, v) for n, _, v in _fields(value))
                raw = sample.get(2, 0)
                stamp = raw - (1 << 64) if raw >= 1 << 63 else raw
                series.samples.append((stamp, struct.unpack("<d", sample.get(1, b"\0" * 8))[0]))
        out.append(series)
    return out


class Receiver:
    """Everything received, by series (labels as a sorted tuple)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.series: dict[tuple[tuple[str, str], ...], Series] = {}
        self.requests = 0
        self.headers: list[dict[str, str]] = []

    def add(self, batch: list[Series], headers: dict[str, str]) -> None:
        with self.lock:
            self.requests += 1
            self.headers.append(headers)
            for s in batch:
                key = tuple(sorted(s.labels.items()))
                self.series.setdefault(key, Series(s.labels)).samples += s.samples

    def find(self, name: str) -> list[Series]:
        with self.lock:
            return [s for s in self.series.values() if s.labels.get("__name__") == name]

    def names(self) -> set[str]:
        with self.lock:
            return {s.labels.get("__name__", "") for s in self.series.values()}


@contextmanager
def remote_write_receiver() -> Iterator[tuple[str, Receiver]]:
    """A receiver on 127.0.0.1; yields its write URL and what it received."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            if self.path != "/api/v1/write" or not 0 < size <= MAX_BODY:
                self.send_error(400)
                return
            try:
                batch = decode_write_request(snappy_decompress(self.rfile.read(size)))
            except (ValueError, IndexError, UnicodeDecodeError, struct.error):
                self.send_error(400)
                return
            receiver.add(batch, {k.lower(): v for k, v in self.headers.items()})
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api/v1/write", receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
