"""otelprof compare: before/after figures of two fixture runs, computed by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from otelprof.analysis.compare import change, compare
from otelprof.recording.reader import read_recording
from tests.test_report_fixtures import small_run

approx = pytest.approx


def _runs(tmp_path: Path) -> tuple[Path, Path]:
    before = small_run(tmp_path, "before")
    after = small_run(tmp_path, "after", train_step=0.05)  # 19 steps of 0.05 s, then the 1.0 s one
    return before, after


def test_figures_and_changes(tmp_path: Path) -> None:
    before, after = _runs(tmp_path)
    result = compare([("before", read_recording(before, samples=True)), ("after", read_recording(after, samples=True))],
                     price_per_hour=3.6)
    a, b = result.runs
    assert (a.steps, a.step_p50, a.step_p95) == (20, approx(0.1), approx(0.145))
    assert (b.steps, b.step_p50, b.step_p95) == (20, approx(0.05), approx(0.0975))
    assert a.throughput == approx(640 / 2.9) and b.throughput == approx(640 / 1.95)
    assert (a.duration, b.duration) == (approx(18.25), approx(17.3))
    assert (a.training_duration, b.training_duration) == (approx(3.25), approx(2.3))
    assert a.gpu_utilization == approx(0.475) and a.cpu_utilization == approx(0.55)
    assert a.cost == approx(3.6 * 18.25 / 3600) and b.cost == approx(3.6 * 17.3 / 3600)
    assert a.cost_per_million_samples == approx(a.cost / 640 * 1e6)  # type: ignore[operator]
    assert change(a.step_p50, b.step_p50) == approx(-0.5)
    assert change(None, 1.0) is None and change(0.0, 1.0) is None


def test_cli_table_markdown_and_json(tmp_path: Path) -> None:
    before, after = _runs(tmp_path)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "otelprof", "compare", *args], capture_output=True, text=True,
                              timeout=120)

    text = run(str(before), str(after), "--price-per-hour", "3.6")
    assert text.returncode == 0, text.stderr
    p50 = next(line for line in text.stdout.splitlines() if line.startswith("Step time p50"))
    assert "100 ms" in p50 and "50 ms" in p50 and "-50.0 %" in p50
    assert "Cost" in text.stdout and "after vs before" in text.stdout
    markdown = run(str(before), str(after), "--format", "markdown")
    assert markdown.stdout.startswith("| metric | before | after | after vs before |")
    assert "Cost" not in markdown.stdout  # no price given
    data = json.loads(run(str(before), str(after), "--format", "json").stdout)
    assert [r["name"] for r in data["runs"]] == ["before", "after"] and data["runs"][1]["steps"] == 20
    assert run(str(before)).returncode == 2
    assert run(str(before), str(tmp_path / "missing")).returncode == 2
