"""deploy/alertmanager/alertmanager.yml: valid for the real amtool, and routes the way the docs say; on
kube-prometheus-stack, the AlertmanagerConfig merged into a typical cluster's config (as prometheus-operator
merges it) leaves the cluster's own alerts where they went and routes otelprof's the same way."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from otelprof.mixin import MixinConfig, routing
from otelprof.mixin.alerts import alerts
from otelprof.mixin.routing import alertmanager_config
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


# ------------------------------------------------------------------ kube-prometheus-stack: the AlertmanagerConfig

AM_NAMESPACE = "monitoring"
TYPICAL_CLUSTER = {
    # kube-prometheus-stack's default config plus what a platform team adds: a pager for critical alerts and
    # one team's namespace routed to that team.
    "global": {"resolve_timeout": "5m"},
    "route": {
        "receiver": "null", "group_by": ["namespace"], "group_wait": "30s", "group_interval": "5m",
        "repeat_interval": "12h",
        "routes": [
            {"receiver": "null", "matchers": ['alertname = "Watchdog"']},
            {"receiver": "platform-pager", "matchers": ['severity = "critical"']},
            {"receiver": "team-a", "matchers": ['namespace = "team-a"']},
        ],
    },
    "receivers": [{"name": "null"},
                  {"name": "platform-pager", "webhook_configs": [{"url": "http://pager.example:8080/"}]},
                  {"name": "team-a", "webhook_configs": [{"url": "http://team-a.example:8080/"}]}],
    "inhibit_rules": [
        {"source_matchers": ["severity = critical"], "target_matchers": ["severity =~ warning|info"],
         "equal": ["namespace", "alertname"]},
        {"target_matchers": ["alertname = InfoInhibitor"]},
    ],
}
CLUSTER_ALERTS = [
    (["alertname=KubeAPIDown", "severity=critical"], "platform-pager"),
    (["alertname=KubePodCrashLooping", "severity=warning", "namespace=team-a", "pod=web-1"], "team-a"),
    (["alertname=Watchdog", "severity=none"], "null"),
    (["alertname=KubeJobFailed", "severity=warning", "namespace=ml"], "null"),
]


def _matcher(m: dict[str, str]) -> str:
    return f'{m["name"]}{m.get("matchType", "=")}"{m["value"]}"'


def _route(route: dict[str, Any], key: str) -> dict[str, Any]:
    """One AlertmanagerConfig route as the operator writes it into alertmanager.yaml."""
    out: dict[str, Any] = {"receiver": f"{key}/{route['receiver']}"}
    if route.get("matchers"):
        out["matchers"] = [_matcher(m) for m in route["matchers"]]
    for camel, snake in (("groupBy", "group_by"), ("groupWait", "group_wait"), ("groupInterval", "group_interval"),
                         ("repeatInterval", "repeat_interval"), ("continue", "continue")):
        if camel in route:
            out[snake] = route[camel]
    if route.get("routes"):
        out["routes"] = [_route(r, key) for r in route["routes"]]
    return out


def merged(cluster: dict[str, Any], amc: dict[str, Any], namespace: str, strategy: str) -> dict[str, Any]:
    """``cluster``'s config with ``amc`` (living in ``namespace``) merged in as prometheus-operator merges it:
    receivers renamed ``<namespace>/<name>/<receiver>``, the object's route first among the root's routes with
    ``continue: true``, and a ``namespace`` matcher on it and its inhibitions unless the strategy exempts
    Alertmanager's own namespace (or is None)."""
    key = f"{namespace}/{amc['metadata']['name']}"
    enforce = strategy == "OnNamespace" or (strategy == "OnNamespaceExceptForAlertmanagerNamespace"
                                            and namespace != AM_NAMESPACE)
    route = _route(amc["spec"]["route"], key)
    if enforce:
        route["matchers"] = [*route.get("matchers", []), f'namespace="{namespace}"']
    route["continue"] = True
    receivers = []
    for receiver in amc["spec"]["receivers"]:
        out: dict[str, Any] = {"name": f"{key}/{receiver['name']}"}
        if receiver.get("webhookConfigs"):
            # the operator reads the token from the Secret the object names and writes it inline
            out["webhook_configs"] = [{"url": w["url"], "send_resolved": w["sendResolved"],
                                       "http_config": {"authorization": {"type": "Bearer", "credentials": "t"}}}
                                      for w in receiver["webhookConfigs"]]
        receivers.append(out)
    inhibit = []
    for rule in amc["spec"].get("inhibitRules", []):
        ns = [f'namespace="{namespace}"'] if enforce else []
        inhibit.append({"source_matchers": [*map(_matcher, rule["sourceMatch"]), *ns],
                        "target_matchers": [*map(_matcher, rule["targetMatch"]), *ns], "equal": rule["equal"]})
    config = copy.deepcopy(cluster)
    config["route"]["routes"] = [route, *config["route"].get("routes", [])]
    config["receivers"] = [*config["receivers"], *receivers]
    config["inhibit_rules"] = [*config.get("inhibit_rules", []), *inhibit]
    return config


def _write(tmp_path: Path, name: str, config: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    result = amtool("check-config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    return path


def _routes(config: Path, labels: list[str]) -> str:
    result = amtool("config", "routes", "test", f"--config.file={config}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


def test_the_alertmanagerconfig_leaves_the_clusters_alerts_where_they_were(tmp_path: Path) -> None:
    amc = alertmanager_config(MixinConfig())
    before = _write(tmp_path, "cluster.yaml", TYPICAL_CLUSTER)
    after = _write(tmp_path, "merged.yaml", merged(TYPICAL_CLUSTER, amc, AM_NAMESPACE,
                                                   "OnNamespaceExceptForAlertmanagerNamespace"))
    for labels, receivers in CLUSTER_ALERTS:
        assert _routes(before, labels) == receivers
        assert _routes(after, labels) == receivers, labels


def _ours(receivers: str) -> list[str]:
    prefix = f"{AM_NAMESPACE}/{routing.NAME}/"
    return [r.removeprefix(prefix) for r in receivers.split(",") if r.startswith(prefix)]


def test_every_otelprof_alert_reaches_otelprofs_receivers_as_on_plain_prometheus(tmp_path: Path) -> None:
    """Each alert of the mixin, with or without a namespace label (whole-job alerts have none), is routed by
    the AlertmanagerConfig to the receivers deploy/alertmanager/alertmanager.yml routes it to."""
    after = _write(tmp_path, "merged.yaml", merged(TYPICAL_CLUSTER, alertmanager_config(MixinConfig()),
                                                   AM_NAMESPACE, "OnNamespaceExceptForAlertmanagerNamespace"))
    plain_names = {"page": routing.RECEIVER_PAGE, "ticket": routing.RECEIVER_TICKET,
                   "blackhole": routing.RECEIVER_INFO, "otelprof-actions": routing.RECEIVER_ACTIONS}
    checked = 0
    for alert in alerts(MixinConfig()):
        labels = [f"alertname={alert.name}", f"severity={alert.severity}", "job_name=a"]
        if alert.action:
            labels.append(f"action={alert.action}")
        plain = [plain_names[r] for r in _routes(CONFIG, labels).split(",")]
        for extra in ([], ["namespace=ml"]):
            assert _ours(_routes(after, labels + extra)) == plain, (alert.name, extra)
            checked += 1
    assert checked > 20


def test_without_the_matcher_strategy_the_operator_would_drop_whole_job_alerts(tmp_path: Path) -> None:
    """Why the values set OnNamespaceExceptForAlertmanagerNamespace: under the default strategy the operator adds
    namespace="monitoring" to the object's route, and the training namespace's alerts never match it."""
    after = _write(tmp_path, "merged.yaml", merged(TYPICAL_CLUSTER, alertmanager_config(MixinConfig()),
                                                   AM_NAMESPACE, "OnNamespace"))
    assert not _ours(_routes(after, ["alertname=OtelprofNonFiniteValues", "severity=critical", "namespace=ml"]))
    values = routing.stack_values(MixinConfig())["alertmanager"]["alertmanagerSpec"]
    assert values["alertmanagerConfigMatcherStrategy"] == {"type": "OnNamespaceExceptForAlertmanagerNamespace"}
    selector = values["alertmanagerConfigSelector"]["matchLabels"]
    assert selector.items() <= alertmanager_config(MixinConfig())["metadata"]["labels"].items()
    assert "configSecret" not in values

