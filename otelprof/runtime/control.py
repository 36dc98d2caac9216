"""The training process's control endpoint: ``POST /v1/stop`` and ``POST /v1/capture``.

Called by ``otelprof webhook`` (alert actions) and ``otelprof capture``. Off by
default (``OTELPROF_CONTROL_PORT``); listens on port + ``LOCAL_RANK``. A bearer token
(``OTELPROF_CONTROL_TOKEN``) is required when set, and the endpoint refuses to start
off loopback without one. Requests only set flags: the work happens on the training
thread at the next step boundary. Bodies are at most :data:`MAX_BODY` bytes; the
server's limits are :data:`LIMITS`; refusals are counted in ``otelprof.endpoint.errors``.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from typing import Any

from otelprof._log import escape, logger, warn_once
from otelprof.runtime._http import BackgroundServer, Limits, QuietHandler
from otelprof.runtime.metrics import MetricRegistry, endpoint_counter
from otelprof.runtime.tokens import is_placeholder, placeholder_message
from otelprof.semconv import ENDPOINT_CONTROL

MAX_BODY = 64 * 1024
MAX_CAPTURE_STEPS = 10_000
LOOPBACK = ("127.0.0.1", "::1", "localhost")
LIMITS = Limits(workers=2, max_connections=32, deadline=5.0, rate=10.0, connection_rate=20.0, max_body=MAX_BODY)
"""Two workers, 32 open connections, 5 s per connection, 10 requests and 20 new connections a second: stop and
capture requests come from one webhook and a few people."""


class ControlServer:
    """HTTP front of ``on_stop(reason, alert)`` and ``on_capture(steps) -> description``."""

    def __init__(
        self,
        on_stop: Callable[[str, str], dict[str, Any]],
        on_capture: Callable[[int], dict[str, Any]],
        status: Callable[[], dict[str, Any]],
        token: str,
        registry: MetricRegistry | None = None,
    ) -> None:
        self._on_stop = on_stop
        self._on_capture = on_capture
        self._status = status
        self._token = token
        self._server = BackgroundServer(LIMITS, endpoint_counter(registry, ENDPOINT_CONTROL))
        self.address: tuple[str, int] | None = None

    def handle(self, method: str, path: str, authorization: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """Route one request (pure: tested without sockets)."""
        if self._token and not hmac.compare_digest(authorization.encode(errors="replace"),
                                                   f"Bearer {self._token}".encode()):
            return 401, {"error": "missing or wrong bearer token"}
        if method == "GET" and path == "/v1/status":
            return 200, self._status()
        if method != "POST" or path not in ("/v1/stop", "/v1/capture"):
            return 404, {"error": "no such endpoint (POST /v1/stop, POST /v1/capture, GET /v1/status)"}
        try:
            payload = json.loads(body or b"{}")
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            return 400, {"error": "body is not JSON"}
        if not isinstance(payload, dict):
            return 400, {"error": "body must be a JSON object"}
        if path == "/v1/stop":
            reason, alert = payload.get("reason", ""), payload.get("alert", "")
            if not isinstance(reason, str) or not isinstance(alert, str):
                return 400, {"error": "reason and alert must be strings"}
            logger.info("otelprof: control POST /v1/stop -> 202")
            return 202, self._on_stop(reason[:500], alert[:200])
        steps = payload.get("steps", 10)
        if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_CAPTURE_STEPS:
            return 400, {"error": f"steps must be an integer from 1 to {MAX_CAPTURE_STEPS}"}
        logger.info("otelprof: control POST /v1/capture -> 202")
        return 202, self._on_capture(steps)

    def start(self, host: str, port: int) -> bool:
        if is_placeholder(self._token):
            warn_once("control:placeholder", "otelprof: the control endpoint is not started: %s",
                      placeholder_message("OTELPROF_CONTROL_TOKEN"))
            return False
        if host not in LOOPBACK and not self._token:
            warn_once("control:token", "otelprof: the control endpoint on %s needs OTELPROF_CONTROL_TOKEN off "
                      "loopback; it is not started", escape(host))
            return False
        control = self

        class Handler(QuietHandler):
            def _serve(self, method: str) -> None:
                length = self.content_length()
                if length is not None and length < 0:
                    self.send_json(400, {"error": "bad Content-Length"})
                elif length is not None and length > MAX_BODY:
                    self.send_json(413, {"error": f"body over {MAX_BODY} bytes"})
                    self.discard_body(length)
                else:
                    body = self.rfile.read(length) if length else b""
                    if length and len(body) < length:  # the client hung up or stalled until the deadline
                        return
                    self.send_json(*control.handle(method, self.path.split("?")[0],
                                                   self.headers.get("Authorization", ""), body))

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

        try:
            self.address = self._server.start(host, port, Handler, "otelprof-control")
        except (OSError, OverflowError) as exc:  # OverflowError: a port above 65535
            warn_once("control:bind", "otelprof: cannot serve the control endpoint on %s:%d (%s)", escape(host), port,
                      escape(str(exc)))
            return False
        return True

    def stop(self) -> None:
        self._server.stop()
