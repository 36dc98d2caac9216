"""The small HTTP servers otelprof runs in the training process (/metrics, the control endpoint):
a threading server on a daemon thread, and a handler base that logs nothing and answers JSON."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """No access log on stderr (a training job's output is not ours), and a JSON answer helper."""

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def send_json(self, status: int, answer: Any) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class QuietServer(ThreadingHTTPServer):
    """A threading server that prints nothing when a request fails: a scraper that gave up (its timeout) and
    closed the connection mid-answer is no error of the training job, and socketserver would print a
    traceback to its stderr."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        return None


class BackgroundServer:
    """One ``ThreadingHTTPServer``: :meth:`start` serves it on a daemon thread, or :meth:`bind` then
    :meth:`serve_forever` in the caller's thread; until :meth:`stop`."""

    poll_interval = 0.5
    """Seconds :meth:`stop` may wait for the serving loop to notice."""

    def __init__(self) -> None:
        self._server: QuietServer | None = None
        self.address: tuple[str, int] | None = None

    def bind(self, host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> tuple[str, int]:
        """Bind; raises OSError when the address cannot be bound (port 0: any free port)."""
        server = QuietServer((host, port), handler)
        self._server = server
        self.address = (host, int(server.server_address[1]))
        return self.address

    def serve_forever(self) -> None:
        assert self._server is not None
        self._server.serve_forever(poll_interval=self.poll_interval)

    def start(self, host: str, port: int, handler: type[BaseHTTPRequestHandler], name: str) -> tuple[str, int]:
        """Bind and serve on a daemon thread named ``name``."""
        address = self.bind(host, port, handler)
        threading.Thread(target=self.serve_forever, name=name, daemon=True).start()
        return address

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
