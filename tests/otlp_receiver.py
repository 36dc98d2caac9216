"""A small in-test OTLP receiver: a real gRPC server and a real HTTP server on 127.0.0.1.

>>> with OTLPReceiver() as receiver:
...     os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint("grpc")
...     ...
...     receiver.wait_for(lambda r: r.spans(), timeout=5)

Both servers store every ExportTraceServiceRequest / ExportMetricsServiceRequest they
receive (in arrival order, both transports together) and answer with success, or, given a
``Fault``, refuse every request with it (an HTTP status and reason phrase, a gRPC status and
details). Helpers for the black-hole and garbage collectors and for free / closed ports live here too.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from typing_extensions import Self

TRACES_PATH = "/v1/traces"
METRICS_PATH = "/v1/metrics"


def any_value(value: AnyValue) -> Any:
    """The Python value of an OTLP AnyValue (scalars; arrays/kvlists as lists/dicts)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return getattr(value, kind)


def attributes(pairs: Any) -> dict[str, Any]:
    """A repeated KeyValue field as a dict."""
    return {kv.key: any_value(kv.value) for kv in pairs}


@dataclass(frozen=True)
class ReceivedSpan:
    """One received span with the resource and scope it arrived under."""

    span: Span
    resource: Resource
    scope_name: str
    transport: str
    scope_version: str = ""

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def attributes(self) -> dict[str, Any]:
        return attributes(self.span.attributes)

    @property
    def resource_attributes(self) -> dict[str, Any]:
        return attributes(self.resource.attributes)

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_span_id(self) -> str:
        return self.span.parent_span_id.hex()


@dataclass(frozen=True)
class ReceivedMetric:
    metric: Metric
    resource: Resource
    transport: str
    scope_name: str = ""
    scope_version: str = ""

    @property
    def name(self) -> str:
        return self.metric.name

    @property
    def resource_attributes(self) -> dict[str, Any]:
        return attributes(self.resource.attributes)


@dataclass(frozen=True)
class Fault:
    """How a misbehaving receiver answers every export: HTTP ``status`` with ``reason`` as the status line's
    phrase and ``body``; gRPC ``grpc_code`` with ``details`` (both may carry bytes no terminal should get)."""

    status: int = 500
    reason: str = "Internal Server Error"
    body: bytes = b""
    grpc_code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    details: str = "internal error"


@dataclass(frozen=True)
class HTTPRequestInfo:
    path: str
    content_type: str
    content_encoding: str
    size: int


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        self._receiver._refuse_grpc(context)
        self._receiver._store("grpc", request)
        return trace_service_pb2.ExportTraceServiceResponse()


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        self._receiver._refuse_grpc(context)
        self._receiver._store("grpc", request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


def _decode_body(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


def _make_handler(receiver: OTLPReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            encoding = self.headers.get("Content-Encoding", "")
            path = self.path.split("?", 1)[0]
            receiver._http_requests.append(
                HTTPRequestInfo(path, self.headers.get("Content-Type", ""), encoding, len(raw)))
            fault = receiver.fault
            if fault is not None:
                receiver.refused += 1
                self.send_response(fault.status, fault.reason)
                self.send_header("Content-Length", str(len(fault.body)))
                self.end_headers()
                self.wfile.write(fault.body)
                return
            if path == TRACES_PATH:
                message: Any = trace_service_pb2.ExportTraceServiceRequest()
                response: Any = trace_service_pb2.ExportTraceServiceResponse()
            elif path == METRICS_PATH:
                message = metrics_service_pb2.ExportMetricsServiceRequest()
                response = metrics_service_pb2.ExportMetricsServiceResponse()
            else:
                self._reply(404, b"")
                return
            try:
                message.ParseFromString(_decode_body(raw, encoding))
            except Exception as exc:  # a broken body is a test failure, surfaced through errors
                receiver.errors.append(f"{path}: {exc!r}")
                self._reply(400, b"")
                return
            receiver._store("http", message)
            self._reply(200, response.SerializeToString())

        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler


class OTLPReceiver:
    """gRPC + HTTP OTLP receiver for traces and metrics; use as a context manager."""

    def __init__(self, fault: Fault | None = None) -> None:
        self.fault = fault
        self.refused = 0  # requests answered with the fault
        self._lock = threading.Condition()
        self.trace_requests: list[Any] = []
        self.metric_requests: list[Any] = []
        self.transports: list[tuple[str, str]] = []  # (transport, "traces"|"metrics") per request
        self.errors: list[str] = []
        self._http_requests: list[HTTPRequestInfo] = []
        self._grpc_server: grpc.Server | None = None
        self._http_server: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self.grpc_port = 0
        self.http_port = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> OTLPReceiver:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsService(self), server)
        self.grpc_port = server.add_insecure_port("127.0.0.1:0")
        if not self.grpc_port:
            raise RuntimeError("could not bind the gRPC receiver")
        server.start()
        self._grpc_server = server
        self._http_server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._http_server.daemon_threads = True
        self.http_port = self._http_server.server_address[1]
        self._http_thread = threading.Thread(target=self._http_server.serve_forever, kwargs={"poll_interval": 0.05},
                                             name="otlp-receiver-http", daemon=True)
        self._http_thread.start()
        return self

    def stop(self) -> None:
        if self._http_server is not None:
            self._http_server.shutdown()
            self._http_server.server_close()
            self._http_server = None
        if self._grpc_server is not None:
            self._grpc_server.stop(grace=None).wait(5)
            self._grpc_server = None

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def endpoint(self, protocol: str) -> str:
        """Value for OTEL_EXPORTER_OTLP_ENDPOINT for ``grpc`` or ``http/protobuf``."""
        port = self.grpc_port if protocol == "grpc" else self.http_port
        return f"http://127.0.0.1:{port}"

    # ------------------------------------------------------------------ storage
    def _refuse_grpc(self, context: Any) -> None:
        if self.fault is not None:
            self.refused += 1
            context.abort(self.fault.grpc_code, self.fault.details)

    def _store(self, transport: str, message: Any) -> None:
        with self._lock:
            if isinstance(message, trace_service_pb2.ExportTraceServiceRequest):
                self.trace_requests.append(message)
                self.transports.append((transport, "traces"))
            else:
                self.metric_requests.append(message)
                self.transports.append((transport, "metrics"))
            self._lock.notify_all()

    @property
    def http_requests(self) -> list[HTTPRequestInfo]:
        return list(self._http_requests)

    def _transport_of(self, kind: str) -> Iterator[str]:
        with self._lock:
            pairs = list(self.transports)
        return (transport for transport, k in pairs if k == kind)

    # ------------------------------------------------------------------ helpers
    def spans(self) -> list[ReceivedSpan]:
        """Every received span, flattened, in arrival order."""
        with self._lock:
            requests = list(self.trace_requests)
        transports = list(self._transport_of("traces"))
        out: list[ReceivedSpan] = []
        for request, transport in zip(requests, transports):
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        out.append(ReceivedSpan(span, resource_spans.resource, scope_spans.scope.name, transport,
                                                scope_spans.scope.version))
        return out

    def metrics(self) -> list[ReceivedMetric]:
        """Every received metric (each export is a cumulative snapshot), in arrival order."""
        with self._lock:
            requests = list(self.metric_requests)
        transports = list(self._transport_of("metrics"))
        out: list[ReceivedMetric] = []
        for request, transport in zip(requests, transports):
            for resource_metrics in request.resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        out.append(ReceivedMetric(metric, resource_metrics.resource, transport,
                                                  scope_metrics.scope.name, scope_metrics.scope.version))
        return out

    def metric_names(self) -> set[str]:
        return {m.name for m in self.metrics()}

    def last_metric(self, name: str) -> ReceivedMetric | None:
        """The newest received copy of metric ``name`` (cumulative: the most complete)."""
        found = [m for m in self.metrics() if m.name == name]
        return found[-1] if found else None

    def wait_for(self, predicate: Callable[[OTLPReceiver], Any], timeout: float = 5.0) -> bool:
        """Wait until ``predicate(self)`` is truthy; False after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                if predicate(self):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.1))


# ---------------------------------------------------------------------- misbehaving "collectors"


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (connection refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Listener:
    """A TCP listener on 127.0.0.1 whose thread runs :meth:`_run` between ``with`` and its end."""

    def __init__(self, name: str) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()


class BlackHole(_Listener):
    """A TCP listener that accepts connections, reads everything and never answers."""

    def __init__(self) -> None:
        super().__init__("otlp-black-hole")
        self.accepted = 0
        self._conns: list[socket.socket] = []

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                pass
            else:
                conn.setblocking(False)
                self._conns.append(conn)
                self.accepted += 1
            for conn in self._conns:
                with contextlib.suppress(BlockingIOError, OSError):
                    conn.recv(65536)  # swallow, never reply

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        for conn in self._conns:
            conn.close()


class Garbage(_Listener):
    """A TCP listener that reads each request and answers with random bytes and terminal escapes, then hangs up."""

    MARKER = b"\x1b[2J\x1b]0;pwned\x07GARBAGE"

    def __init__(self) -> None:
        super().__init__("otlp-garbage")
        self.answered = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            with conn, contextlib.suppress(OSError):
                conn.settimeout(1.0)
                conn.recv(65536)
                conn.sendall(os.urandom(300) + self.MARKER + os.urandom(100))
                self.answered += 1
