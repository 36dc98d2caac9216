"""The mixin settings, documented from the source and taken alike by every command that judges with them.

docs/mixin-settings.md is generated from MixinConfig (its docstrings, and what each field reaches when it alone
changes); ``otelprof check`` and ``otelprof report`` take the same ``--config FILE`` as ``otelprof mixin``, with
``--set`` after it winning, and refuse a bad file in one line (exit 2).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from otelprof import cli
from otelprof.cli.generate import DOC_BLOCKS, render_blocks
from otelprof.mixin import settings_doc as sd
from otelprof.mixin.alerts import alerts
from otelprof.mixin.bundle import render
from otelprof.mixin.config import MixinConfig, from_settings, with_overrides

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "mixin-settings.md"
FIELDS = [f.name for f in dataclasses.fields(MixinConfig)]
RULE_FILES = re.compile(r"^(otelprof-(alerts|rules|prometheusrule)\.yaml|runbook\.md|tests/|scale/)")
"""Bundle files that carry the rules the table's alerts and recording-rules columns describe."""


# ---- the meanings


def test_every_setting_has_a_meaning_of_its_own() -> None:
    settings = sd.settings()
    assert [s.name for s in settings] == FIELDS
    for s in settings:
        assert s.meaning, f"{s.name} has no docstring in otelprof/mixin/config.py"
        assert not s.meaning.startswith("..."), f"{s.name}'s docstring continues another's: it must stand alone"
        assert s.section, f"{s.name} is in no '# ---- ' section of MixinConfig"


def test_each_meaning_names_the_alerts_it_sets() -> None:
    """A field that sets one or two alerts' expression or ``for`` names them in its docstring or section heading:
    what the docstring says agrees with what the code does."""
    by_name = {s.name: s for s in sd.settings()}
    for name, uses in sd.all_uses().items():
        if uses.base or not 0 < len(uses.alerts) <= 2:
            continue
        text = by_name[name].meaning + " " + by_name[name].section
        for alert in uses.alerts:
            assert alert.removeprefix("Otelprof") in text, f"{name} sets {alert} but its docstring does not say so"


KINDS = {"ServiceMonitor", "AlertmanagerConfig", "PrometheusRule"}
"""Kubernetes kinds the docstrings name, the only CamelCase words besides alerts."""


def test_a_docstring_names_only_alerts_that_exist() -> None:
    names = {a.short for a in alerts(MixinConfig())} | KINDS
    for s in sd.settings():
        for word in re.findall(r"\b[A-Z][A-Za-z]*[a-z][A-Z][A-Za-z]*[a-z]\b", s.meaning):
            assert word in names, f"{s.name}'s docstring names {word}, which is no alert"


# ---- what a setting reaches


def test_the_input_bound_threshold_reaches_its_alert_and_panels() -> None:
    uses = sd.uses("input_bound_threshold")
    assert uses.alerts == ("OtelprofInputBound",) and not uses.alert_texts and not uses.records
    assert ("Ranks", "Data wait share per rank") in uses.panels
    before = {a.name: a.expr for a in alerts(MixinConfig())}["OtelprofInputBound"]
    after = {a.name: a.expr for a in alerts(MixinConfig(input_bound_threshold=0.3))}["OtelprofInputBound"]
    assert before.endswith("> 0.5") and after.endswith("> 0.3")


def test_a_renamed_recording_rule_is_the_same_rule() -> None:
    """A window in a rule's name: the table names the rule as the defaults do, once."""
    uses = sd.uses("input_bound_window")
    assert uses.records == ("otelprof:dataloader_wait_ratio:mean_5m",)
    assert sd.uses("recording_interval").records == ("group otelprof-recording", "group otelprof-recording-system")


def test_texts_only_settings_are_told_apart() -> None:
    """The outlier test's settings are the training process's: they change the runbook's words, not the rule."""
    uses = sd.uses("step_outlier_sigma")
    assert uses.alert_texts == ("OtelprofStepOutliers",) and not uses.alerts


def test_the_dcgm_settings_are_found_on_the_dcgm_source() -> None:
    for name in ("dcgm_selector", "dcgm_pod_label", "dcgm_namespace_label"):
        uses = sd.uses(name)
        assert uses.base and "group otelprof-dcgm" in uses.records, name


def test_the_panels_found_agree_with_the_dashboards_tests() -> None:
    """Two searches of the same fact: the dashboards' own test lists the fields some panel reads."""
    from tests.test_dashboards_config import USED

    assert {name for name, uses in sd.all_uses().items() if uses.panels and not uses.base} == USED


def test_every_setting_reaches_something_and_the_other_files_are_true() -> None:
    """A field that reaches no alert, rule or panel is one whose files the table names, and exactly those files
    (besides the rules' own: a PrometheusRule by its metadata) change with it."""
    from otelprof.mixin.generate import prometheus_rule

    found = sd.all_uses()
    quiet = {name for name, uses in found.items() if uses.empty}
    assert quiet <= set(sd.OTHER_FILES), f"settings that reach nothing: {sorted(quiet - set(sd.OTHER_FILES))}"
    base = render(sd.DEFAULT)
    for name, files in sd.OTHER_FILES.items():
        config = dataclasses.replace(sd.DEFAULT, **{name: sd.perturbed(name)})
        changed = render(config)
        other = {str(path) for path in base if base[path] != changed[path] and not RULE_FILES.match(str(path))}
        if prometheus_rule(config)["metadata"] != prometheus_rule(sd.DEFAULT)["metadata"]:
            other.add("otelprof-prometheusrule.yaml")
        assert other == set(files), name


def test_no_other_setting_reaches_the_deployment_documents() -> None:
    """The documents built from the config besides rules and dashboards change only with the settings the table
    names for their files (each setting changed alone; the documents are cheap to build, the bundle is not)."""
    from otelprof.mixin import routing
    from otelprof.mixin.generate import prometheus_rule

    documents = {
        "kubernetes/alertmanagerconfig.yaml": routing.alertmanager_config,
        "kubernetes/kube-prometheus-stack-values.yaml": routing.stack_values,
        "otelprof-prometheusrule.yaml": lambda config: prometheus_rule(config)["metadata"],
    }
    for name in FIELDS:
        if name in sd.NOT_PERTURBED:
            continue
        config = dataclasses.replace(sd.DEFAULT, **{name: sd.perturbed(name)})
        changed = {file for file, build in documents.items() if build(config) != build(sd.DEFAULT)}
        assert changed == set(sd.OTHER_FILES.get(name, ())) & set(documents), name


def test_the_table_names_every_setting_and_the_alerts_it_sets() -> None:
    text = DOC.read_text(encoding="utf-8")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \| .*$", text, re.MULTILINE)}
    assert set(FIELDS) <= set(rows)
    assert "`OtelprofInputBound`" in rows["input_bound_threshold"]
    assert "Data wait share per rank" in rows["input_bound_threshold"]
    by_alert = re.search(r"^\| `OtelprofInputBound` \| (.*) \| (.*) \|$", text, re.MULTILINE)
    assert by_alert is not None
    assert by_alert.group(1) == "`input_bound_threshold`, `input_bound_window`, `input_bound_for`"


def test_a_stale_settings_table_is_caught() -> None:
    text = DOC.read_text(encoding="utf-8")
    stale = text.replace("| `input_bound_threshold` | `0.5` |", "| `input_bound_threshold` | `0.6` |", 1)
    assert stale != text
    assert render_blocks(stale, DOC_BLOCKS["docs/mixin-settings.md"]) == text


def test_the_alerts_and_development_pages_link_the_table() -> None:
    for page in ("alerts.md", "development.md"):
        assert "(mixin-settings.md" in (ROOT / "docs" / page).read_text(encoding="utf-8"), page


# ---- one loader for mixin, check and report


def test_the_file_comes_first_and_set_wins(tmp_path: Path) -> None:
    file = tmp_path / "mixin.json"
    file.write_text(json.dumps({"input_bound_threshold": 0.9, "window": "5m", "disabled_alerts": ["Overfitting"],
                                "actions": {"InputBound": "stop"}}), encoding="utf-8")
    config = from_settings(str(file), ["input_bound_threshold=0.3"])
    assert config == with_overrides(MixinConfig(), ["input_bound_threshold=0.3", "window=5m",
                                                    "disabled_alerts=Overfitting", "actions=InputBound:stop"])
    assert from_settings(None, None) == MixinConfig()


JOB = """
import time, otelprof
otelprof.init(job_name="settings", record_dir={record_dir!r}, system_metrics=False)
for i in range(60):
    with otelprof.step():
        with otelprof.annotate("dataloader"):
            time.sleep(0.03)
        time.sleep(0.003)
        otelprof.record("loss", 1.0)
otelprof.shutdown()
"""
"""Steps that wait about 90 % of their time for data: InputBound fires at 0.5, not at 0.99."""


@pytest.fixture(scope="module")
def input_bound_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    record_dir = tmp_path_factory.mktemp("settings") / "runs"
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", JOB.format(record_dir=str(record_dir))], env=env, check=True,
                   timeout=120, capture_output=True)
    return record_dir


def _file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _check(run: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    rc = cli.main(["check", "--json", "-q", "--interval", "1", *args, str(run)])
    out, err = capsys.readouterr()
    assert rc in (0, 1), err
    checks = {row["alert"]: row for row in json.loads(out)["checks"]}
    return rc, checks["OtelprofInputBound"]


def test_check_judges_with_the_config_file(input_bound_run: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    quick = _file(tmp_path, "quick.yaml", "input_bound_for: 0s\n")
    strict = _file(tmp_path, "strict.yaml", "input_bound_for: 0s\ninput_bound_threshold: 0.99\n")
    rc, row = _check(input_bound_run, capsys, "--config", quick)
    assert row["fired"] and rc == 1
    rc, row = _check(input_bound_run, capsys, "--config", strict)
    assert not row["fired"] and row["status"] == "ok" and rc == 0
    rc, row = _check(input_bound_run, capsys, "--config", strict, "--set", "input_bound_threshold=0.5")
    assert row["fired"] and rc == 1  # --set after the file wins
    rc, row = _check(input_bound_run, capsys, "--config", _file(tmp_path, "strict.json", json.dumps(
        {"input_bound_for": "0s", "input_bound_threshold": 0.99})))
    assert not row["fired"]


def _input_bound(report: dict[str, Any]) -> dict[str, Any]:
    return next(row for row in report["rules"]["rows"] if row["alert"] == "OtelprofInputBound")


def test_report_judges_with_the_config_file(input_bound_run: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    def report(config: str) -> tuple[str, dict[str, Any]]:
        output = tmp_path / "report.json"
        assert cli.main(["report", "-q", "-o", str(output), "--config", config, str(input_bound_run)]) == 0
        out, err = capsys.readouterr()
        assert not err
        return out, json.loads(output.read_text(encoding="utf-8"))

    out, data = report(_file(tmp_path, "quick.yaml", "input_bound_for: 0s\n"))
    assert "checks that fired: OtelprofInputBound" in out
    assert _input_bound(data)["triggered"]
    out, data = report(_file(tmp_path, "strict.yaml", "input_bound_for: 0s\ninput_bound_threshold: 0.99\n"))
    assert "OtelprofInputBound" not in out
    assert not _input_bound(data)["triggered"]


BAD_FILES = {
    "missing": (None, "cannot read the config file"),
    "not a mapping": ("- input_bound_threshold\n", "must be a mapping of mixin settings"),
    "broken YAML": ("input_bound_threshold: [0.5\n", "cannot read the config file"),
    "broken JSON": ('{"input_bound_threshold": }', "cannot read the config file"),
    "unknown setting": ("input_bound_treshold: 0.5\n", "unknown mixin setting 'input_bound_treshold'"),
    "not a number": ("input_bound_threshold: high\n", "input_bound_threshold must be a number, not 'high'"),
    "bad duration": ("input_bound_window: soon\n", "not a duration: 'soon'"),
    "nested": ("input_bound_threshold: [[0.5]]\n", "input_bound_threshold must be a number"),
}


@pytest.mark.parametrize("command", ["check", "report"])
@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_config_file_is_one_line_and_exit_2(command: str, case: str, input_bound_run: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    text, message = BAD_FILES[case]
    name = "settings.json" if "JSON" in case else "settings.yaml"
    path = tmp_path / name if text is None else Path(_file(tmp_path, name, text))
    args = ["-o", str(tmp_path / "r.json")] if command == "report" else []
    rc = cli.main([command, "-q", *args, "--config", str(path), str(input_bound_run)])
    out, err = capsys.readouterr()
    assert rc == 2
    assert not out and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"otelprof {command}: ") and message in err, err
    assert not (tmp_path / "r.json").exists()


def test_a_bad_set_after_a_good_file_is_one_line(input_bound_run: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    good = _file(tmp_path, "good.yaml", "input_bound_for: 0s\n")
    assert cli.main(["check", "-q", "--config", good, "--set", "input_bound_threshold=x", str(input_bound_run)]) == 2
    _, err = capsys.readouterr()
    assert err == "otelprof check: input_bound_threshold must be a number, not 'x'\n"
