"""What a new user reads first is true: the README's recording files and schema, ``otelprof --help``, the names
``otelprof catalog`` prints, the deploy file table, the alerts example, what ``check`` says about findings and
alerts, and the placeholder tokens of the example Secrets."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import otelprof
from otelprof import semconv as sc
from otelprof.analysis import diagnosis
from otelprof.analysis.rule_row import RuleRow
from otelprof.analysis.rules import RulesSummary
from otelprof.analysis.stats import Distribution, Histogram
from otelprof.analysis.steps import PhaseSteps, StepAnalysis
from otelprof.mixin import MixinConfig
from otelprof.mixin.alert_text import humanize, humanize_duration, value_phrase
from otelprof.mixin.alerts import alerts
from otelprof.recording.schema import SCHEMA_VERSION
from otelprof.runtime.tokens import PLACEHOLDER_PREFIX
from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
CLI = [sys.executable, "-m", "otelprof"]

LOOP = """
import math, sys, time
import otelprof
otelprof.init(job_name="front-door", record_dir=sys.argv[1], profile_every=0)
for i in range(60):
    with otelprof.step():
        with otelprof.annotate("dataloader"):
            time.sleep(float(sys.argv[2]))
        with otelprof.annotate("forward"):
            time.sleep(0.008)
        otelprof.record("loss", math.nan if sys.argv[3] == "nan" and 30 <= i < 42 else 2.0 / (1 + i))
otelprof.shutdown()
"""
"""60 steps: ``sys.argv[2]`` seconds waiting for data and 8 ms of forward each, and (with ``nan``) 12 NaN losses."""


def _record(tmp_path: Path, name: str, wait: float, loss: str) -> Path:
    script = tmp_path / "loop.py"
    script.write_text(LOOP, encoding="utf-8")
    runs = tmp_path / name
    done = subprocess.run([sys.executable, str(script), str(runs), str(wait), loss], capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("OTEL")})
    assert done.returncode == 0, done.stderr
    [run] = list(runs.iterdir())
    return run


def _check(run: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "check", str(run), *extra], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp("nan"), "runs", 0.0, "nan")


# ---------------------------------------------------------------------------------------------- the README

def test_the_readme_names_every_file_a_run_writes_and_its_schema(nan_run: Path) -> None:
    [rank] = [p for p in nan_run.iterdir() if p.is_dir()]
    written = sorted(p.name for p in rank.iterdir() if not p.name.startswith("."))
    row = next(line for line in README.splitlines() if line.startswith("| Local run recording"))
    assert sorted(re.findall(r"`([a-z]+\.jsonl?)`", row)) == written
    assert f"(schema {SCHEMA_VERSION};" in README
    assert json.loads((rank / "manifest.json").read_text())["schema_version"] == SCHEMA_VERSION


def test_help_names_what_the_command_does() -> None:
    out = subprocess.run([*CLI, "--help"], capture_output=True, text=True, timeout=60).stdout
    description = " ".join(out.split("positional arguments:")[0].split())
    assert "runs the demo and inspects settings" not in description
    for command in ("otelprof run", "report", "check", "compare", "timeline", "mixin", "webhook", "env", "catalog"):
        assert command in description, command


def test_every_name_the_catalog_prints_is_one_prometheus_serves() -> None:
    """Copied from ``otelprof catalog`` into a query, a name finds its series: counters carry ``_total``."""
    listed = subprocess.run([*CLI, "catalog"], capture_output=True, text=True, timeout=60).stdout.splitlines()
    names = {line.split()[0] for line in listed}
    assert names == {m.query_name for m in sc.METRICS}
    assert all(m.query_name.endswith("_total") for m in sc.METRICS if m.kind is sc.Kind.COUNTER)
    session = otelprof.init(job_name="catalog", record=False, metrics_exporters=("prometheus",), prometheus_port=0,
                            profile_every=0)
    try:
        assert isinstance(session, otelprof.Session) and session.metrics_address is not None
        for i in range(5):
            with otelprof.step():
                with otelprof.annotate("forward"):
                    pass
                otelprof.record("loss", 1.0 / (1 + i))
        host, port = session.metrics_address
        text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
    finally:
        otelprof.shutdown()
    served = {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    families = {family.name for family in text_string_to_metric_families(text)}
    seen = [m for m in sc.METRICS if m.prometheus_name in families]
    assert len(seen) >= 10  # steps, step durations, regions, scalars, ...
    for m in seen:
        queried = m.query_name if m.kind is not sc.Kind.HISTOGRAM else m.query_name + "_count"
        assert queried in served, m.name


# ---------------------------------------------------------------------------------------------- the docs

def test_the_deploy_table_covers_every_file_mixin_writes(tmp_path: Path) -> None:
    out = tmp_path / "mixin"
    subprocess.run([*CLI, "mixin", "-o", str(out)], check=True, capture_output=True, timeout=120)
    table = [line for line in (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8").splitlines()
             if line.startswith("| `")]
    named = [name for line in table for name in re.findall(r"`([^`]+)`", line.split(" | ")[0])]
    for path in sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()):
        covered = any(path == n or (n.endswith("/") and path.startswith(n))
                      or ("*" in n and re.fullmatch(n.replace(".", r"\.").replace("*", "[^/]+"), path))
                      for n in named)
        assert covered, f"docs/deploy.md's file table does not name {path}"


def test_each_setting_of_the_alerts_example_changes_the_mixin(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "alerts.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "--set" in b)
    words = shlex.split(block.replace("\\\n", " "))
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    assert len(sets) >= 3

    def written(*settings: str) -> dict[str, str]:
        out = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
        args = [a for s in settings for a in ("--set", s)]
        subprocess.run([*CLI, "mixin", "--out", str(out), *args], check=True, capture_output=True, timeout=120)
        return {p.relative_to(out).as_posix(): p.read_text(encoding="utf-8") for p in out.rglob("*")
                if p.is_file() and p.name != ".otelprof-mixin.json"}

    every = written(*sets)
    for setting in sets:
        assert written(*(s for s in sets if s != setting)) != every, f"{setting} changes nothing"


# ---------------------------------------------------------------------------------------------- check's words

def test_a_check_finding_is_titled_by_its_alert_and_quotes_its_value_in_words(nan_run: Path) -> None:
    done = _check(nan_run, "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    [finding] = [f for f in report["diagnosis"]["findings"] if f["key"] == "check:NonFiniteValues"]
    assert finding["title"] == "The loss or the gradient norm became NaN or infinite"
    assert re.search(r"when it first fired: \d+ non-finite values recorded in steps over the last 10m$",
                     finding["evidence"]), finding["evidence"]
    assert "record(" not in finding["title"] and "value " not in finding["evidence"]


def test_findings_without_a_fired_check_are_said_to_be_no_alert(tmp_path: Path) -> None:
    run = _record(tmp_path, "runs", 0.004, "finite")  # a third of each step waits for data: a cost, no alert
    done = _check(run)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Waiting for data" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("The 1 finding above is what the analyses")
    assert "only a fired check makes otelprof check exit 1" in done.stdout


@pytest.mark.parametrize("value", [0.0, 0.31, 1.0, 1234.5, 5e-9, -2500.0, 1e7])
def test_values_are_rendered_as_prometheus_renders_them(value: float) -> None:
    expected = {0.0: "0", 0.31: "310m", 1.0: "1", 1234.5: "1.234k", 5e-9: "5n", -2500.0: "-2.5k", 1e7: "10M"}
    assert humanize(value) == expected[value]


def test_durations_and_phrases() -> None:
    assert [humanize_duration(v) for v in (0.25, 5, 65, 4000, 200000)] == \
        ["250ms", "5s", "1m 5s", "1h 6m 40s", "2d 7h 33m 20s"]
    by_name = {a.short: a for a in alerts(MixinConfig())}
    assert value_phrase(by_name["StepOutliers"].description, 0.31) == \
        "outlier steps lost 31% of the last 10m's step time (their time above the median step)"
    assert value_phrase(by_name["TooManyDataLoaderWorkers"].description, 9) == \
        "runs 9 data-loader workers in total, more than 200 % of the CPUs the container may use"
    for alert in by_name.values():  # no label left over, parentheses balanced
        phrase = value_phrase(alert.description, 0.5)
        assert "{{" not in phrase and phrase.count("(") == phrase.count(")"), alert.short


def test_outlier_evidence_leaves_out_what_prometheus_cannot_know() -> None:
    """From Prometheus an outlier's threshold and the slowest step are unknown (NaN): the finding says so in
    words instead of "slower than -"."""
    nan = float("nan")
    row = PhaseSteps(0, "node", "train", Distribution(100, 0.1, nan, nan, 0.09, 0.2, 0.3, nan), nan, 7, (),
                     Histogram((), ()), None, None, None)
    fired = RuleRow("OtelprofStepOutliers", "", "warning", "", "", True, 3, 10, 10, None, None, (), ())
    found = diagnosis._outliers(RulesSummary(60.0, (fired,), ()), StepAnalysis(3.0, (row,), ()), None)  # type: ignore[arg-type]
    assert found is not None and " -" not in found.evidence and "(median 90 ms)" in found.evidence, found.evidence


# ---------------------------------------------------------------------------------------------- placeholder tokens

@pytest.mark.parametrize("variable", ["OTELPROF_WEBHOOK_TOKEN", "OTELPROF_CONTROL_TOKEN"])
def test_the_webhook_refuses_the_examples_placeholder_tokens(variable: str) -> None:
    env = {**os.environ, "OTELPROF_WEBHOOK_TOKEN": "a-real-secret", "OTELPROF_CONTROL_TOKEN": "another-secret",
           variable: f"{PLACEHOLDER_PREFIX}-webhook-token"}
    done = subprocess.run([*CLI, "webhook", "--port", str(free_port())], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "placeholder" in line and "Traceback" not in line


def test_the_control_endpoint_does_not_start_with_a_placeholder_token(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        session = otelprof.init(job_name="placeholder", record=False, control_port=free_port(),
                                control_token="change-me-control-token", profile_every=0)
        try:
            assert isinstance(session, otelprof.Session) and session.control is None
            with otelprof.step():
                pass  # training goes on
        finally:
            otelprof.shutdown()
    warned = [r.getMessage() for r in caplog.records if "placeholder" in r.getMessage()]
    assert len(warned) == 1 and "control endpoint is not started" in warned[0]


def test_the_example_secrets_ship_placeholders_that_are_refused() -> None:
    """The documented tokens are what the refusal catches (a renamed placeholder would slip through)."""
    kustomization = (ROOT / "deploy" / "kubernetes" / "base" / "kustomization.yaml").read_text(encoding="utf-8")
    tokens = re.findall(r"token=([\w-]+)", kustomization)
    assert tokens and all(t.startswith(PLACEHOLDER_PREFIX) for t in tokens)
    assert "replace the example tokens" in textwrap.dedent(
        (ROOT / "deploy" / "README.md").read_text(encoding="utf-8")).lower()


def test_the_packaged_copies_say_they_are_generated_and_from_where() -> None:
    from otelprof.mixin.deploy import PACKAGE_FILES, PACKAGED

    readme = (ROOT / PACKAGE_FILES / "README.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|$", readme, re.M))
    assert rows == {name: source.as_posix() for name, source in PACKAGED.items()}
    assert readme.startswith("# Generated: do not edit")
