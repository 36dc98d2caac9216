"""``otelprof webhook``: an Alertmanager webhook receiver that acts on alerts with an ``action`` label.

A firing alert labelled ``action="stop"`` or ``action="capture"`` becomes ``POST /v1/stop`` or
``POST /v1/capture`` on the control endpoint (:mod:`otelprof.runtime.control`) of the training process
it names (labels ``job_name`` and ``rank``), and of no other. Which URL serves which job and
rank comes from a static map: ``JOB=URL`` (every rank of the job, or a one-process job),
``JOB/RANK=URL``, or ``*=URL`` with ``{label}`` placeholders filled from the alert's labels
(e.g. ``*=http://{job_name}-{rank}.{job_name}:9470`` for an indexed Job behind a headless Service).
A label value fills a placeholder only if it fits its place in the URL (:meth:`Target.render`), so no
value can make the URL name another host, port or path: an alert with one that does not is rejected
(400), counted by cause and logged the first time.

Requests need ``Authorization: Bearer <token>`` (401 otherwise); oversized bodies get 413, bodies
that are not an Alertmanager payload of a known version 400 — and then nothing is done. A payload is
answered as soon as its actions are queued (202), never after waiting for a target: the actions wait in
per-target queues (:mod:`otelprof.cli.action_queue`: bounded, one request in flight per target, retried with a
backoff while a target is unreachable) and their outcomes are logged and counted on ``GET /metrics``
(``otelprof.webhook.*``). Decisions are logged (the first ones of a big payload, then a summary);
refusals and rejections are counted (``GET /healthz``) and logged once per cause. Actions that already
succeeded for an alert are remembered and not repeated.
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import json
import logging
import os
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otelprof import semconv as sc
from otelprof.cli import action_queue
from otelprof.runtime._http import BackgroundServer, Limits, QuietHandler

log = logging.getLogger("otelprof.webhook")

PATH = "/v1/alerts"
HEALTH_PATH = "/healthz"
SUPPORTED_VERSIONS = ("4",)
DEFAULT_MAX_BODY = 1024 * 1024
DEFAULT_PORT = 9095
ACTION_LABEL = "action"
ACTIONS = ("stop", "capture")
_REMEMBERED = 10_000

Sender = Callable[[str, dict[str, Any], str, float], int]
"""POST ``body`` as JSON to ``url`` with the bearer token; return the HTTP status (raise OSError if unreachable)."""


class TargetError(ValueError):
    """A target entry that cannot be parsed."""


class LabelError(ValueError):
    """An alert label whose value cannot go where a target's URL puts it: the alert is rejected."""

    def __init__(self, label: str, position: str, value: str) -> None:
        super().__init__(f"label {label}={value[:80]!r} is not {_WHAT[position]}")
        self.cause = f"{label} is not {_WHAT[position]}"


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DNS_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_DNS_LABEL_PART = re.compile(r"[A-Za-z0-9-]{1,63}")
_PORT = re.compile(r"[0-9]{1,5}")
_K8S_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
"""A Kubernetes namespace (a DNS-1123 label); a Job name is one or more of them joined by dots."""
_HOST, _HOST6, _HOST_PART, _PORT_POSITION, _PATH = "host", "host6", "host part", "port", "path"
_WHAT = {_HOST: "an IP address or a DNS label", _HOST6: "an IPv6 address",
         _HOST_PART: "part of a DNS label (letters, digits, -)", _PORT_POSITION: "a port number",
         _PATH: "a path segment", "k8s": "a Kubernetes name"}


def _host(value: str, position: str) -> str:
    """``value`` where a template puts a whole host: an IP address (IPv6 in brackets) or a DNS label."""
    if value.isascii() and "%" not in value:
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            pass
        else:
            if position == _HOST6 and address.version == 6:
                return address.compressed
            if position == _HOST:
                return f"[{address.compressed}]" if address.version == 6 else str(address)
    if position == _HOST and _DNS_LABEL.fullmatch(value):
        return value
    raise ValueError(value)


def _fill(label: str, value: str, position: str) -> str:
    """``value`` validated for (and encoded in) its place in the URL; LabelError if it does not fit."""
    try:
        if position in (_HOST, _HOST6):
            return _host(value, position)
        if position == _HOST_PART and _DNS_LABEL_PART.fullmatch(value):
            return value
        if position == _PORT_POSITION and _PORT.fullmatch(value) and 1 <= int(value) <= 65535:
            return str(int(value))
        if position == _PATH and value not in ("", ".", ".."):
            return urllib.parse.quote(value, safe="")
    except ValueError:
        pass
    raise LabelError(label, position, value)


def _analyse(url: str) -> tuple[str, str, str, str]:
    """Split a target URL template into (scheme://, host, :port, rest), refusing placeholders where no label
    value may go (scheme, user info) and ports that are neither a number nor one placeholder."""
    match = re.fullmatch(r"(https?://)([^/?#]*)(.*)", url, re.DOTALL)
    if match is None:
        raise TargetError(f"bad target URL {url!r}: it must start with http:// or https://")
    scheme, authority, rest = match.groups()
    if "@" in authority:
        raise TargetError(f"bad target URL {url!r}: no user info (@) in a control URL")
    if authority.startswith("["):
        end = authority.find("]")
        host, port = authority[:end + 1], authority[end + 1:]
    else:
        host, colon, port = authority.partition(":")
        port = colon + port
    if not host or (port and not port.startswith(":")):
        raise TargetError(f"bad target URL {url!r}: cannot tell its host from its port")
    if port and not (_PORT.fullmatch(port[1:]) or _PLACEHOLDER.fullmatch(port[1:])):
        raise TargetError(f"bad target URL {url!r}: the port must be a number or one {{label}}")
    return scheme, host, port, rest


@dataclass(frozen=True)
class Target:
    job: str
    """Job name, or ``*`` for any job."""
    rank: str | None
    url: str

    def __post_init__(self) -> None:
        _analyse(self.url)

    def render(self, labels: Mapping[str, str]) -> str:
        """The URL with ``{label}`` placeholders filled from the alert, each value validated for its place:
        a whole host takes an IP address or a DNS label, part of a host a DNS label's characters, a port a
        number, the path anything (percent-encoded). KeyError if a label is missing, LabelError if a value
        does not fit: a label value can never change which host, port or path the URL names."""
        scheme, host, port, rest = _analyse(self.url)

        def fill(text: str, position: str) -> str:
            return _PLACEHOLDER.sub(lambda m: _fill(m.group(1), labels[m.group(1)], position), text)

        whole = _PLACEHOLDER.fullmatch(host) or _PLACEHOLDER.fullmatch(host.strip("[]"))
        if whole is not None:
            filled_host = fill(host, _HOST6 if host.startswith("[") else _HOST)
        else:
            filled_host = fill(host, _HOST_PART)
            if _PLACEHOLDER.search(host) and not all(_DNS_LABEL.fullmatch(part) for part in filled_host.split(".")):
                names = ",".join(_PLACEHOLDER.findall(host))
                raise LabelError(names, _HOST_PART, filled_host)
        return (scheme + filled_host + fill(port, _PORT_POSITION) + fill(rest, _PATH)).rstrip("/")


def parse_target(item: str) -> Target:
    """``JOB=URL``, ``JOB/RANK=URL`` or ``*=URL`` (also ``JOB: URL`` as in a YAML mapping)."""
    match = re.match(r"^\s*([^=:\s/]+|\*)(?:/(\d+))?\s*(?:=|:\s)\s*(\S+)\s*$", item)
    if match is None:
        raise TargetError(f"bad target {item!r}: use JOB=URL, JOB/RANK=URL or *=URL")
    job, rank, url = match.groups()
    if not url.startswith(("http://", "https://")):
        raise TargetError(f"bad target {item!r}: the URL must start with http:// or https://")
    return Target(job.strip("'\""), rank, url.strip("'\""))


def parse_targets_text(text: str) -> list[Target]:
    """One target per line (``#`` comments, blank lines ignored): a flat YAML mapping works as is."""
    targets = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        try:
            targets.append(parse_target(line))
        except TargetError as exc:
            raise TargetError(f"line {number}: {exc}") from None
    return targets


def _printable(value: str, limit: int = 80) -> str:
    """A label value for a log line: cut, control characters escaped (no forged log lines)."""
    return repr(value[:limit])[1:-1]


class Tally:
    """Counts refusals by cause; logs a cause the first time, then at its 10th, 100th, ... occurrence
    (the counts are on ``GET /healthz``): a flood of hostile requests never floods the log."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, cause: str, detail: str = "") -> None:
        with self._lock:
            self._counts[cause] += 1
            n = self._counts[cause]
        if n == 10 ** (len(str(n)) - 1):
            log.warning("%s %s (%d so far)%s", self.what, cause, n, f": {detail}" if detail else "")

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


@dataclass
class TargetMap:
    """Static targets plus an optional file that is re-read when it changes (a mounted ConfigMap)."""

    static: list[Target] = field(default_factory=list)
    path: Path | None = None
    missing: Tally = field(default_factory=lambda: Tally("a target needs a label the alert lacks:"))
    _file_targets: list[Target] = field(default_factory=list)
    _mtime: float | None = None

    def targets(self) -> list[Target]:
        if self.path is not None:
            try:
                mtime = self.path.stat().st_mtime
                if mtime != self._mtime:
                    self._file_targets = parse_targets_text(self.path.read_text(encoding="utf-8"))
                    self._mtime = mtime
                    log.info("targets: loaded %d from %s", len(self._file_targets), self.path)
            except (OSError, TargetError) as exc:
                log.error("targets: cannot read %s (%s); keeping the previous %d", self.path, exc,
                          len(self._file_targets))
        return [*self.static, *self._file_targets]

    def resolve(self, labels: Mapping[str, str], job_label: str, rank_label: str,
                targets: list[Target] | None = None) -> list[str]:
        """Control URLs of the process(es) the alert names: its rank only when it names one (among ``targets``,
        read once per payload; by default :meth:`targets`)."""
        job = labels.get(job_label)
        if not job:
            return []
        rank = labels.get(rank_label)
        candidates = [t for t in (self.targets() if targets is None else targets) if t.job in (job, "*")]
        if rank is not None:
            exact = [t for t in candidates if t.rank == rank]
            chosen = exact or [t for t in candidates if t.rank is None]
            chosen = [t for t in chosen if t.job == job] or chosen  # an explicit job wins over "*"
            chosen = chosen[:1]
        else:
            chosen = candidates
        urls = []
        for target in chosen:  # LabelError (a value that does not fit its place) rejects the alert
            try:
                urls.append(target.render(labels))
            except KeyError as exc:
                self.missing.add(f"{target.job}={target.url} needs {exc}")
        return list(dict.fromkeys(urls))


class PayloadError(ValueError):
    pass


@dataclass(frozen=True)
class AlertItem:
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str
    fingerprint: str


def parse_payload(body: bytes) -> list[AlertItem]:
    """Validate an Alertmanager webhook payload (version 4) completely before anything is done."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(f"body is not JSON ({exc})") from None
    except RecursionError:
        raise PayloadError("body is not JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise PayloadError("body must be a JSON object")
    version = data.get("version")
    if version not in SUPPORTED_VERSIONS:
        raise PayloadError(f"unsupported payload version {version!r} (supported: {', '.join(SUPPORTED_VERSIONS)})")
    raw_alerts = data.get("alerts")
    if not isinstance(raw_alerts, list):
        raise PayloadError("alerts must be a list")
    items = []
    for i, raw in enumerate(raw_alerts):
        if not isinstance(raw, dict):
            raise PayloadError(f"alerts[{i}] must be an object")
        status, labels, annotations = raw.get("status"), raw.get("labels"), raw.get("annotations", {})
        if status not in ("firing", "resolved"):
            raise PayloadError(f"alerts[{i}].status must be firing or resolved")
        for name, value in (("labels", labels), ("annotations", annotations)):
            if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in value.items()):
                raise PayloadError(f"alerts[{i}].{name} must map strings to strings")
        starts_at, fingerprint = raw.get("startsAt", ""), raw.get("fingerprint", "")
        if not isinstance(starts_at, str) or not isinstance(fingerprint, str):
            raise PayloadError(f"alerts[{i}].startsAt and fingerprint must be strings")
        assert isinstance(labels, dict) and isinstance(annotations, dict)
        items.append(AlertItem(status, labels, annotations, starts_at, fingerprint))
    return items


CONNECT_TIMEOUT = 1.0
"""Most seconds to connect to a target (a healthy control endpoint accepts at once; one whose listen backlog
is full never does)."""
MAX_ANSWER = 64 * 1024
"""Most bytes of a target's answer read (its status line is all that counts)."""
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([0-9]{3})[ \r\n]")


def post_json(url: str, body: dict[str, Any], token: str, timeout: float) -> int:
    """POST ``body`` as JSON to ``url``; its HTTP status. Connecting takes at most :data:`CONNECT_TIMEOUT`
    seconds and the whole exchange at most ``timeout``, however the target behaves (OSError otherwise)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url[:200]!r}")
    deadline = time.monotonic() + timeout
    data = json.dumps(body).encode()
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    head = (f"POST {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n")
    if token:
        head += f"Authorization: Bearer {token}\r\n"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    sock = socket.create_connection((parts.hostname, port), timeout=min(CONNECT_TIMEOUT, timeout))
    try:
        sock.settimeout(_left(deadline))
        if parts.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=parts.hostname)
        sock.settimeout(_left(deadline))
        sock.sendall(head.encode() + b"\r\n" + data)
        answer = bytearray()
        while len(answer) < MAX_ANSWER:  # to the end (the target closes), so it never sees a reset
            try:
                sock.settimeout(_left(deadline))
                chunk = sock.recv(65536)
            except OSError:
                if _STATUS_LINE.match(answer):
                    break  # the status came; the rest is not worth waiting for
                raise
            if not chunk:
                break
            answer += chunk
    finally:
        sock.close()
    status = _STATUS_LINE.match(answer)
    if status is None:
        raise OSError(f"no HTTP answer from {parts.netloc}")
    return int(status.group(1))


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


class KubernetesJobs:
    """Suspends a batch/v1 Job through the Kubernetes API: the fallback when a training process does not
    answer a stop request. Needs only ``get`` and ``patch`` on ``jobs`` in the Job's namespace."""

    SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

    def __init__(self, api_url: str, token: str, ca_file: str | None, timeout: float = 5.0) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._context = ssl.create_default_context(cafile=ca_file) if api_url.startswith("https") else None

    @classmethod
    def in_cluster(cls, timeout: float = 5.0) -> KubernetesJobs:
        """From the pod's service account (raises OSError outside a pod)."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise OSError("not in a Kubernetes pod (KUBERNETES_SERVICE_HOST is unset)")
        token = (cls.SERVICE_ACCOUNT / "token").read_text(encoding="utf-8").strip()
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", token, str(cls.SERVICE_ACCOUNT / "ca.crt"), timeout)

    def suspend(self, namespace: str, job: str) -> int:
        """Set ``spec.suspend: true`` on the Job (Kubernetes then deletes its running pods)."""
        url = f"{self.api_url}/apis/batch/v1/namespaces/{namespace}/jobs/{job}"
        request = urllib.request.Request(url, data=json.dumps({"spec": {"suspend": True}}).encode(), method="PATCH",
                                         headers={"Content-Type": "application/merge-patch+json",
                                                  "Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._context) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)


METRICS_PATH = "/metrics"
LIMITS = Limits(workers=4, max_connections=64, deadline=10.0, rate=100.0, connection_rate=200.0,
                priority_paths=(HEALTH_PATH, METRICS_PATH))
"""The webhook's server: 4 workers (a request is answered once its actions are queued: it never waits for a
target, and more threads would only share one interpreter), 64 open connections (each buffers at most
--max-body bytes), 10 s per connection, 100 requests and 200 new connections a second; ``GET /healthz`` and
``GET /metrics`` go before other waiting requests, with a fifth worker kept for them."""
LOGGED_DECISIONS = 20
"""Decisions of one payload logged one by one; the rest in one summary line (a storm never floods the log)."""
ANSWERED_DECISIONS = 100
"""Decisions of one payload in the answer; the counts cover them all."""


def _netloc(url: str) -> str:
    """The target an action's queue is keyed by: ``host:port`` of its URL."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = 0
    return f"{parts.hostname or ''}:{port}"


@dataclass(eq=False)
class _StopFallback:
    """A stop's requests to the processes one alert names: if none is sent, the Job is suspended."""

    receiver: WebhookReceiver
    labels: dict[str, str]
    batch: int
    remaining: int
    sent: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def done(self, outcome: str) -> None:
        with self._lock:
            self.remaining -= 1
            self.sent |= outcome == action_queue.SENT
            last = self.remaining == 0
        if last and not self.sent:
            self.receiver.suspend(self.labels, self.batch)


@dataclass
class WebhookReceiver:
    """The request logic, without sockets (the server below and the tests call :meth:`handle`)."""

    token: str
    targets: TargetMap
    control_token: str = ""
    capture_steps: int = 20
    max_body: int = DEFAULT_MAX_BODY
    timeout: float = 3.0
    """Seconds one request to a target may take (connecting: at most :data:`CONNECT_TIMEOUT`)."""
    job_label: str = sc.prometheus_label(sc.LABEL_JOB)
    rank_label: str = sc.prometheus_label(sc.LABEL_RANK)
    dry_run: bool = False
    sender: Sender = post_json
    control_port_base: int | None = None
    """When set, ``{control_port}`` in target URLs is this plus the alert's ``local_rank`` (0 if absent)."""
    kubernetes: KubernetesJobs | None = None
    """When set, a stop that reaches no training process suspends the Job named by the alert's
    ``job_name`` in its ``namespace``."""
    queue: action_queue.ActionQueue = field(default_factory=action_queue.ActionQueue)
    """Where actions wait for their target; answers never wait for them."""
    refused: Tally = field(default_factory=lambda: Tally("refused a request:"))
    """Requests refused (401, 404, 405, 411, 413, 400) or lost (timeouts, disconnects), by cause."""
    rejected: Tally = field(default_factory=lambda: Tally("rejected an alert:"))
    """Alerts not acted on because a label value does not fit the target URL, by cause."""
    unsuccessful: Tally = field(default_factory=lambda: Tally("an action was not sent:"))
    """Actions refused by their target or given up, by action and outcome (each is logged at first, then at
    the 10th, 100th, ...: a storm of dead targets never floods the log)."""
    _done: OrderedDict[tuple[str, ...], None] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def authorized(self, authorization: str) -> bool:
        return hmac.compare_digest(authorization.encode(errors="replace"), f"Bearer {self.token}".encode())

    def health(self) -> dict[str, Any]:
        return {"ok": True, "refused": self.refused.counts(), "rejected": self.rejected.counts(),
                "actions": self.queue.snapshot()}

    def handle(self, method: str, path: str, authorization: str, content_length: int | None,
               read: Callable[[int], bytes]) -> tuple[int, dict[str, Any]]:
        """One request -> (status, JSON answer). ``read(n)`` reads the body only once it is accepted."""
        if method == "GET" and path == HEALTH_PATH:
            return 200, self.health()
        if path != PATH:
            self.refused.add("not_found")
            return 404, {"error": f"no such endpoint (POST {PATH}, GET {HEALTH_PATH}, GET {METRICS_PATH})"}
        if method != "POST":
            self.refused.add("not_found")
            return 405, {"error": f"use POST {PATH}"}
        if not self.authorized(authorization):
            self.refused.add("unauthorized", "missing or wrong bearer token")
            return 401, {"error": "missing or wrong bearer token"}
        if content_length is None:
            self.refused.add("bad_request", "no Content-Length")
            return 411, {"error": "Content-Length required"}
        if content_length > self.max_body:
            self.refused.add("too_large", f"a payload of {content_length} bytes (limit {self.max_body})")
            return 413, {"error": f"payload over {self.max_body} bytes"}
        try:
            items = parse_payload(read(content_length))
        except PayloadError as exc:
            self.refused.add("bad_payload", str(exc))
            return 400, {"error": str(exc)}
        return self.act(items)

    def act(self, items: list[AlertItem]) -> tuple[int, dict[str, Any]]:
        """Queue the action of each firing alert with an action label; answer at once: 400 when an alert was
        rejected, else 202 when an action was queued, else 200. Outcomes are logged and counted later."""
        decisions: list[dict[str, Any]] = []
        counts: Counter[str] = Counter()
        targets = self.targets.targets()
        batch = self.queue.new_batch()
        for item in items:
            name = item.labels.get("alertname", "?")
            job, rank = item.labels.get(self.job_label), item.labels.get(self.rank_label)
            action = item.labels.get(ACTION_LABEL)
            decision: dict[str, Any] = {"alert": name, "job": job, "rank": rank, "action": action}
            if item.status != "firing":
                decision["result"] = "ignored: resolved"
            elif action is None:
                decision["result"] = "ignored: no action label"
            elif action not in ACTIONS:
                decision["result"] = f"ignored: unknown action {action[:80]!r}"
            else:
                try:
                    decision["result"], queued = self._act(item, action, targets, batch)
                    counts["queued"] += queued
                except LabelError as exc:
                    counts["rejected"] += 1
                    decision["result"] = f"rejected: {exc}"
                    self.rejected.add(exc.cause, f"{_printable(name)} job={_printable(job or '-')}: {exc}")
            if len(decisions) < ANSWERED_DECISIONS:
                decisions.append(decision)
            if len(decisions) <= LOGGED_DECISIONS and not decision["result"].startswith("rejected"):
                log.info("%s job=%s rank=%s action=%s -> %s", _printable(name), _printable(job or "-"),
                         _printable(rank or "-"), action if action in ACTIONS else "-",
                         _printable(decision["result"], 500))
        if len(items) > LOGGED_DECISIONS:
            log.info("a payload of %d alerts: %d actions queued, %d alerts rejected (the first %d decisions are "
                     "logged)", len(items), counts["queued"], counts["rejected"], LOGGED_DECISIONS)
        status = 400 if counts["rejected"] else 202 if counts["queued"] else 200
        return status, {"alerts": len(items), "queued": counts["queued"], "rejected": counts["rejected"],
                        "decisions": decisions}

    def _act(self, item: AlertItem, action: str, targets: list[Target], batch: int) -> tuple[str, int]:
        """(result, actions queued) of one actionable alert; LabelError rejects it."""
        labels = dict(item.labels)
        if self.control_port_base is not None:
            local_rank = labels.get(sc.prometheus_label(sc.LABEL_LOCAL_RANK), "0")
            if not _PORT.fullmatch(local_rank) or self.control_port_base + int(local_rank) > 65535:
                raise LabelError(sc.prometheus_label(sc.LABEL_LOCAL_RANK), _PORT_POSITION, local_rank)
            labels["control_port"] = str(self.control_port_base + int(local_rank))
        urls = self.targets.resolve(labels, self.job_label, self.rank_label, targets)
        if not urls:
            return "ignored: no control endpoint known for this job/rank", 0
        fallback, note = None, ""
        if action == "stop" and self.kubernetes is not None and not self.dry_run:
            try:
                self._kubernetes_job(labels)
                fallback = _StopFallback(self, labels, batch, len(urls))
            except LabelError as exc:  # the stop is still sent (and retried) without the fallback
                self.rejected.add(exc.cause, f"not suspending: {exc}")
                note = f"; not suspending the Job if it fails: {exc}"
        results = [self._send(item, action, url, fallback, batch) for url in urls]
        return "; ".join(f"{url}: {result}" for url, result in zip(urls, results)) + note, \
            sum(result == f"{action} queued" for result in results)

    def _kubernetes_job(self, labels: Mapping[str, str]) -> tuple[str, str]:
        """(namespace, Job name) of the alert, both Kubernetes names (they go into the API's URL path)."""
        namespace, job = labels.get(sc.SCRAPE_LABEL_NAMESPACE), labels.get(self.job_label)
        if not namespace:
            raise LabelError(sc.SCRAPE_LABEL_NAMESPACE, "k8s", "")
        self._kubernetes_names(labels)
        assert job is not None  # resolved targets need it
        return namespace, job

    def _kubernetes_names(self, labels: Mapping[str, str]) -> None:
        namespace, job = labels.get(sc.SCRAPE_LABEL_NAMESPACE), labels.get(self.job_label)
        if namespace is not None and not _K8S_NAME.fullmatch(namespace):
            raise LabelError(sc.SCRAPE_LABEL_NAMESPACE, "k8s", namespace)
        if job is not None and (len(job) > 253 or not all(_K8S_NAME.fullmatch(p) for p in job.split("."))):
            raise LabelError(self.job_label, "k8s", job)

    def _send(self, item: AlertItem, action: str, url: str, fallback: _StopFallback | None, batch: int) -> str:
        key = (item.fingerprint or json.dumps(item.labels, sort_keys=True), item.starts_at, action, url)
        with self._lock:
            done = key in self._done
        if done:
            self.queue.count(action, action_queue.DUPLICATE)
            if fallback is not None:
                fallback.done(action_queue.SENT)
            return "already done"
        name = item.labels.get("alertname", "")
        if action == "stop":
            summary = item.annotations.get("summary", "")
            body: dict[str, Any] = {"reason": f"alert {name}: {summary}".strip(), "alert": name}
        else:
            body = {"steps": self.capture_steps}
        endpoint = f"{url}/v1/{action}"
        if self.dry_run:
            return f"dry run, would POST {endpoint} {json.dumps(body)}"
        what = f"{_printable(name)} {action} {_printable(endpoint, 300)}"

        def on_done(outcome: str, detail: str) -> None:
            if outcome == action_queue.SENT:
                with self._lock:
                    self._done[key] = None
                    while len(self._done) > _REMEMBERED:
                        self._done.popitem(last=False)
                log.info("%s: %s sent (%s)", what, action, detail)
            else:
                self.unsuccessful.add(f"{action} {outcome}", f"{what}: {detail}")
            if fallback is not None:
                fallback.done(outcome)

        result = self.queue.submit(action_queue.Action(
            action, _netloc(url), (action, url), lambda: self.sender(endpoint, body, self.control_token, self.timeout),
            what, retry=fallback is None, on_done=[on_done]), batch)
        if result == action_queue.QUEUED:
            return f"{action} queued"
        if result == action_queue.DUPLICATE:
            return f"{action} already queued"
        if fallback is not None:
            fallback.done(result)
        return f"dropped: {result.replace('_', ' ')}"

    def suspend(self, labels: Mapping[str, str], batch: int = 0) -> None:
        """Queue the suspension of the Job an alert names (a stop reached none of its processes)."""
        assert self.kubernetes is not None
        kubernetes = self.kubernetes
        namespace, job = self._kubernetes_job(labels)  # checked when the stop was queued
        what = f"suspend Job {namespace}/{job}"

        def on_done(outcome: str, detail: str) -> None:
            if outcome == action_queue.SENT:
                log.info("%s: no process reached, Job suspended (%s)", what, detail)
            else:
                self.unsuccessful.add(f"suspend {outcome}", f"{what}: {detail}")

        self.queue.submit(action_queue.Action(
            "suspend", _netloc(kubernetes.api_url), ("suspend", namespace, job),
            lambda: kubernetes.suspend(namespace, job), what, on_done=[on_done]), batch)

    def metrics_text(self) -> str:
        """The webhook's own series (``otelprof.webhook.*``) in the Prometheus text format."""
        outcomes, dropped, depth, failing = self.queue.metrics()
        families: list[tuple[sc.MetricSpec, list[tuple[dict[str, str], float]]]] = [
            (sc.WEBHOOK_ACTIONS, [({sc.LABEL_ACTION: a, sc.LABEL_OUTCOME: o}, outcomes.get((a, o), 0))
                                  for a in (*ACTIONS, "suspend") for o in sc.WEBHOOK_OUTCOMES]),
            (sc.WEBHOOK_DROPPED, [({sc.LABEL_REASON: r}, dropped.get(r, 0)) for r in sc.WEBHOOK_DROP_REASONS]),
            (sc.WEBHOOK_QUEUE_DEPTH, [({}, depth)]),
            (sc.WEBHOOK_TARGETS_FAILING, [({}, failing)]),
        ]
        lines = []
        for spec, samples in families:
            name = spec.query_name
            lines += [f"# HELP {name} {spec.description}", f"# TYPE {name} {spec.kind.value}"]
            for labels, value in samples:
                text = ",".join(f'{sc.prometheus_label(k)}="{v}"' for k, v in labels.items())
                lines.append(f"{name}{{{text}}} {value}" if text else f"{name} {value}")
        return "\n".join(lines) + "\n"


class WebhookServer(BackgroundServer):
    poll_interval = 0.1

    def __init__(self, receiver: WebhookReceiver, limits: Limits = LIMITS) -> None:
        super().__init__(dataclasses.replace(limits, max_body=receiver.max_body), receiver.refused.add)
        self.receiver = receiver

    def _handler(self) -> type[QuietHandler]:
        receiver = self.receiver

        class Handler(QuietHandler):
            count_answers = False  # the receiver counts its refusals itself, by cause

            def _serve(self, method: str) -> None:
                length = self.content_length()
                if length is not None and length < 0:
                    receiver.refused.add("bad_request", "bad Content-Length")
                    self.send_json(400, {"error": "bad Content-Length"})
                    return
                consumed = False

                def read(n: int) -> bytes:
                    nonlocal consumed
                    consumed = True
                    return self.rfile.read(n)

                if method == "GET" and self.path.split("?")[0] == METRICS_PATH:
                    self.send_body(200, "text/plain; version=0.0.4; charset=utf-8", receiver.metrics_text().encode())
                    return
                try:
                    status, answer = receiver.handle(method, self.path.split("?")[0],
                                                     self.headers.get("Authorization", ""), length, read)
                except Exception as exc:  # a bug: one line in the log, a 500 for Alertmanager
                    receiver.refused.add("internal", repr(exc)[:200])
                    status, answer = 500, {"error": "internal error"}
                self.send_json(status, answer)
                if length and not consumed:  # refused before its body was read: let the client read the answer
                    self.discard_body(length)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

        return Handler

    def listen(self, host: str, port: int) -> tuple[str, int]:
        """Bind (serve with :meth:`serve_forever`); raises OSError when the address cannot be bound."""
        return self.bind(host, port, self._handler())

    def start_background(self, host: str, port: int) -> tuple[str, int]:
        return self.start(host, port, self._handler(), "otelprof-webhook")

    def stop(self) -> None:
        """Stop serving, then the action workers (after their current request; queued actions are dropped)."""
        super().stop()
        self.receiver.queue.stop()
