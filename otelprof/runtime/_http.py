"""The small HTTP servers otelprof runs (/metrics and the control endpoint in the training process, the
webhook receiver on its own): bounded, silent and counted, whatever clients do.

* **Bounded.** One thread accepts connections and reads each request (request line, headers and a body of at
  most :attr:`Limits.max_body` bytes) without blocking: a connection that is idle or sends slowly costs a
  selector entry and its bytes, not a thread. Complete requests go to a fixed number of workers
  (:attr:`Limits.workers`), at most :attr:`Limits.rate` a second. At most :attr:`Limits.max_connections`
  connections are open: at the limit the oldest one still sending its request is closed for a new one, and if
  there is none, new ones wait in the kernel's listen backlog (:attr:`Limits.backlog`); at most
  :attr:`Limits.connection_rate` are accepted a second. Every connection is
  closed :attr:`Limits.deadline` seconds after it was accepted, answered or not. One request per connection.
* **Silent.** Nothing is printed per request: no access log, no traceback. Errors are one-line JSON.
* **Counted.** Each refused or failed request is counted by reason (``otelprof.semconv.ENDPOINT_ERROR_REASONS``)
  and reported to the owner's ``on_refused`` callback (the in-process servers count it in
  ``otelprof.endpoint.errors``).
"""

from __future__ import annotations

import contextlib
import io
import json
import queue
import re
import selectors
import socket
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from otelprof._log import warn_once
from otelprof.semconv import (
    REASON_BAD_REQUEST,
    REASON_DISCONNECT,
    REASON_INTERNAL,
    REASON_NOT_FOUND,
    REASON_OVERLOAD,
    REASON_TIMEOUT,
    REASON_TOO_LARGE,
    REASON_UNAUTHORIZED,
)

_STATUS_REASONS = {401: REASON_UNAUTHORIZED, 403: REASON_UNAUTHORIZED, 404: REASON_NOT_FOUND,
                   405: REASON_NOT_FOUND, 411: REASON_BAD_REQUEST, 413: REASON_TOO_LARGE, 414: REASON_TOO_LARGE,
                   431: REASON_TOO_LARGE, 500: REASON_INTERNAL}

MAX_HEAD = 64 * 1024
"""Request line and headers buffered before a request goes to a worker (which refuses longer ones)."""
DISCARD_LIMIT = 16 * 1024 * 1024
"""Most bytes of a refused body read (and thrown away) after the answer, so the client can read it."""
DISCARD_TIME = 2.0
"""Most seconds spent reading a refused body."""
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_CONTENT_LENGTH = re.compile(rb"(?im)^content-length[ \t]*:[ \t]*([0-9]{1,18})[ \t]*\r?$")


@dataclass(frozen=True)
class Limits:
    """What one server may cost the process it runs in."""

    workers: int = 4
    """Requests answered at the same time (threads, each started when first needed)."""
    max_connections: int = 64
    """Open connections: sending their request, waiting for a worker, or being answered."""
    deadline: float = 10.0
    """Seconds from accepting a connection to closing it, answered or not."""
    rate: float = 50.0
    """Requests handed to workers per second (bursts of :attr:`workers`); more wait for their turn."""
    connection_rate: float = 100.0
    """Connections accepted per second (bursts of :attr:`max_connections`); more wait in the backlog. Bounds
    the cost of clients that connect and close, or reopen what the limit closed, in a loop."""
    backlog: int = 128
    """The listen backlog: connections the kernel queues while the limit is reached."""
    max_body: int = 0
    """Largest body read before a worker is involved; a longer one is refused (or read) by the handler."""
    priority_paths: tuple[str, ...] = ()
    """Paths whose ``GET`` requests (cheap ones: health, metrics) go before the other waiting requests (one such
    request at a time) and may take one worker beyond :attr:`workers`, so a probe is never queued behind slow
    requests. None by default."""


class QuietHandler(BaseHTTPRequestHandler):
    """No access log on stderr (a training job's output is not ours), one-line JSON answers, refusals counted,
    and a strict ``Content-Length``."""

    server_version = "otelprof"
    sys_version = ""
    server: _Server
    count_answers = True
    """Count answers of 400 and above in the server's refusals (off when the owner counts them by cause)."""

    def setup(self) -> None:
        """Read what the serving loop already received, then the socket."""
        self.connection = self.request
        self.rfile = io.BufferedReader(_Prefixed(self.server.take_prefix(self.connection), self.connection))
        self.wfile = _SocketWriter(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def send_json(self, status: int, answer: Any) -> None:
        if status >= 400 and self.count_answers:
            self.server.count(_STATUS_REASONS.get(status, REASON_BAD_REQUEST))
        self.send_body(status, "application/json", json.dumps(answer).encode())

    def send_body(self, status: int, content_type: str, body: bytes, *headers: tuple[str, str]) -> None:
        """The whole answer in one write; the connection closes after it."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.close_connection = True
        buffer: list[bytes] | None = getattr(self, "_headers_buffer", None)
        if buffer is None:  # HTTP/0.9: no status line, no headers
            self.wfile.write(body)
            return
        buffer.append(b"\r\n")
        if self.command != "HEAD":
            buffer.append(body)
        self.flush_headers()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """What the standard library answers for malformed requests, as one line of JSON; its 5xx for an
        unknown method or HTTP version are the client's fault: 405 and 400."""
        if code == HTTPStatus.NOT_IMPLEMENTED:
            code, message = HTTPStatus.METHOD_NOT_ALLOWED, "method not allowed"
        elif code >= 500:
            code = HTTPStatus.BAD_REQUEST
        default = self.responses.get(code, ("error", ""))[0]
        self.request_version = "HTTP/1.0"  # a status line even when the request line could not be parsed
        if not self.count_answers:
            self.server.count(_STATUS_REASONS.get(code, REASON_BAD_REQUEST))
        self.send_json(code, {"error": message or default})

    def content_length(self) -> int | None:
        """The declared body length: None when absent, -1 when it is not one plain decimal number (or the body
        is chunked, which these servers do not take)."""
        values = self.headers.get_all("Content-Length") or []
        if self.headers.get("Transfer-Encoding") is not None:
            return -1
        if not values:
            return None
        text = values[0].strip()
        if len(set(values)) != 1 or not text.isascii() or not text.isdigit() or len(text) > 18:
            return -1
        return int(text)

    def discard_body(self, length: int) -> None:
        """After refusing a body: read (up to :data:`DISCARD_LIMIT` bytes, :data:`DISCARD_TIME` seconds) and drop
        it, so a client that sends it all before reading gets the answer rather than a reset."""
        remaining = min(length, DISCARD_LIMIT)
        until = time.monotonic() + DISCARD_TIME
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_WR)
            while remaining > 0:
                left = until - time.monotonic()
                if left <= 0:
                    break
                self.connection.settimeout(left)
                chunk = self.rfile.read1(min(remaining, 65536))
                if not chunk:
                    break
                remaining -= len(chunk)


class _Prefixed(io.RawIOBase):
    """Bytes already received, then the socket."""

    def __init__(self, prefix: bytes, sock: socket.socket) -> None:
        self._prefix = memoryview(prefix)
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._prefix:
            n = min(len(buffer), len(self._prefix))
            buffer[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        return self._sock.recv_into(buffer)


class _SocketWriter(io.BufferedIOBase):
    """Every write sent whole (``sendall``), unbuffered."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._sock.sendall(data)
        with memoryview(data) as view:
            return view.nbytes


class _Server(HTTPServer):
    """Binds (IPv4 or IPv6) with the backlog of :class:`Limits`; the serving loop is :class:`BackgroundServer`'s."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], backlog: int,
                 count: Callable[[str], None]) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.request_queue_size = backlog
        self.count = count
        self._prefixes: dict[int, bytes] = {}
        self._prefix_lock = threading.Lock()
        super().__init__(address, handler)

    def give_prefix(self, sock: socket.socket, prefix: bytes) -> None:
        with self._prefix_lock:
            self._prefixes[id(sock)] = prefix

    def take_prefix(self, sock: socket.socket) -> bytes:
        with self._prefix_lock:
            return self._prefixes.pop(id(sock), b"")


@dataclass
class _Connection:
    sock: socket.socket
    address: Any
    deadline: float
    received: bytearray = field(default_factory=bytearray)
    complete_at: int = -1
    """Bytes that make the whole request, once its headers are in."""
    cut: bool = False


class BackgroundServer:
    """One bounded HTTP server: :meth:`start` serves it on a daemon thread, or :meth:`bind` then
    :meth:`serve_forever` in the caller's thread; until :meth:`stop`."""

    poll_interval = 0.5
    """Seconds between checks of the deadlines when nothing happens."""

    def __init__(self, limits: Limits | None = None, on_refused: Callable[[str], None] | None = None) -> None:
        self.limits = limits or Limits()
        self._on_refused = on_refused
        self._server: _Server | None = None
        self.address: tuple[str, int] | None = None
        self.refused: Counter[str] = Counter()
        """Refused or failed requests by reason (``otelprof.semconv.ENDPOINT_ERROR_REASONS``)."""
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Connection | None] = queue.SimpleQueue()
        self._in_flight: dict[int, _Connection] = {}
        self._workers: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._name = "otelprof-http"
        self._serving = False
        self._accepts = 0.0

    @property
    def backlog(self) -> int:
        return self.limits.backlog

    def count(self, reason: str) -> None:
        with self._lock:
            self.refused[reason] += 1
        if self._on_refused is not None:
            with contextlib.suppress(Exception):  # counting must never break serving
                self._on_refused(reason)

    def bind(self, host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> tuple[str, int]:
        """Bind; raises OSError when the address cannot be bound (port 0: any free port)."""
        server = _Server((host, port), handler, self.limits.backlog, self.count)
        self._server = server
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.address = (host, int(server.server_address[1]))
        return self.address

    def start(self, host: str, port: int, handler: type[BaseHTTPRequestHandler], name: str) -> tuple[str, int]:
        """Bind and serve on a daemon thread named ``name``."""
        address = self.bind(host, port, handler)
        threading.Thread(target=self.serve_forever, args=(name,), name=name, daemon=True).start()
        return address

    def stop(self) -> None:
        server = self._server
        if server is None:
            return
        self._stopping.set()
        self._wake()
        if self._serving:
            self._stopped.wait(5.0)
        for _ in self._workers:
            self._jobs.put(None)
        server.server_close()
        for sock in (self._wake_r, self._wake_w):
            if sock is not None:
                _close(sock)
        self._server = None

    # ------------------------------------------------------------------ the serving loop
    def serve_forever(self, name: str = "otelprof-http") -> None:
        server = self._server
        assert server is not None
        self._name, self._serving = name, True
        try:
            self._loop(server)
        except Exception as exc:  # a bug: this server stops, the process goes on (one warning)
            self.count(REASON_INTERNAL)
            warn_once(f"http:{name}", "otelprof: the %s server stopped: %r", name, exc)
        finally:
            self._stopped.set()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # closed, or full (the loop is awake anyway)
            if self._wake_w is not None:
                self._wake_w.send(b"x")

    def _loop(self, server: _Server) -> None:
        limits = self.limits
        listener, wake = server.socket, self._wake_r
        assert wake is not None
        listener.setblocking(False)
        selector = selectors.DefaultSelector()
        selector.register(wake, selectors.EVENT_READ)
        selector.register(listener, selectors.EVENT_READ)
        listening = True
        receiving: OrderedDict[int, _Connection] = OrderedDict()  # still sending their request: oldest first
        ready: deque[_Connection] = deque()  # a whole request: waiting for a worker
        tokens, last = float(limits.workers), time.monotonic()
        self._accepts = float(limits.max_connections)
        try:
            while not self._stopping.is_set():
                timeout = self.poll_interval
                if ready:
                    timeout = min(timeout, max(0.001, (1.0 - tokens) / limits.rate))
                if not listening:
                    timeout = min(timeout, max(0.001, (1.0 - self._accepts) / limits.connection_rate))
                for key, _ in selector.select(timeout):
                    if key.fileobj is wake:
                        with contextlib.suppress(OSError):
                            wake.recv(4096)
                    elif key.fileobj is listener:
                        self._accept(listener, selector, receiving, ready)
                    else:
                        connection = receiving.get(key.fd)
                        if connection is None or connection is not key.data:
                            continue  # closed earlier in this turn (its number may be a new connection's)
                        state = self._receive(connection)
                        if state != "wait":
                            del receiving[key.fd]
                            selector.unregister(connection.sock)
                            if state == "ready" and self._priority(connection) and not (
                                    ready and self._priority(ready[0])):  # one at a time: a flood of probes
                                ready.appendleft(connection)  # waits its turn like any request
                            elif state == "ready":
                                ready.append(connection)
                            else:
                                _close(connection.sock)
                now = time.monotonic()
                self._expire(now, selector, receiving, ready)
                tokens = min(float(limits.workers), tokens + (now - last) * limits.rate)
                self._accepts = min(float(limits.max_connections),
                                    self._accepts + (now - last) * limits.connection_rate)
                last = now
                while ready and tokens >= 1.0 and self._busy() < limits.workers + self._reserve(ready[0]):
                    connection = ready.popleft()
                    tokens -= 1.0
                    server.give_prefix(connection.sock, bytes(connection.received))
                    with self._lock:
                        self._in_flight[id(connection)] = connection
                        busy = len(self._in_flight)
                    if busy > len(self._workers):  # workers start when first needed, up to Limits.workers
                        worker = threading.Thread(target=self._work, args=(server,), daemon=True,
                                                  name=f"{self._name}-{len(self._workers)}")
                        worker.start()
                        self._workers.append(worker)
                    self._jobs.put(connection)
                full = len(receiving) + len(ready) + self._busy() >= limits.max_connections and not receiving
                full |= self._accepts < 1.0
                if full and listening:
                    selector.unregister(listener)
                    listening = False
                elif not full and not listening:
                    selector.register(listener, selectors.EVENT_READ)
                    listening = True
        finally:
            for connection in [*receiving.values(), *ready]:
                _close(connection.sock)
            selector.close()

    def _priority(self, connection: _Connection) -> bool:
        """A ``GET`` of one of :attr:`Limits.priority_paths`."""
        line = bytes(connection.received[:256])
        return any(line.startswith(f"GET {path}".encode()) and line[4 + len(path):5 + len(path)] in (b" ", b"?")
                   for path in self.limits.priority_paths)

    def _reserve(self, connection: _Connection) -> int:
        """The worker kept for priority requests: 1 for one of them."""
        return 1 if self._priority(connection) else 0

    def _busy(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def _accept(self, listener: socket.socket, selector: selectors.BaseSelector,
                receiving: OrderedDict[int, _Connection], ready: deque[_Connection]) -> None:
        limits = self.limits
        while self._accepts >= 1.0:
            if len(receiving) + len(ready) + self._busy() >= limits.max_connections:
                if not receiving:
                    return
                _, oldest = receiving.popitem(last=False)
                selector.unregister(oldest.sock)
                _close(oldest.sock)
                self.count(REASON_OVERLOAD)
            try:
                sock, address = listener.accept()
            except OSError:  # nothing more to accept, or e.g. too many open files: try again on the next turn
                return
            self._accepts -= 1.0
            sock.setblocking(False)
            connection = _Connection(sock, address, time.monotonic() + limits.deadline)
            receiving[sock.fileno()] = connection
            selector.register(sock, selectors.EVENT_READ, connection)

    def _receive(self, connection: _Connection) -> str:
        """Read what arrived: ``"wait"`` for more, ``"ready"`` when the request is whole (or too long to buffer:
        the handler refuses it), ``"closed"`` when the client went away."""
        try:
            data = connection.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return "wait"
        except OSError:
            self.count(REASON_DISCONNECT)
            return "closed"
        received = connection.received
        if not data:
            if received:
                self.count(REASON_DISCONNECT)
            return "closed"  # nothing sent at all: a TCP probe
        start = max(0, len(received) - 3)
        received += data
        if connection.complete_at < 0:
            end = _HEAD_END.search(received, start)
            if end is None:
                return "ready" if len(received) > MAX_HEAD else "wait"
            head = bytes(received[:end.end()])
            length = _CONTENT_LENGTH.findall(head)
            body = int(length[0]) if len(length) == 1 and int(length[0]) <= self.limits.max_body else 0
            connection.complete_at = end.end() + body
        return "ready" if len(received) >= connection.complete_at else "wait"

    def _expire(self, now: float, selector: selectors.BaseSelector, receiving: OrderedDict[int, _Connection],
                ready: deque[_Connection]) -> None:
        for fd, connection in list(receiving.items()):
            if connection.deadline > now:
                break  # in accept order: the rest are younger
            del receiving[fd]
            selector.unregister(connection.sock)
            _close(connection.sock)
            self.count(REASON_TIMEOUT)
        for connection in [c for c in ready if c.deadline <= now]:  # a priority request may be ahead of older ones
            ready.remove(connection)
            _close(connection.sock)
            self.count(REASON_TIMEOUT)
        with self._lock:
            late = [c for c in self._in_flight.values() if c.deadline <= now and not c.cut]
        for connection in late:  # a worker blocked on a slow client: wake it with an end of stream
            connection.cut = True
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)

    def _work(self, server: _Server) -> None:
        while True:
            connection = self._jobs.get()
            if connection is None:
                return
            try:
                self._answer(server, connection)
            finally:
                with self._lock:
                    self._in_flight.pop(id(connection), None)
                self._wake()

    def _answer(self, server: _Server, connection: _Connection) -> None:
        sock = connection.sock
        try:
            sock.setblocking(True)
            sock.settimeout(max(0.001, connection.deadline - time.monotonic()))
            server.finish_request(sock, connection.address)
        except OSError:  # reset, broken pipe, or a read or write past the deadline
            late = connection.cut or time.monotonic() >= connection.deadline
            self.count(REASON_TIMEOUT if late else REASON_DISCONNECT)
        except Exception:  # a bug in a handler: counted (never printed into the training job's output)
            self.count(REASON_INTERNAL)
        else:
            if connection.cut or time.monotonic() >= connection.deadline:
                self.count(REASON_TIMEOUT)
        finally:
            server.take_prefix(sock)
            _close(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
