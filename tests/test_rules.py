"""The mixin's generated rules: current, valid for the real promtool, unit-tested per alert, catalog-only names."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from otelprof import semconv as sc
from otelprof.cli import main
from otelprof.mixin import MixinConfig, render_all, telemetry_alerts, yamlout
from otelprof.mixin.alerts import alerts
from otelprof.mixin.config import with_overrides
from otelprof.mixin.generate import PROMETHEUS_DIR, prometheus_rule
from otelprof.mixin.promql import catalog_series_names, metric_names
from otelprof.mixin.recording_rules import aggregates
from otelprof.mixin.rule_groups import EVALUATED, rule_groups
from otelprof.mixin.rules import recording_names, recording_rules
from tests.rules import cases
from tests.servers import require_binary

ROOT = Path(__file__).resolve().parent.parent
RULES_DIR = ROOT / "tests" / "rules"


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    binary = require_binary("promtool")
    return subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_generated_mixin_files_are_current() -> None:
    for name, text in render_all(MixinConfig()).items():
        path = ROOT / PROMETHEUS_DIR / name
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run `otelprof generate`"


def test_promtool_test_files_are_current() -> None:
    for name, text in cases.render_all().items():
        path = RULES_DIR / name
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run `otelprof generate`"


def test_promtool_check_rules_on_every_generated_file(tmp_path: Path) -> None:
    # The PrometheusRule's spec holds the same groups; promtool reads them as a plain rule file.
    spec = tmp_path / "prometheusrule-spec.yaml"
    spec.write_text(yamlout.dump({"groups": prometheus_rule(MixinConfig())["spec"]["groups"]}))
    files = [str(ROOT / PROMETHEUS_DIR / "otelprof-alerts.yaml"), str(ROOT / PROMETHEUS_DIR / "otelprof-rules.yaml"),
             str(spec)]
    result = promtool("check", "rules", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts(MixinConfig()))} rules found" in result.stdout
    records = len(recording_rules(MixinConfig())) + len(aggregates(MixinConfig())) + len(rule_groups(MixinConfig()))
    assert f"SUCCESS: {records} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    files = sorted(p.name for p in RULES_DIR.glob("*_test.yaml"))
    assert len(files) == len(cases.FILES)
    binary = require_binary("promtool")
    running = [(name, subprocess.Popen([binary, "test", "rules", name], cwd=RULES_DIR, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)) for name in files]
    for name, process in running:
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, f"{name}:\n{output}"
        assert "SUCCESS" in output


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for groups in cases.all_groups().values():
        for group in groups:
            for test in group.alert_tests:
                (firing if test["exp_alerts"] else silent).add(test["alertname"])
    names = {a.name for a in alerts(MixinConfig())}
    assert names - firing == set(), "alerts without a firing case"
    assert names - silent == set(), "alerts without a non-firing case"


def test_rules_only_reference_catalog_metrics() -> None:
    config = MixinConfig()
    allowed = catalog_series_names() | {"up", EVALUATED} | {record.name for record in recording_rules(config)}
    used: set[str] = set()
    for alert in alerts(config):  # the catalog's series, or this file's records
        used |= metric_names(alert.expr)
    for record in recording_rules(config):
        used |= metric_names(record.expr)
    assert used - allowed == set(), "rules reference metrics that are not in the catalog"
    records = {record.name for record in recording_rules(config)}
    for aggregate in aggregates(config):  # the dashboards' aggregates read the catalog's series or other records
        assert metric_names(aggregate.expr) and metric_names(aggregate.expr) <= allowed | records, aggregate.name
    # and they cover the checks' inputs
    for spec in (sc.SAMPLER_CPU_BOTTLENECK, sc.GPU_UTILIZATION_DISTRIBUTION, sc.STEP_DURATION, sc.NONFINITE):
        assert any(name.startswith(spec.prometheus_name) for name in used)


def test_metric_name_extraction() -> None:
    expr = ('histogram_quantile(0.95, (a_bucket{le="0.5"} - (a_bucket offset 250s or a_bucket * 0))) > 0.7\n'
            'and on (job_name, rank) (time() - b{x="y"}) > 500 unless on (job_name) max by (job_name) '
            '(max_over_time(c[5m])) or {__name__="d", e="f"} or vector(1) or max_over_time(g[10m:1m] offset 5m)')
    assert metric_names(expr) == {"a_bucket", "b", "c", "d", "g"}
    with pytest.raises(ValueError):
        metric_names("rate(x[5m] > 0")


def test_alert_conventions() -> None:
    config = MixinConfig()
    for alert in alerts(config):
        rule = alert.rule(config)
        assert re.fullmatch(r"Otelprof[A-Z][A-Za-z0-9]+", rule["alert"])
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url", "dashboard_url"}
        assert rule["annotations"]["summary"].endswith(".")
        assert "$labels.job_name" in rule["annotations"]["description"] or alert.short == "TargetDown"
        assert rule["annotations"]["runbook_url"].endswith("#" + rule["alert"].lower())
        runbook = (ROOT / PROMETHEUS_DIR / "runbook.md").read_text(encoding="utf-8")
        assert f"## {rule['alert']}\n" in runbook
    actions = {a.short: a.action for a in alerts(config) if a.action}
    assert actions["NonFiniteValues"] == "stop" and actions["InputBound"] == "capture"


def test_prometheus_rule_carries_the_release_label() -> None:
    text = (ROOT / PROMETHEUS_DIR / "otelprof-prometheusrule.yaml").read_text(encoding="utf-8")
    assert "kind: PrometheusRule" in text and "release: kube-prometheus-stack" in text
    custom = prometheus_rule(with_overrides(MixinConfig(), ["prometheus_rule_release=monitoring"]))
    assert custom["metadata"]["labels"]["release"] == "monitoring"


def test_overridden_config_generates_valid_selective_rules(tmp_path: Path) -> None:
    config = with_overrides(MixinConfig(), ['selector=namespace="ml"', "window=5m", "cpu_bottleneck_threshold=0.6",
                                            "disabled_alerts=Overfitting,TelemetryDropped",
                                            "actions=NonFiniteValues:stop"])
    files = render_all(config)
    assert "OtelprofOverfitting" not in files["otelprof-alerts.yaml"]
    # the CPU-bottleneck alert reads the share the recording rule computes with the selector and the window
    recorded = {rule.get("record"): rule["expr"] for group in yaml.safe_load(files["otelprof-rules.yaml"])["groups"]
                for rule in group["rules"]}
    assert "otelprof_sampler_cpu_bottleneck_total{namespace=\"ml\"} offset 5m" in \
        recorded["otelprof:sampler_cpu_bottleneck:ratio_5m"]
    assert "otelprof:sampler_cpu_bottleneck:ratio_5m > 0.6" in files["otelprof-alerts.yaml"]
    assert "action: capture" not in files["otelprof-alerts.yaml"]
    records = {record.name: record.expr for record in recording_rules(config)}
    for alert in alerts(config):
        for name in metric_names(alert.expr):
            if name in records:  # a recorded series the alert reads: its recording rule selects
                for raw in metric_names(records[name]):
                    assert re.search(re.escape(raw) + r'\{namespace="ml"', records[name]), (alert.name, name, raw)
            elif name not in ("up", EVALUATED):  # a constant the recording groups write: no scrape labels
                assert re.search(re.escape(name) + r'\{namespace="ml"', alert.expr), (alert.name, name)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    result = promtool("check", "rules", str(tmp_path / "otelprof-alerts.yaml"), str(tmp_path / "otelprof-rules.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_bad_overrides_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown mixin setting"):
        with_overrides(MixinConfig(), ["no_such=1"])
    with pytest.raises(ValueError, match="not a duration"):
        with_overrides(MixinConfig(), ["window=5 minutes"])
    with pytest.raises(ValueError, match="action"):
        with_overrides(MixinConfig(), ["actions=CPUBottleneck:reboot"])


def test_mixin_command_writes_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mixin", "--out", str(tmp_path), "--set", "prometheus_rule_release=prom"]) == 0
    assert "release: prom" in (tmp_path / "otelprof-prometheusrule.yaml").read_text()
    written = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert written == sorted([*render_all(MixinConfig()), ".otelprof-mixin.json"])
    assert main(["mixin", "--out", str(tmp_path), "--set", "window=soon"]) == 2
    assert "not a duration" in capsys.readouterr().err


def test_recording_rule_names_for_dashboards() -> None:
    names = recording_names()
    assert names["step_p95"] == "otelprof:step_duration_seconds:p95_5m"
    assert all(re.fullmatch(r"otelprof:[a-z0-9_]+:[a-z0-9_]+", n) for n in names.values())


def test_yaml_writer_quotes_what_needs_quoting() -> None:
    text = yamlout.dump({"a": "on", "b": "x: y", "c": "5m", "d": ["{{ $value }}"], "e": "line1\nline2", "f": 0.5})
    assert text == 'a: "on"\nb: "x: y"\nc: 5m\nd:\n  - "{{ $value }}"\ne: |-\n  line1\n  line2\nf: 0.5\n'


def test_every_runbook_entry_states_its_detection_limit() -> None:
    """The smallest fault and the time to fire, computed from the config: they follow its windows and `for`."""
    runbook = (ROOT / PROMETHEUS_DIR / "runbook.md").read_text(encoding="utf-8")
    for alert in alerts(MixinConfig()):
        entry = runbook.split(f"## {alert.name}\n", 1)[1].split("\n## ", 1)[0]
        assert f"**Detection limit.** {alert.runbook.limit}" in entry and len(alert.runbook.limit) > 40, alert.name
    limits = {a.short: a.runbook.limit for a in alerts(MixinConfig())}
    assert "A rank more than 20 % slower than the median of its peers" in limits["RankStraggler"]
    assert "at the latest 7 min after the slowdown" in limits["RankStraggler"]  # 5m window + 2m for
    assert "fires 3 min 5 s after it starts" in limits["CPUBottleneck"]  # 250 s x 50 % + 1m
    assert "a stall of 3 times the step every 40 steps" in limits["StepOutliers"]  # (3 - 1) / 40 = 5 %
    assert "e.g. s = 1 % with n = 1000 (0.089 %)" in limits["LossNotDecreasing"]  # 2 x 1 % x sqrt(2 / 1000)
    assert "at the latest 35 min after it flattens" in limits["LossNotDecreasing"]  # 2 x 15m + 5m for
    assert "stays firing for 10m" in limits["LossSpike"]
    quick = {a.short: a.runbook.limit for a in alerts(with_overrides(
        MixinConfig(), ["straggler_window=1m", "straggler_for=30s", "straggler_ratio=1.5"]))}
    assert "A rank more than 50 % slower" in quick["RankStraggler"]
    assert "at the latest 1 min 30 s after the slowdown" in quick["RankStraggler"]


def test_recording_rules_missing_names_every_group_and_the_alerts_that_read_them() -> None:
    """Every recording group records the constant RecordingRulesMissing looks for; its runbook names every alert
    that reads a recorded series, and only those (found from the alerts' expressions, for each GPU source: with
    dcgm-exporter the GPU memory alerts read its records too), but the telemetry alerts, which watch what is
    missing."""
    config = with_overrides(MixinConfig(), ["gpu_source=dcgm"])
    groups = rule_groups(config)
    for group in groups:
        assert {"record": EVALUATED, "expr": "vector(1)", "labels": {"rule_group": group["name"]}} in group["rules"]
    missing = next(a for a in alerts(config) if a.short == "RecordingRulesMissing")
    assert all(f'"{group["name"]}"' in missing.expr for group in groups) and len(groups) == 4
    for each in (MixinConfig(), config):
        recorded = {rule["record"] for group in rule_groups(each) for rule in group["rules"]} - {EVALUATED}
        readers = {a.short for a in alerts(each) if metric_names(a.expr) & recorded
                   and a.group != telemetry_alerts.NAME}  # those watch what is missing
        assert readers == set(telemetry_alerts.readers(each)) and len(readers) >= 9
        meaning = next(a for a in alerts(each) if a.short == "RecordingRulesMissing").runbook.meaning
        assert f"({', '.join(telemetry_alerts.readers(each))})" in meaning
    assert {"GPUMemoryIncrease", "GPUMemoryNearCapacity"} <= set(telemetry_alerts.readers(config)) - set(
        telemetry_alerts.readers(MixinConfig()))
    slow = next(a for a in alerts(with_overrides(MixinConfig(), ["recording_interval=10m"]))
                if a.short == "RecordingRulesMissing")
    assert "[1800s]" in slow.expr  # three evaluations of a slow group before it counts as missing
