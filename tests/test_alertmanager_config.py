"""deploy/alertmanager/alertmanager.yml: valid for the real amtool, and routes the way the docs say."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from otelprof.mixin import MixinConfig
from otelprof.mixin.alerts import alerts
from tests.servers import require_binary

CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "alertmanager" / "alertmanager.yml"


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_binary("amtool"), *args], capture_output=True, text=True, timeout=60)


def test_amtool_check_config() -> None:
    result = amtool("check-config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(("labels", "receivers"), [
    (["alertname=OtelprofNonFiniteValues", "severity=critical", "action=stop", "job_name=a"],
     "otelprof-actions,page"),
    (["alertname=OtelprofInputBound", "severity=warning", "action=capture", "job_name=a"],
     "otelprof-actions,ticket"),
    (["alertname=OtelprofGPUUnderutilized", "severity=warning", "job_name=a"], "ticket"),
    (["alertname=OtelprofBatchSizeTooSmall", "severity=info", "job_name=a"], "blackhole"),
    (["alertname=Other"], "default"),
])
def test_routes(labels: list[str], receivers: str) -> None:
    result = amtool("config", "routes", "test", f"--config.file={CONFIG}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receivers


def test_every_action_of_the_mixin_is_routed_to_the_webhook() -> None:
    for alert in alerts(MixinConfig()):
        labels = [f"alertname={alert.name}", f"severity={alert.severity}", "job_name=a"]
        if alert.action:
            labels.append(f"action={alert.action}")
        result = amtool("config", "routes", "test", f"--config.file={CONFIG}", *labels)
        assert ("otelprof-actions" in result.stdout) == bool(alert.action), (alert.name, result.stdout)
