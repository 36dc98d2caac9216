"""Real Prometheus for tests: Debian's binary on 127.0.0.1, its own port and temp dir.

In CI (``CI`` set) a missing binary is a failure, never a skip: CI installs it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed; .ci/run must install it")
        pytest.skip(f"{name} not installed (Debian package prometheus / prometheus-alertmanager)")
    return path


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to ``bind(0)`` and outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_given: set[int] = set()
"""Ports already handed to a test in this session (a picked port is not bound until its process starts)."""


def free_port(span: int = 1) -> int:
    """A port p with p .. p + span - 1 free, below the kernel's ephemeral range and never given before in this
    session: a port picked now is bound later by a process the test starts, and meanwhile neither the kernel
    (gloo's sockets, a Prometheus' connections: ephemeral ports) nor another pick may take it."""
    high = _ephemeral_low() - span
    for _ in range(1000):
        base = random.randint(max(high - 12_000, 1024), high)
        wanted = range(base, base + span)
        if any(p in _given for p in wanted):
            continue
        sockets: list[socket.socket] = []
        try:
            for port in wanted:
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
        _given.update(wanted)
        return base
    raise RuntimeError("no free port below the ephemeral range")


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """Evaluate ``promql`` now, or at Unix time ``at``."""
        params = {"query": promql, **({"time": repr(at)} if at is not None else {})}
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def exemplars(self, promql: str, start: float, end: float) -> list[dict[str, Any]]:
        """``/api/v1/query_exemplars``: per series of ``promql``, its stored exemplars in [start, end]."""
        params = {"query": promql, "start": repr(start), "end": repr(end)}
        url = f"{self.url}/api/v1/query_exemplars?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return list(body["data"] or [])

    def wait_for(self, promql: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(promql)
            if result:
                return result
            time.sleep(0.5)
        raise AssertionError(f"no result for {promql} within {timeout} s")


@contextmanager
def prometheus(tmp_path: Path, targets: list[str], scrape_interval: str = "1s",
               rule_files: Sequence[Path] = (), features: Sequence[str] = ()) -> Iterator[Prometheus]:
    """A Prometheus scraping ``targets`` as job ``training``; ``features``: its ``--enable-feature`` flags."""
    binary = require_binary("prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [{"job_name": "training", "static_configs": [{"targets": targets}]}],
    }))
    log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", *(f"--enable-feature={f}" for f in features)],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("prometheus did not start:\n" + (tmp_path / "prometheus.log").read_text())
            time.sleep(0.2)
        yield Prometheus(url)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
