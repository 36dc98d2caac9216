"""Your own live rules in the mixin: PromQL with runbook text, validated and written with the built-in ones.

``otelprof mixin -o DIR --set custom_rules=my_rules.yaml`` (or ``custom_rules: my_rules.yaml`` in ``--config``)
adds each rule of the file to ``otelprof-alerts.yaml`` (group ``otelprof-custom``), the PrometheusRule and the
runbook, named ``Otelprof<alert>``. The file (JSON, or YAML with PyYAML) holds ``rules``, a list of mappings::

    rules:
      - alert: FirstLayerGradientTiny            # CamelCase, without the Otelprof prefix
        expr: otelprof_tensor_summed{reduction="abs_mean", tensor="gradients/0.weight"} < 1e-6
        for: 10m                                  # optional, default 0s
        severity: warning                         # critical, warning or info
        summary: The first layer's gradients are tiny.
        description: "rank {{ $labels.rank }}: ..."   # optional, default the summary
        meaning: What it means.                   # the runbook entry
        todo: What to do.
        limit: When it fires (optional).

A rule that cannot be used (a missing field, a bad name or duration, a metric that is not in the catalog, a name
taken) is a one-line ValueError naming the file and the rule: ``otelprof mixin`` prints it and exits 2.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from otelprof.mixin import config as mc
from otelprof.mixin.alert_model import RISK, Alert, AlertGroup, Runbook
from otelprof.mixin.built_in_groups import BUILT_IN
from otelprof.mixin.config import MixinConfig, seconds
from otelprof.mixin.promql import IDENTITY, catalog_series_names, metric_names

REQUIRED = ("alert", "expr", "severity", "summary", "meaning", "todo")
OPTIONAL = ("for", "description", "limit")
_NAME = re.compile(r"^[A-Z][A-Za-z0-9]{2,80}$")
NAME = "otelprof-custom"
MAX_RULES = 200


def _read(path: str) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
        if path.endswith(".json"):
            return json.loads(text)
        try:
            import yaml
        except ImportError:
            raise ValueError("a YAML rules file needs PyYAML (pip install pyyaml); or give a .json file") from None
        return yaml.safe_load(text)
    except ValueError:
        raise
    except Exception as exc:  # OSError, UnicodeDecodeError, yaml.YAMLError
        raise ValueError(" ".join(str(exc).split())) from None


def load(path: str) -> list[dict[str, str]]:
    """The file's rules, checked (ValueError: one line naming the file and the rule)."""
    try:
        data = _read(path)
    except ValueError as exc:
        raise ValueError(f"custom rules {path}: {exc}") from None
    rules = data.get("rules") if isinstance(data, dict) else None
    if not isinstance(rules, list) or not rules or len(rules) > MAX_RULES:
        raise ValueError(f"custom rules {path}: expected a mapping with `rules`, a list of 1 to {MAX_RULES} rules")
    allowed = catalog_series_names() | {"up", "ALERTS"}
    built_in = {a.short for a in _built_in()}
    seen: set[str] = set()
    out = []
    for i, rule in enumerate(rules):
        where = f"custom rules {path}, rule {i + 1}"
        if not isinstance(rule, dict):
            raise ValueError(f"{where}: not a mapping")
        unknown = set(rule) - set(REQUIRED) - set(OPTIONAL)
        missing = [k for k in REQUIRED if not isinstance(rule.get(k), str) or not rule[k].strip()]
        if unknown or missing:
            raise ValueError(f"{where}: " + "; ".join(
                ([f"missing {', '.join(missing)}"] if missing else [])
                + ([f"unknown {', '.join(sorted(map(str, unknown)))}"] if unknown else [])))
        name = rule["alert"].removeprefix(mc.ALERT_PREFIX)
        if not _NAME.match(name):
            raise ValueError(f"{where}: alert {name!r} must be CamelCase letters and digits")
        if name in built_in or name in seen:
            raise ValueError(f"{where}: alert {name!r} is already defined")
        seen.add(name)
        if rule["severity"] not in mc.SEVERITIES:
            raise ValueError(f"{where} ({name}): severity must be one of {', '.join(mc.SEVERITIES)}")
        for_ = str(rule.get("for", "0s"))
        try:
            seconds(for_)
        except ValueError as exc:
            raise ValueError(f"{where} ({name}): {exc}") from None
        try:
            strange = metric_names(rule["expr"]) - allowed
        except ValueError as exc:
            first = str(exc).splitlines()[0] if str(exc) else repr(exc)
            raise ValueError(f"{where} ({name}): invalid PromQL: {first}") from None
        if strange:
            raise ValueError(f"{where} ({name}): not in otelprof's catalog: {', '.join(sorted(strange))}")
        out.append({**{k: str(v) for k, v in rule.items()}, "alert": name, "for": for_})
    return out


def _built_in() -> list[Alert]:
    """The alerts otelprof ships (every group but this one's)."""
    config = MixinConfig()
    return [alert for group in BUILT_IN for alert in group.build(config)]


def custom_alerts(config: MixinConfig) -> list[Alert]:
    """The alerts of ``config.custom_rules`` (none without a file)."""
    if not config.custom_rules:
        return []
    return [Alert(
        short=rule["alert"], group=NAME, expr=rule["expr"].strip(), for_=rule["for"], severity=rule["severity"],
        summary=rule["summary"], description=rule.get("description") or rule["summary"],
        dashboard=mc.DASHBOARD_TRAINING_REPORT, labels=IDENTITY,
        runbook=Runbook(meaning=rule["meaning"], thresholds=(("for", rule["for"]),), todo=rule["todo"],
                        deviations="A custom rule (no original).", limit=rule.get("limit") or "Not stated."),
        panel=None, section="rules", kind=RISK, knobs=(), offline=None, cases=())
        for rule in load(config.custom_rules)]


GROUP = AlertGroup(NAME, custom_alerts)
