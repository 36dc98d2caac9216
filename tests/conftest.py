from __future__ import annotations

import collections
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import otelprof
from otelprof import environment_variables as ev

# Variables that would change what a test's init() does.
_ISOLATE = [v.name for v in ev.ENV_VARS] + [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "TORCHELASTIC_RUN_ID",
    "KUBERNETES_SERVICE_HOST", "OTEL_RESOURCE_ATTRIBUTES_POD_NAME", "OTEL_RESOURCE_ATTRIBUTES_NODE_NAME",
]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in _ISOLATE:
        monkeypatch.delenv(name, raising=False)
    # A test that ran torch.compile leaves its frame and graph counts behind, and otelprof counts no FLOPs in a
    # process that compiled (a dispatch mode would make compiled frames recompile): each test starts as a fresh
    # process would.
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is not None:
        monkeypatch.setitem(dynamo.counters, "frames", collections.Counter())
        monkeypatch.setitem(dynamo.counters, "stats", collections.Counter())
    yield
    otelprof.shutdown()
    torch_integration = sys.modules.get("otelprof.integrations.torch")
    if torch_integration is not None:  # a test that failed half-way leaves no hook for the next one
        torch_integration.uninstrument()


@pytest.fixture
def record_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"
