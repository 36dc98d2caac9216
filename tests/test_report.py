"""otelprof report and otelprof check on the command line: the HTML page (self-contained, every section,
opened and screenshotted in headless Chromium), the JSON form, and bad input (corrupt lines, empty runs,
unknown schema, missing directories, unreachable Prometheus)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from otelprof.analysis.report import build_report, load
from otelprof.recording import schema
from otelprof.report.html import SECTIONS, render
from tests.servers import free_port
from tests.test_report_fixtures import T0, manifest, small_run, write_lines, write_rank

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--no-first-run")


def otelprof(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otelprof", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed; .ci/run must install it (Debian package chromium)")
    pytest.skip("chromium not installed (Debian package chromium)")


def test_html_is_self_contained_with_every_section(tmp_path: Path) -> None:
    html = render(build_report(load(small_run(tmp_path))))
    for anchor, _ in SECTIONS:
        assert f'<section id="{anchor}">' in html
    positions = [html.index(f'<section id="{anchor}">') for anchor, _ in SECTIONS]
    assert positions == sorted(positions)  # the original report's order
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing loaded from the network
    assert "<script" not in html and "<link" not in html
    assert html.count("<svg") >= 15
    assert "829 ms" in html and "aten::conv2d" in html and "OtelprofStepOutliers" in html


def test_html_renders_in_headless_chromium(tmp_path: Path) -> None:
    """Open the page in Chromium: the DOM it builds has every section, and each section is screenshotted."""
    browser = chromium()
    report = tmp_path / "report.html"
    report.write_text(render(build_report(load(small_run(tmp_path / "runs")))), encoding="utf-8")
    profile = tmp_path / "chromium-profile"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=120)

    dom = run("--dump-dom", report.as_uri())
    assert dom.returncode == 0, dom.stderr
    for anchor, _ in SECTIONS:
        assert f'id="{anchor}"' in dom.stdout
    assert dom.stdout.count("<svg") >= 15
    shots = tmp_path / "screenshots"
    shots.mkdir()
    style = report.read_text(encoding="utf-8")
    for anchor, _ in SECTIONS:
        page = tmp_path / f"section-{anchor}.html"
        page.write_text(style.replace("</style>", f"section:not(#{anchor}) {{ display: none }}</style>"),
                        encoding="utf-8")
        png = shots / f"{anchor}.png"
        result = run("--window-size=1280,1600", f"--screenshot={png}", page.as_uri())
        assert result.returncode == 0 and png.exists(), result.stderr
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, anchor  # a page with content, not blank
    keep = os.environ.get("OTELPROF_SCREENSHOTS")
    if keep:
        shutil.copytree(shots, keep, dirs_exist_ok=True)


def test_report_cli_html_and_json(tmp_path: Path) -> None:
    run = small_run(tmp_path / "runs")
    result = otelprof("report", str(run), "-o", str(tmp_path / "r.html"))
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout and (tmp_path / "r.html").read_text().startswith("<!doctype html>")
    assert "otelprof report" not in result.stderr  # progress only, no error
    result = otelprof("report", str(tmp_path / "runs"), "-o", str(tmp_path / "r.json"), "-q")  # newest run
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["summary"]["run_id"] == "run-1" and data["summary"]["duration"] == pytest.approx(18.25)
    assert data["steps"]["rows"][0]["durations"]["p99"] == pytest.approx(0.829)
    assert result.stderr == ""


def test_corrupt_lines_are_skipped_counted_and_reported(tmp_path: Path) -> None:
    run = small_run(tmp_path)
    write_lines(run / "rank-0" / schema.STEPS, ['{"k":"s","ph":"train","n":20,"t":1700000013'])
    write_lines(run / "rank-0" / schema.SAMPLES, ['{"t":1700000013000000000,"cpu":[0.1,'])
    report = build_report(load(run))
    assert report.summary.skipped_lines == 2
    assert report.steps.row(0, "train").durations.count == 20  # type: ignore[union-attr]
    html = render(report)
    assert "2 truncated or corrupt lines were skipped" in html
    result = otelprof("report", str(run), "-o", str(tmp_path / "r.html"))
    assert result.returncode == 0 and "2 truncated, corrupt or oversized lines" in result.stdout


def test_killed_run_without_shutdown(tmp_path: Path) -> None:
    run = tmp_path / "run"
    life = {"process_start": T0, "init": T0, "first_step_start": None, "last_step_end": None, "shutdown": None}
    write_rank(run, 0, manifest(lifecycle=life, status=schema.STATUS_RUNNING), small_steps_for_kill(),
               [{"t": int((T0 + 30) * 1e9), "pid": 1, "rss": 5}])
    report = build_report(load(run))
    assert report.summary.killed_ranks == (0,)
    assert report.summary.end == pytest.approx(T0 + 30)  # the last thing it recorded
    assert "never recorded a clean shutdown" in render(report)


def test_a_rank_that_got_sigterm_is_named_with_the_time(tmp_path: Path) -> None:
    """The manifest's SIGTERM time (a pod evicted or deleted) reaches the summary and the report; a value that is
    not a time is ignored."""
    run = tmp_path / "run"
    life = {"process_start": T0, "init": T0, "first_step_start": None, "last_step_end": None, "shutdown": T0 + 31}
    for rank, value in ((0, T0 + 30.5), (1, "soon"), (2, float("inf")), (3, True)):
        write_rank(run, rank, {**manifest(rank, world=4, lifecycle=life), schema.SIGTERM: value},
                   small_steps_for_kill())
    report = build_report(load(run))
    assert report.summary.terminated == ((0, T0 + 30.5),)
    assert [r.sigterm for r in report.summary.ranks] == [T0 + 30.5, None, None, None]
    html = render(report)
    assert re.search(r"Rank\(s\) 0 at [^<]*received SIGTERM", html) is not None


def small_steps_for_kill() -> list[dict[str, object]]:
    from tests.test_report_fixtures import step_line

    return [step_line("train", n, T0 + 5 + n, 1.0) for n in range(3)]


def test_empty_run_still_gets_a_report_saying_what_is_missing(tmp_path: Path) -> None:
    run = tmp_path / "empty"
    write_rank(run, 0, manifest(lifecycle={"process_start": T0, "shutdown": T0 + 2}))
    result = otelprof("report", str(run), "-o", str(tmp_path / "e.html"))
    assert result.returncode == 0, result.stderr
    assert "note: no steps" in result.stdout
    html = (tmp_path / "e.html").read_text()
    assert "No step information was recorded" in html and "This recording lacks" in html
    for anchor, _ in SECTIONS:
        assert f'<section id="{anchor}">' in html
    assert otelprof("report", str(run), "-o", str(tmp_path / "e.json")).returncode == 0
    assert otelprof("timeline", str(run), "-o", str(tmp_path / "t.json")).returncode == 0
    assert otelprof("check", str(run)).returncode == 0


def test_bad_input_exits_2_with_a_clear_message(tmp_path: Path) -> None:
    missing = otelprof("report", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    notrec = tmp_path / "plain"
    notrec.mkdir()
    (notrec / "x.txt").write_text("hi")
    result = otelprof("report", str(notrec))
    assert result.returncode == 2 and "not an otelprof recording" in result.stderr
    future = tmp_path / "future"
    write_rank(future, 0, manifest(schema_version="2.0"))
    for command in ("report", "timeline", "check"):
        result = otelprof(command, str(future))
        assert result.returncode == 2 and "schema 2.0" in result.stderr, (command, result.stderr)
    result = otelprof("compare", str(future), str(future))
    assert result.returncode == 2 and "schema 2.0" in result.stderr
    port = free_port()  # nothing listens there
    result = otelprof("report", "--prometheus", f"http://127.0.0.1:{port}", "--job", "x", "--timeout", "5")
    assert result.returncode == 2 and "cannot reach Prometheus" in result.stderr
    assert otelprof("report", "--prometheus", f"http://127.0.0.1:{port}").returncode == 2  # no --job
    assert otelprof("report").returncode == 2
    assert otelprof("report", str(future), "--set", "no_such_field=1").returncode == 2


def test_check_exits_1_when_a_check_fires(tmp_path: Path) -> None:
    run = small_run(tmp_path)
    ok = otelprof("check", str(run))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "0 of 20 checks fired" in ok.stdout and "OtelprofCPUBottleneck" in ok.stdout
    fired = otelprof("check", str(run), "--set", "max_initialization_time=5s")
    assert fired.returncode == 1
    line = next(x for x in fired.stdout.splitlines() if x.startswith("OtelprofSlowInitialization"))
    assert "FIRED" in line and "rank 0" in line
    as_json = otelprof("check", str(run), "--json", "--set", "max_initialization_time=5s")
    verdicts = {v["alert"]: v for v in json.loads(as_json.stdout)["checks"]}
    assert verdicts["OtelprofSlowInitialization"]["fired"] and as_json.returncode == 1
    assert verdicts["OtelprofSlowInitialization"]["status"] == "fired"
    # The GPU checks only judge after their warm-up (500 s), longer than this run: no data, not ok.
    assert verdicts["OtelprofGPUUnderutilized"]["status"] == "no data"
    warm = {v["alert"]: v for v in json.loads(otelprof("check", str(run), "--json", "--set",
                                                       "patience=5s").stdout)["checks"]}
    assert warm["OtelprofGPUUnderutilized"]["status"] == "ok" and warm["OtelprofGPUUnderutilized"]["datapoints"] > 0


def test_check_says_no_data_for_checks_with_nothing_to_judge(tmp_path: Path) -> None:
    """Without GPUs the GPU checks (and the bottleneck checks, which need a GPU below its threshold) judged
    nothing, even past their warm-up: "no data" in the table and in the JSON, never "ok". So do checks
    that never got past theirs, or never had enough to judge."""
    run = small_run(tmp_path, gpus=False)
    result = otelprof("check", str(run), "--set", "patience=5s")
    assert result.returncode == 0, result.stdout + result.stderr
    gpu_checks = ("CPUBottleneck", "IOBottleneck", "GPUUnderutilized", "GPUUtilizationFluctuating",
                  "BatchSizeTooSmall", "GPUMemoryIncrease", "GPUMemoryNearCapacity", "GPULoadImbalance")
    others = ("RankStraggler",  # one rank: no peers
              "VanishingGradients",  # no gradient norm recorded
              "HostMemoryIncrease", "LossNotDecreasing",  # the run ends before their warm-up (10 min, 30 min)
              "StepOutliers",  # never 100 steps in a window
              "LossSpike")  # 20 training losses: the spike test judges from the 21st
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith("Otelprof")}
    for short in (*gpu_checks, *others):
        assert lines["Otelprof" + short].split()[1:3] == ["no", "data"], lines["Otelprof" + short]
    assert lines["OtelprofTrainingStalled"].split()[1] == "ok"  # it judged the steps
    assert f"{len(gpu_checks) + len(others)} had no data to judge" in result.stdout
    verdicts = {v["alert"]: v for v in json.loads(otelprof("check", str(run), "--json", "--set",
                                                           "patience=5s").stdout)["checks"]}
    for short in gpu_checks:
        verdict = verdicts["Otelprof" + short]
        assert verdict["status"] == "no data" and verdict["datapoints"] == 0 and not verdict["fired"]
    assert verdicts["OtelprofTrainingStalled"]["status"] == "ok" and verdicts["OtelprofTrainingStalled"]["datapoints"]
