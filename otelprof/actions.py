"""``otelprof webhook``: an Alertmanager webhook receiver that acts on alerts with an ``action`` label.

A firing alert labelled ``action="stop"`` or ``action="capture"`` becomes ``POST /v1/stop`` or
``POST /v1/capture`` on the control endpoint (:mod:`otelprof.control`) of the training process
it names (labels ``job_name`` and ``rank``), and of no other. Which URL serves which job and
rank comes from a static map: ``JOB=URL`` (every rank of the job, or a one-process job),
``JOB/RANK=URL``, or ``*=URL`` with ``{label}`` placeholders filled from the alert's labels
(e.g. ``*=http://{job_name}-{rank}.{job_name}:9470`` for an indexed Job behind a headless Service).

Requests need ``Authorization: Bearer <token>`` (401 otherwise); oversized bodies get 413, bodies
that are not an Alertmanager payload of a known version 400 — and then nothing is done. Every
decision is logged. When a control endpoint cannot be reached the answer is 502, so Alertmanager
retries; actions that already succeeded are remembered and not repeated.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import re
import ssl
import threading
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otelprof import semconv as sc
from otelprof._http import BackgroundServer, QuietHandler

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


@dataclass(frozen=True)
class Target:
    job: str
    """Job name, or ``*`` for any job."""
    rank: str | None
    url: str

    def render(self, labels: Mapping[str, str]) -> str:
        """The URL with ``{label}`` placeholders filled from the alert; KeyError if one is missing."""
        return re.sub(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: labels[m.group(1)], self.url).rstrip("/")


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


@dataclass
class TargetMap:
    """Static targets plus an optional file that is re-read when it changes (a mounted ConfigMap)."""

    static: list[Target] = field(default_factory=list)
    path: Path | None = None
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

    def resolve(self, labels: Mapping[str, str], job_label: str, rank_label: str) -> list[str]:
        """Control URLs of the process(es) the alert names: its rank only when it names one."""
        job = labels.get(job_label)
        if not job:
            return []
        rank = labels.get(rank_label)
        candidates = [t for t in self.targets() if t.job in (job, "*")]
        if rank is not None:
            exact = [t for t in candidates if t.rank == rank]
            chosen = exact or [t for t in candidates if t.rank is None]
            chosen = [t for t in chosen if t.job == job] or chosen  # an explicit job wins over "*"
            chosen = chosen[:1]
        else:
            chosen = candidates
        urls = []
        for target in chosen:
            try:
                urls.append(target.render(labels))
            except KeyError as exc:
                log.warning("target %s=%s needs label %s, which the alert lacks", target.job, target.url, exc)
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


def post_json(url: str, body: dict[str, Any], token: str, timeout: float) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


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


@dataclass
class WebhookReceiver:
    """The request logic, without sockets (the server below and the tests call :meth:`handle`)."""

    token: str
    targets: TargetMap
    control_token: str = ""
    capture_steps: int = 20
    max_body: int = DEFAULT_MAX_BODY
    timeout: float = 3.0
    job_label: str = sc.prometheus_label(sc.LABEL_JOB)
    rank_label: str = sc.prometheus_label(sc.LABEL_RANK)
    dry_run: bool = False
    sender: Sender = post_json
    control_port_base: int | None = None
    """When set, ``{control_port}`` in target URLs is this plus the alert's ``local_rank`` (0 if absent)."""
    kubernetes: KubernetesJobs | None = None
    """When set, a stop that reaches no training process suspends the Job named by the alert's
    ``job_name`` in its ``namespace``."""
    _done: OrderedDict[tuple[str, ...], None] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def authorized(self, authorization: str) -> bool:
        return hmac.compare_digest(authorization.encode(), f"Bearer {self.token}".encode())

    def handle(self, method: str, path: str, authorization: str, content_length: int | None,
               read: Callable[[int], bytes]) -> tuple[int, dict[str, Any]]:
        """One request -> (status, JSON answer). ``read(n)`` reads the body only once it is accepted."""
        if method == "GET" and path == HEALTH_PATH:
            return 200, {"ok": True}
        if path != PATH:
            return 404, {"error": f"no such endpoint {path} (POST {PATH}, GET {HEALTH_PATH})"}
        if method != "POST":
            return 405, {"error": f"use POST {PATH}"}
        if not self.authorized(authorization):
            log.warning("rejected a request: missing or wrong bearer token")
            return 401, {"error": "missing or wrong bearer token"}
        if content_length is None:
            return 411, {"error": "Content-Length required"}
        if content_length > self.max_body:
            log.warning("rejected a payload of %d bytes (limit %d)", content_length, self.max_body)
            return 413, {"error": f"payload over {self.max_body} bytes"}
        try:
            items = parse_payload(read(content_length))
        except PayloadError as exc:
            log.warning("rejected a payload: %s", exc)
            return 400, {"error": str(exc)}
        return self.act(items)

    def act(self, items: list[AlertItem]) -> tuple[int, dict[str, Any]]:
        decisions: list[dict[str, Any]] = []
        failed = False
        sent: set[tuple[str, str]] = set()
        for item in items:
            name = item.labels.get("alertname", "?")
            where = f"{name} job={item.labels.get(self.job_label, '-')} rank={item.labels.get(self.rank_label, '-')}"
            action = item.labels.get(ACTION_LABEL)
            decision: dict[str, Any] = {"alert": name, "job": item.labels.get(self.job_label),
                                        "rank": item.labels.get(self.rank_label), "action": action}
            decisions.append(decision)
            if item.status != "firing":
                decision["result"] = "ignored: resolved"
            elif action is None:
                decision["result"] = "ignored: no action label"
            elif action not in ACTIONS:
                decision["result"] = f"ignored: unknown action {action!r}"
            else:
                labels = dict(item.labels)
                local_rank = labels.get(sc.prometheus_label(sc.LABEL_LOCAL_RANK), "0")
                if self.control_port_base is not None and local_rank.isdigit():
                    labels["control_port"] = str(self.control_port_base + int(local_rank))
                urls = self.targets.resolve(labels, self.job_label, self.rank_label)
                outcomes = [(url, self._send(item, action, url, sent)) for url in urls]
                results = [f"{url}: {outcome}" for url, outcome in outcomes]
                reached = any(not outcome.startswith("failed") for _, outcome in outcomes)
                if action == "stop" and not reached and self.kubernetes is not None:
                    suspended = self._suspend(labels)
                    results.append(suspended)
                    failed |= suspended.startswith("failed")
                else:  # any unreachable process: 502, so Alertmanager retries (done ones are remembered)
                    failed |= any(outcome.startswith("failed") for _, outcome in outcomes)
                decision["result"] = "; ".join(results) or "ignored: no control endpoint known for this job/rank"
            log.info("%s action=%s -> %s", where, action or "-", decision["result"])
        return (502 if failed else 200), {"decisions": decisions}

    def _send(self, item: AlertItem, action: str, url: str, sent: set[tuple[str, str]]) -> str:
        key = (item.fingerprint or json.dumps(item.labels, sort_keys=True), item.starts_at, action, url)
        with self._lock:
            if key in self._done:
                return "already done"
        if (url, action) in sent:
            return "already sent in this payload"
        name = item.labels.get("alertname", "")
        if action == "stop":
            summary = item.annotations.get("summary", "")
            body: dict[str, Any] = {"reason": f"alert {name}: {summary}".strip(), "alert": name}
        else:
            body = {"steps": self.capture_steps}
        endpoint = f"{url}/v1/{action}"
        if self.dry_run:
            return f"dry run, would POST {endpoint} {json.dumps(body)}"
        try:
            status = self.sender(endpoint, body, self.control_token, self.timeout)
        except OSError as exc:
            return f"failed: {endpoint} unreachable ({exc})"
        if not 200 <= status < 300:
            return f"failed: {endpoint} answered {status}"
        sent.add((url, action))
        with self._lock:
            self._done[key] = None
            while len(self._done) > _REMEMBERED:
                self._done.popitem(last=False)
        return f"{action} sent ({status})"


    def _suspend(self, labels: Mapping[str, str]) -> str:
        assert self.kubernetes is not None
        namespace, job = labels.get(sc.SCRAPE_LABEL_NAMESPACE), labels.get(self.job_label)
        if not namespace or not job:
            return "failed: cannot suspend the Job: the alert has no namespace or job_name label"
        if self.dry_run:
            return f"dry run, would suspend Job {namespace}/{job}"
        try:
            status = self.kubernetes.suspend(namespace, job)
        except OSError as exc:
            return f"failed: Kubernetes API unreachable ({exc})"
        if not 200 <= status < 300:
            return f"failed: suspending Job {namespace}/{job} answered {status}"
        return f"Job {namespace}/{job} suspended ({status})"


class WebhookServer(BackgroundServer):
    poll_interval = 0.1

    def __init__(self, receiver: WebhookReceiver) -> None:
        super().__init__()
        self.receiver = receiver

    def _handler(self) -> type[QuietHandler]:
        receiver = self.receiver

        class Handler(QuietHandler):
            def _serve(self, method: str) -> None:
                raw_length = self.headers.get("Content-Length")
                try:
                    length = int(raw_length) if raw_length is not None else None
                    if length is not None and length < 0:
                        raise ValueError
                except ValueError:
                    status, answer = 400, {"error": "bad Content-Length"}
                else:
                    try:
                        status, answer = receiver.handle(method, self.path.split("?")[0],
                                                         self.headers.get("Authorization", ""), length,
                                                         self.rfile.read)
                    except Exception:
                        log.exception("internal error while handling a request")
                        status, answer = 500, {"error": "internal error"}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status in (411, 413, 401):
                    self.send_header("Connection", "close")
                    self.close_connection = True
                try:
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client hung up (e.g. still sending a body we refused)
                    self.close_connection = True

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
