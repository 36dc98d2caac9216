from __future__ import annotations

import collections
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import otelprof
from otelprof import environment_variables as ev

# Variables that would change what a test's init() does.
_ISOLATE = [v.name for v in ev.ENV_VARS] + [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "TORCHELASTIC_RUN_ID",
    "KUBERNETES_SERVICE_HOST", "OTEL_RESOURCE_ATTRIBUTES_POD_NAME", "OTEL_RESOURCE_ATTRIBUTES_NODE_NAME",
]

# The optional extras' top-level modules (pyproject.toml): a test module that cannot import one is skipped,
# naming the extra, so the suite collects with the `dev` extra alone.
OPTIONAL_MODULES = {
    "torch": "torch", "numpy": "torch", "orjson": "fast", "fsspec": "storage", "s3fs": "storage",
    "lightning": "lightning", "pytorch_lightning": "lightning", "transformers": "hf", "accelerate": "hf",
    "pynvml": "gpu",
}
# TESTS_NO_SKIP=1 (the Makefile's test target, which installs every extra): any skip fails the session.
NO_SKIP = "TESTS_NO_SKIP"


class _ExtraModule(pytest.Module):
    """A test module whose import fails for want of an optional extra is skipped with the extra's name."""

    def _getobj(self) -> Any:
        try:
            return super()._getobj()
        except pytest.Collector.CollectError as error:
            missing = error.__cause__
            if isinstance(missing, ModuleNotFoundError):
                extra = OPTIONAL_MODULES.get((missing.name or "").partition(".")[0])
                if extra is not None:
                    pytest.skip(f"{self.path.name} needs the {extra} extra (pip install -e '.[{extra}]'): "
                                f"no module named {missing.name!r}", allow_module_level=True)
            raise


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module:
    return _ExtraModule.from_parent(parent, path=module_path)


_skipped: list[str] = []


def _note_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append(f"{report.nodeid}: {reason}")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_skip(report)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_skip(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get(NO_SKIP) == "1" and _skipped and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if os.environ.get(NO_SKIP) == "1" and _skipped:
        terminalreporter.section(f"{NO_SKIP}=1: nothing may skip", sep="=", red=True)
        for line in _skipped:
            terminalreporter.write_line(f"SKIPPED {line}")


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
