"""Each alert is one declaration, and what the rest of otelprof knows about it is read from there and kept true.

Its settings (``knobs``) are found, not trusted: every MixinConfig field is changed alone (from the default config
and from ``gpu_source=dcgm``) and an alert must declare exactly the fields whose change changes its rule or
runbook entry. Its config-independent fields never change with the config. Its offline twin is where ``offline``
says, its promtool cases are in the files ``cases`` names and nowhere else, and the report's sections, the
dashboard links and the docs' table follow the declarations.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from otelprof.analysis import checks, diagnosis
from otelprof.analysis.check_context import CheckContext
from otelprof.analysis.rule_row import RuleRow
from otelprof.mixin import alert_model as am
from otelprof.mixin.alert_model import Alert, Runbook
from otelprof.mixin.alerts_table import alerts_markdown
from otelprof.mixin.built_in_groups import BUILT_IN
from otelprof.mixin.config import MixinConfig
from otelprof.mixin.declared import declared, offline_twins, section_checks
from otelprof.mixin.generate import render_runbook
from otelprof.mixin.tensor_rules import BY_NAME
from tests.rules import cases
from tests.test_dashboards_config import _perturbed

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = MixinConfig()
DCGM = dataclasses.replace(DEFAULT, gpu_source="dcgm")
STATIC = ("panel", "section", "kind", "knobs", "offline", "cases", "no_for", "dashboard", "group")
"""The fields of a declaration that no setting changes."""


def _built(config: MixinConfig) -> dict[str, Alert]:
    return {alert.short: alert for group in BUILT_IN for alert in group.build(config)}


def _what_it_says(alert: Alert) -> tuple[Any, ...]:
    """What a setting can change of an alert: its rule and runbook entry (the links' bases are global)."""
    return (alert.expr, alert.for_, alert.severity, alert.summary, alert.description, alert.labels, alert.runbook)


def test_an_alert_is_declared_with_named_fields_only() -> None:
    runbook = Runbook(meaning="m", thresholds=(), todo="t", deviations="d", limit="l")
    with pytest.raises(TypeError):
        Alert("X", "g", "vector(1)", "0s", "info", "s", "d", "uid", (), runbook,  # type: ignore[misc]
              None, "rules", am.RISK, (), None, ())
    alert = Alert(short="X", group="g", expr="vector(1)", for_="0s", severity="info", summary="s", description="d",
                  dashboard="uid", labels=(), runbook=runbook, panel=None, section="rules", kind=am.RISK, knobs=(),
                  offline=None, cases=())
    assert alert.name == "OtelprofX" and alert.no_for == "" and alert.action is None


def test_each_alert_declares_exactly_the_settings_it_reads() -> None:
    fields = [f.name for f in dataclasses.fields(MixinConfig)]
    found: dict[str, set[str]] = {short: set() for short in _built(DEFAULT)}
    for base in (DEFAULT, DCGM):
        before = _built(base)
        for name in fields:
            if name == "gpu_source" and base is DCGM:
                continue
            after = _built(dataclasses.replace(base, **{name: _perturbed(name)}))
            assert set(after) == set(before), name
            for short, alert in after.items():
                for static in STATIC:
                    assert getattr(alert, static) == getattr(before[short], static), (short, static, name)
                if _what_it_says(alert) != _what_it_says(before[short]):
                    found[short].add(name)
    for short, alert in _built(DEFAULT).items():
        assert set(alert.knobs) == found[short] - set(am.SHARED_KNOBS), short
        assert len(alert.knobs) == len(set(alert.knobs)), short
    assert found["GPUTelemetryAbsent"] >= {"gpu_source", "dcgm_pod_label"}  # read only with gpu_source=dcgm
    assert "loss_window" in found["LossNotDecreasing"] and "selector" in found["LossNotDecreasing"]


def test_the_declared_fields_name_what_exists() -> None:
    sections = {*diagnosis.SECTIONS, "summary", "rules"}
    files = set(cases.FILES)
    for alert in declared():
        assert alert.section in sections, alert.short
        assert alert.kind in am.KINDS, alert.short
        assert alert.offline is None or alert.offline in am.OFFLINE, alert.short
        assert alert.cases and set(alert.cases) <= files, alert.short
        assert bool(alert.no_for) == (alert.for_ == "0s"), alert.short  # a reason exactly when it has no `for`
    assert {a.kind for a in declared()} == set(am.KINDS)


def test_each_alert_s_promtool_cases_are_in_the_files_it_names() -> None:
    """Every file an alert names holds a case of it, no other file does, and together they hold a firing and a
    quiet one."""
    held: dict[str, set[str]] = {}
    firing: set[str] = set()
    quiet: set[str] = set()
    for file, groups in cases.all_groups().items():
        for group in groups:
            for test in group.alert_tests:
                held.setdefault(test["alertname"], set()).add(file)
                (firing if test["exp_alerts"] else quiet).add(test["alertname"])
    for alert in declared():
        assert held.get(alert.name) == set(alert.cases), alert.short
        assert alert.name in firing and alert.name in quiet, alert.short


def test_the_offline_twins_are_where_the_declarations_say() -> None:
    ctx = CheckContext([], DEFAULT)
    assert {group.where for group in checks.GROUPS} | {am.OFFLINE_TENSORS} == set(am.OFFLINE)
    for group in checks.GROUPS:
        assert tuple(group.conditions(ctx)) == offline_twins(group.where), group.where
    assert {f"Otelprof{short}" for short in offline_twins(am.OFFLINE_TENSORS)} == set(BY_NAME)
    twinned = tuple(a.short for a in declared() if a.offline in {g.where for g in checks.GROUPS})
    assert twinned == checks.OFFLINE_CHECKS
    assert set(twinned) >= checks.HALF


def test_the_report_reads_each_alert_s_section_and_kind() -> None:
    """A fired risk becomes a finding of its own in its declared section; a cause or symptom is left to the
    analysis' findings that weigh it (none of its own)."""
    derived = section_checks(diagnosis.SECTIONS)
    assert derived == diagnosis.SECTION_CHECKS
    for alert in declared():
        assert (alert.short in diagnosis.MAPPED) == (alert.kind != am.RISK), alert.short
        if alert.kind == am.RISK:
            row = RuleRow(alert.name, "", alert.severity, alert.description, "", True, 3, 10, 100, 1.0, 0.5,
                          ("rank 0",), (), summary=alert.summary)
            finding = diagnosis._check_finding(row)
            assert (finding.section, finding.kind) == (alert.section, am.RISK), alert.short
        if alert.section in diagnosis.SECTIONS:
            assert alert.short in diagnosis.SECTION_CHECKS[alert.section]


def test_the_docs_table_has_a_row_per_declaration_linking_its_runbook_entry() -> None:
    table = alerts_markdown().splitlines()[2:]
    assert len(table) == len(declared())
    headings = {line[3:].lower() for line in render_runbook(DEFAULT).splitlines() if line.startswith("## ")}
    for row, alert in zip(table, declared()):
        anchor = re.search(r"runbook\.md#([a-z]+)\)", row)
        assert anchor and anchor.group(1) == alert.anchor and alert.anchor in headings, row
        assert alert.summary in row and all(f"`{knob}`" in row for knob in alert.knobs), row
    assert "<!-- BEGIN alerts -->" in (ROOT / "docs" / "alerts.md").read_text(encoding="utf-8")


def test_otelprof_generate_writes_the_promtool_cases_of_a_checkout(tmp_path: Path) -> None:
    """The promtool cases are regenerated by ``otelprof generate`` (no second step): it runs the checkout's
    ``tests/rules/cases.py`` and reports what that rewrote; without a checkout's tests it writes none."""
    from otelprof.cli.generate import _generate_rule_tests

    assert _generate_rule_tests(tmp_path) == []
    rules = tmp_path / "tests" / "rules"
    rules.mkdir(parents=True)
    for package in (tmp_path / "tests", rules):
        (package / "__init__.py").write_text("", encoding="utf-8")
    written = rules / "x_test.yaml"
    (rules / "cases.py").write_text(f"from pathlib import Path\nPath({str(written)!r}).write_text('t')\n"
                                    f"print('updated {written}')\n", encoding="utf-8")
    assert _generate_rule_tests(tmp_path) == [written] and written.read_text() == "t"
    (rules / "cases.py").write_text("raise SystemExit('broken cases')\n", encoding="utf-8")
    with pytest.raises(RuntimeError, match="broken cases"):
        _generate_rule_tests(tmp_path)
    assert _generate_rule_tests(ROOT) == []  # the committed files are current


_ONE_MORE = '''
import dataclasses
from otelprof.dashboards import ids  # first: it loads the mixin, which must not need it whole yet
from otelprof.mixin import training_alerts
from otelprof.mixin.alert_model import OFFLINE_TRAINING

declared = training_alerts.GROUP.build

def build(c):
    out = declared(c)
    spike = next(a for a in out if a.short == "LossSpike")
    return [*out, dataclasses.replace(spike, short="LossSpikeAgain", summary="Another declaration.", section="steps",
                                      panel=ids.REPORT_GRAD_NORM, knobs=("loss_spike_window",))]

object.__setattr__(training_alerts.GROUP, "build", build)  # before anything reads the declarations

from otelprof.analysis import checks, diagnosis
from otelprof.mixin.alerts import alert_groups, no_for
from otelprof.mixin.alerts_table import alerts_markdown
from otelprof.mixin.config import MixinConfig
from otelprof.mixin.declared import offline_twins
from otelprof.mixin.generate import render_runbook

c = MixinConfig()
[rule] = [r for g in alert_groups(c) for r in g["rules"] if r["alert"] == "OtelprofLossSpikeAgain"]
assert rule["annotations"]["dashboard_url"].endswith(f"viewPanel={ids.REPORT_GRAD_NORM}"), rule
assert "## OtelprofLossSpikeAgain" in render_runbook(c)
assert "[`LossSpikeAgain`](" in alerts_markdown() and "Another declaration." in alerts_markdown()
assert "LossSpikeAgain" in diagnosis.SECTION_CHECKS["steps"] and diagnosis.CHECK_SECTION["LossSpikeAgain"] == "steps"
assert "LossSpikeAgain" in no_for() and "LossSpikeAgain" not in diagnosis.MAPPED
assert offline_twins(OFFLINE_TRAINING)[-1] == "LossSpikeAgain" and "LossSpikeAgain" in checks.OFFLINE_CHECKS
print("one declaration")
'''


def test_one_declaration_reaches_the_rules_runbook_table_links_report_and_checks() -> None:
    """A new alert declared in its group (here a second LossSpike, in a process of its own) is in the rules file
    with its panel's link, the runbook, the docs' table, the report's section map, the no-`for` reasons and the
    offline checks' list, with nothing else written. (Its offline condition, not written here, is what the
    twin test above then asks for.)"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _ONE_MORE], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0 and done.stdout.strip() == "one declaration", done.stderr[-2000:]


@pytest.mark.parametrize("module", ["otelprof.dashboards.ids", "otelprof.dashboards.report", "otelprof.mixin.declared",
                                    "otelprof.analysis.diagnosis", "otelprof.analysis.step_checks"])
def test_a_module_that_reads_the_declarations_imports_first(module: str) -> None:
    """The alert modules read panel ids from ``dashboards.ids``, which loads the mixin: whichever is imported first,
    nothing builds an alert before both are loaded."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-1500:]
