"""otelprof's Alertmanager routing as a prometheus-operator ``AlertmanagerConfig`` (``monitoring.coreos.com/v1alpha1``).

On kube-prometheus-stack the operator merges every selected ``AlertmanagerConfig`` into the cluster's
Alertmanager config as one sub-route of its root, first in line and with ``continue: true``: the cluster's
own routes, receivers and inhibitions stay as they are. The object's top route matches otelprof's alerts
only (``alertname=~"Otelprof.*"``), so nothing else ever reaches its receivers. The operator also adds a
``namespace="<the object's namespace>"`` matcher unless the object lives in Alertmanager's own namespace
and the Alertmanager's matcher strategy is ``OnNamespaceExceptForAlertmanagerNamespace`` (what the
generated values set): several otelprof alerts judge a whole job (``by (job_name)``) and carry no namespace.

The routes are those of ``deploy/alertmanager/alertmanager.yml`` (plain Prometheus, a config of its own):
alerts with an ``action`` label go to ``otelprof webhook`` one by one and continue; the rest by severity.
"""

from __future__ import annotations

from typing import Any

from otelprof import semconv as sc
from otelprof.mixin.config import ALERT_PREFIX, MixinConfig

NAME = "otelprof"
SELECTOR_LABEL = "otelprof.io/alertmanager-config"
"""Label the generated values' ``alertmanagerConfigSelector`` matches (a cluster may add it to its own selector)."""
ALERTS_MATCHER = ("alertname", f"{ALERT_PREFIX}.*", "=~")
WEBHOOK_SECRET = "otelprof-webhook"
WEBHOOK_SECRET_KEY = "token"

RECEIVER_DEFAULT = "otelprof"
RECEIVER_ACTIONS = "otelprof-actions"
RECEIVER_PAGE = "otelprof-page"
RECEIVER_TICKET = "otelprof-ticket"
RECEIVER_INFO = "otelprof-info"
SEVERITY_RECEIVERS = (("critical", RECEIVER_PAGE), ("warning", RECEIVER_TICKET), ("info", RECEIVER_INFO))


def _matcher(name: str, value: str, match_type: str = "=") -> dict[str, str]:
    return {"name": name, "value": value, "matchType": match_type}


def alertmanager_config(config: MixinConfig) -> dict[str, Any]:
    """The ``AlertmanagerConfig`` object: otelprof's alerts to otelprof's receivers, nothing else touched.

    The page / ticket / info receivers have no integration: add yours (``slackConfigs``, ``pagerdutyConfigs``,
    ...) to the object, or keep them empty to see the alerts in Alertmanager and Grafana only.
    """
    actions = "|".join(sorted({action for _, action in config.actions}))
    routes: list[dict[str, Any]] = [{
        "receiver": RECEIVER_ACTIONS,
        "matchers": [_matcher("action", actions, "=~")],
        "groupBy": ["..."],  # every alert on its own: an action must not wait for its neighbours
        "groupWait": "0s",
        "groupInterval": "1m",
        "repeatInterval": "1h",
        "continue": True,
    }]
    routes += [{"receiver": receiver, "matchers": [_matcher("severity", severity)]}
               for severity, receiver in SEVERITY_RECEIVERS]
    webhook = {
        "url": config.webhook_url,
        "sendResolved": False,
        "httpConfig": {"authorization": {"type": "Bearer",
                                         "credentials": {"name": WEBHOOK_SECRET, "key": WEBHOOK_SECRET_KEY}}},
    }
    name, value, match_type = ALERTS_MATCHER
    return {
        "apiVersion": "monitoring.coreos.com/v1alpha1",
        "kind": "AlertmanagerConfig",
        "metadata": {
            "name": NAME,
            "labels": {"app.kubernetes.io/name": "otelprof", "app.kubernetes.io/component": "alert-routing",
                       SELECTOR_LABEL: "true"},
        },
        "spec": {
            "route": {
                "receiver": RECEIVER_DEFAULT,
                "matchers": [_matcher(name, value, match_type)],
                "groupBy": ["job_name", "alertname"],
                "groupWait": "30s",
                "groupInterval": "5m",
                "repeatInterval": "4h",
                "routes": routes,
            },
            "receivers": [{"name": RECEIVER_DEFAULT}, {"name": RECEIVER_ACTIONS, "webhookConfigs": [webhook]},
                          *({"name": receiver} for _, receiver in SEVERITY_RECEIVERS)],
            "inhibitRules": [
                # While a process cannot be scraped its other warnings are stale.
                {"sourceMatch": [_matcher("alertname", f"{ALERT_PREFIX}TargetDown")],
                 "targetMatch": [_matcher("severity", "warning|info", "=~"),
                                 _matcher("alertname", f"{ALERT_PREFIX}.*", "=~"),
                                 _matcher("alertname", f"{ALERT_PREFIX}TargetDown", "!=")],
                 "equal": ["job_name", "rank"]},
                # A NaN loss explains a loss that stopped decreasing.
                {"sourceMatch": [_matcher("alertname", f"{ALERT_PREFIX}NonFiniteValues")],
                 "targetMatch": [_matcher("alertname", "|".join(f"{ALERT_PREFIX}{n}" for n in (
                     "LossNotDecreasing", "Overfitting", "VanishingGradients")), "=~")],
                 "equal": ["job_name", "rank"]},
            ],
        },
    }


def stack_values(config: MixinConfig) -> dict[str, Any]:
    """kube-prometheus-stack values that wire the bundle in without replacing anything of the cluster's.

    Merge them into your values (``helm upgrade -f``); each setting only adds a selection or a link.
    """
    return {
        "alertmanager": {"alertmanagerSpec": {
            # select otelprof's AlertmanagerConfig (add your own selector's label to it instead if you have one)
            "alertmanagerConfigSelector": {"matchLabels": {SELECTOR_LABEL: "true"}},
            # the object lives in Alertmanager's namespace: the operator adds no namespace matcher to it, while
            # objects of other namespaces keep theirs (prometheus-operator >= 0.84)
            "alertmanagerConfigMatcherStrategy": {"type": "OnNamespaceExceptForAlertmanagerNamespace"},
        }},
        "prometheus": {"prometheusSpec": {
            # the PodMonitor may sit in the training namespaces
            "podMonitorNamespaceSelector": {},
            # a span's trace id on step-time samples links to the trace in Tempo (data source uid tempo)
            "enableFeatures": ["exemplar-storage"],
        }},
        "grafana": {
            "sidecar": {
                "dashboards": {"enabled": True, "label": "grafana_dashboard", "labelValue": "1",
                               "folderAnnotation": "grafana_folder",
                               "provider": {"foldersFromFilesStructure": True}},
                "datasources": {"enabled": True, "label": "grafana_datasource", "labelValue": "1",
                                "exemplarTraceIdDestinations": {"datasourceUid": "tempo",
                                                                "traceIdLabelName": sc.EXEMPLAR_TRACE_ID}},
            },
            "grafana.ini": {"server": {"root_url": config.grafana_url}},
        },
    }
