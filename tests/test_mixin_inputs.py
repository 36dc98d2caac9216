"""`otelprof mixin` refuses, in one line with exit 2 and nothing written, every setting or custom live rule that
would give a rules file Prometheus refuses (which would lose every otelprof alert) or rules that no longer mean
what they say: PromQL parsed by a real parser, templates closed, durations within Prometheus's range, selectors
label matchers only. Real `otelprof mixin` processes; what is accepted passes promtool."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otelprof.mixin.config import MixinConfig, with_overrides
from otelprof.mixin.promql_check import check_selector
from tests.servers import require_binary
from tests.test_mixin_bundle import _mixin


def _refused(tmp_path: Path, *args: str, reason: str) -> None:
    result = _mixin(tmp_path, "-o", "out", *args)
    assert result.returncode == 2, result.stderr
    assert reason in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("setting", "reason"), [
    ("window=0s", "positive duration"),
    ("window=9999999999h", "longer than Prometheus accepts"),
    ("loss_window=0s", "positive duration"),
    ('selector=namespace="ml"} or vector(1) or up{x="', "label matchers"),
    ("selector=namespace=ml", "label matchers"),
    ('up_selector=job="a"} > 0 or up{x="y"', "label matchers"),
    ('dcgm_selector=a="b")', "label matchers"),
    ('train_phase=train"} or vector(1) or x{a="', "plain label value"),
    ("eval_phase=", "plain label value"),
    ("dcgm_pod_label=pod name", "label name"),
])
def test_a_bad_setting_is_one_line_and_writes_nothing(tmp_path: Path, setting: str, reason: str) -> None:
    _refused(tmp_path, "--set", setting, reason=reason)


def _rule(**fields: str) -> str:
    return json.dumps({"rules": [{"alert": "MyRule", "expr": "up == 0", "severity": "warning", "summary": "s",
                                  "meaning": "m", "todo": "t", **fields}]})


@pytest.mark.parametrize(("rule", "reason"), [
    (_rule(expr="rate(otelprof_step_duration_seconds_count[5m] > 0"), "invalid PromQL"),
    (_rule(expr="otelprof_step_duration_seconds_count[5x]"), "invalid PromQL"),
    (_rule(expr="no_such_function(otelprof_step_duration_seconds_count)"), "invalid PromQL"),
    (_rule(summary="{{ $labels.job_name "), "never closed"),
    (_rule(description="{{ {{ $value }} }}"), "unbalanced"),
])
def test_a_bad_custom_live_rule_is_one_line_and_writes_nothing(tmp_path: Path, rule: str, reason: str) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(rule, encoding="utf-8")
    _refused(tmp_path, "--set", f"custom_rules={rules}", reason=reason)


def test_good_settings_are_accepted_and_pass_promtool(tmp_path: Path) -> None:
    result = _mixin(tmp_path, "-o", "out", "--set", 'selector=namespace="ml", team=~"a|b"',
                    "--set", 'up_selector=job!="x"', "--set", "window=1h30m", "--set", "train_phase=fit")
    assert result.returncode == 0, result.stderr
    promtool = require_binary("promtool")
    check = subprocess.run([promtool, "check", "rules", str(tmp_path / "out" / "otelprof-alerts.yaml"),
                            str(tmp_path / "out" / "otelprof-rules.yaml")], capture_output=True, text=True,
                           timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=40))
def test_any_selector_is_refused_or_stays_inside_the_braces(selector: str) -> None:
    """Whatever is accepted is label matchers: spliced into a selector it parses as that one selector."""
    try:
        check_selector(selector, "selector")
    except ValueError:
        return
    import promql_parser

    parsed = promql_parser.parse(f"up{{{selector}}}")
    assert type(parsed).__name__ == "VectorSelector"


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["window", "patience", "loss_for", "straggler_window", "recording_interval"]),
       st.text(alphabet="0123456789hms", max_size=12))
def test_any_accepted_duration_is_one_prometheus_takes(name: str, value: str) -> None:
    try:
        config = with_overrides(MixinConfig(), [f"{name}={value}"])
    except ValueError:
        return
    from otelprof.mixin.config import MAX_SECONDS, seconds

    if name == "recording_interval" and not value:
        return  # empty: the recording groups take Prometheus's global interval
    length = seconds(getattr(config, name))
    assert length <= MAX_SECONDS and (length > 0 or name.endswith("_for"))
