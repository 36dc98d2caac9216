"""The rules and dashboards run unchanged beyond one Prometheus: in Thanos Rule, Grafana Mimir's ruler and
VictoriaMetrics' vmalert (MetricsQL), and their query APIs.

Every PromQL expression of the generated rules and dashboards is lexed; the features it uses are listed
and each must be one all three evaluate alike (their documentation: Thanos and Mimir run Prometheus's own
engine; MetricsQL's documented differences are below). A new function fails here until someone checks the
three rulers and lists it in docs/scale.md. The Mimir namespace file is current and loads.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from otelprof.dashboards.generate import dashboards
from otelprof.dashboards.model import Prom
from otelprof.mixin import MixinConfig
from otelprof.mixin.alerts import alert_groups
from otelprof.mixin.rule_groups import rule_groups
from otelprof.mixin.rulers import MIMIR_FILE, MIMIR_MAX_RULES_PER_GROUP, NAMESPACE, RULERS_DIR, render_all, split
from tests.servers import require_binary

ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = (ROOT / "deploy/prometheus/otelprof-alerts.yaml", ROOT / "deploy/prometheus/otelprof-rules.yaml")
SCALE_DOC = ROOT / "docs/scale.md"

AGGREGATIONS = {"sum", "min", "max", "avg", "count", "quantile", "topk", "bottomk", "stddev", "stdvar", "group",
                "count_values", "limitk", "limit_ratio"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
NOT_PORTABLE = {
    # Prometheus 3 experimental functions (behind --enable-feature=promql-experimental-functions, a flag each
    # ruler names differently), some with other semantics in MetricsQL.
    "limitk": "experimental in Prometheus; MetricsQL's limitk keeps other series",
    "limit_ratio": "experimental in Prometheus; not in MetricsQL",
    "info": "experimental in Prometheus; not in MetricsQL",
    "sort_by_label": "experimental in Prometheus",
    "sort_by_label_desc": "experimental in Prometheus",
    "mad_over_time": "experimental in Prometheus",
    "double_exponential_smoothing": "experimental in Prometheus 3; holt_winters before, removed in 3",
    "holt_winters": "removed in Prometheus 3",
    "ts_of_max_over_time": "experimental in Prometheus",
    "ts_of_min_over_time": "experimental in Prometheus",
    "ts_of_last_over_time": "experimental in Prometheus",
    "first_over_time": "experimental in Prometheus",
    # Native histograms: VictoriaMetrics stores no Prometheus native histograms (otelprof exports classic ones).
    "histogram_count": "native histograms", "histogram_sum": "native histograms", "histogram_avg": "native histograms",
    "histogram_fraction": "native histograms", "histogram_stddev": "native histograms",
    "histogram_stdvar": "native histograms",
    "@": "a rule evaluated at a pinned time judges the same moment forever",
}
RULE_ONLY_NOT_PORTABLE = {
    "subquery": "a subquery in a rule is many evaluations per evaluation (the rulers' query limits) and MetricsQL "
                "aligns its steps differently",
}
TEMPLATE_FUNCTIONS = {"humanize", "humanize1024", "humanizePercentage", "humanizeDuration", "humanizeTimestamp",
                      "printf"}
"""Alert templates: the functions Prometheus, Thanos, Mimir and vmalert all provide."""

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_CALL = re.compile(r"\b([a-zA-Z_][a-zA-Z0-9_]*)\s*\(")
_AGGREGATION = re.compile(r"\b([a-z_]+)\s+(?:by|without)\s*\(")
_SUBQUERY = re.compile(r"\[[^\]\[]*:[^\]\[]*\]")


def features(expr: str) -> set[str]:
    """The PromQL features of ``expr``: functions and aggregations called, modifiers and operators used."""
    code = _STRING.sub('""', expr)
    code = re.sub(r"\{[^{}]*\}", "{}", code)  # label matchers
    found = {name for name in _CALL.findall(code) if name not in KEYWORDS}
    found |= {name for name in _AGGREGATION.findall(code) if name in AGGREGATIONS}
    found |= {word for word in re.findall(r"\b(offset|and|or|unless|bool|on|ignoring|group_left|group_right|by|"
                                          r"without)\b", code)}
    if "@" in code:
        found.add("@")
    if _SUBQUERY.search(code):
        found.add("subquery")
    if re.search(r"\boffset\s+-", code):
        found.add("negative offset")
    return found


def rule_exprs() -> list[tuple[str, str]]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += [(rule.get("alert") or rule["record"], rule["expr"]) for rule in group["rules"]]
    return out


def dashboard_exprs() -> list[tuple[str, str]]:
    return [(f"{board.uid} #{panel.id}", target.expr) for board in dashboards() for panel in board.panels()
            for target in panel.targets if isinstance(target, Prom)]


def test_the_lexer_sees_functions_modifiers_and_subqueries() -> None:
    expr = ('topk(5, histogram_quantile(0.95, sum by (le) (rate(a_bucket{x="rate(", y=~"a|b"}[1m]))))'
            ' / on (j) group_left() max_over_time(timestamp(b)[5m:1m]) or c offset 5m @ end() and d > bool 1')
    found = features(expr)
    assert {"topk", "histogram_quantile", "sum", "rate", "max_over_time", "timestamp", "end"} <= found
    assert {"on", "group_left", "or", "and", "offset", "bool", "by", "@", "subquery"} <= found
    assert "rate(" not in found and "x" not in found
    assert "subquery" not in features('rate(a[5m]) + b{le="+Inf"}')


def test_rules_use_only_portable_promql() -> None:
    used: dict[str, set[str]] = {}
    for name, expr in rule_exprs():
        for feature in features(expr):
            used.setdefault(feature, set()).add(name)
    bad = {f: sorted(names) for f, names in used.items() if f in NOT_PORTABLE or f in RULE_ONLY_NOT_PORTABLE}
    assert not bad, f"rules use PromQL the Thanos/Mimir/VictoriaMetrics rulers do not evaluate alike: {bad}"
    assert {"histogram_quantile", "offset", "or", "quantile"} <= used.keys()  # the walk saw the rules


def test_dashboards_use_only_portable_promql() -> None:
    used: dict[str, set[str]] = {}
    for where, expr in dashboard_exprs():
        for feature in features(expr):
            used.setdefault(feature, set()).add(where)
    bad = {f: sorted(where)[:3] for f, where in used.items() if f in NOT_PORTABLE}
    assert not bad, f"dashboards use PromQL the stores' query APIs do not evaluate alike: {bad}"
    assert {"topk", "bottomk", "subquery"} <= used.keys()


def test_every_feature_used_is_listed_in_the_scale_doc() -> None:
    """A new function must be checked against the three rulers and listed in docs/scale.md."""
    doc = SCALE_DOC.read_text(encoding="utf-8")
    section = doc[doc.index("## Rules in other rulers"):]
    used = set().union(*(features(expr) for _, expr in rule_exprs() + dashboard_exprs()))
    missing = sorted(f for f in used if f"`{f}`" not in section)
    assert not missing, f"docs/scale.md does not list these PromQL features: {missing}"


def test_alert_templates_use_functions_every_ruler_has() -> None:
    used = set()
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                for text in rule.get("annotations", {}).values():
                    for action in re.findall(r"{{(.*?)}}", text):
                        plain = re.sub(r"\$[a-zA-Z_.]*", "", _STRING.sub("", action))  # $labels.x, $value
                        used |= set(re.findall(r"\b([a-zA-Z][a-zA-Z0-9]*)\b", plain))
    assert used and used <= TEMPLATE_FUNCTIONS, used - TEMPLATE_FUNCTIONS


def test_mimir_namespace_file_is_current_and_holds_every_rule_within_mimir_limits(tmp_path: Path) -> None:
    path = ROOT / RULERS_DIR / MIMIR_FILE
    assert path.read_text(encoding="utf-8") == render_all(MixinConfig())[MIMIR_FILE], \
        f"{path} is stale: run `otelprof generate`"
    document = yaml.safe_load(path.read_text())
    assert document["namespace"] == NAMESPACE
    groups = document["groups"]
    assert all(len(g["rules"]) <= MIMIR_MAX_RULES_PER_GROUP for g in groups) and len(groups) <= 70
    assert len({g["name"] for g in groups}) == len(groups)
    source = [*alert_groups(MixinConfig()), *rule_groups(MixinConfig())]
    assert [r for g in groups for r in g["rules"]] == [r for g in source for r in g["rules"]]  # same rules, in order
    # no shipped group is over the limit today (the recording rules are two groups); a larger one, as a custom
    # rules file may make, is split in order
    big = {"name": "big", "rules": [{"record": f"r{i}", "expr": "1"} for i in range(2 * MIMIR_MAX_RULES_PER_GROUP + 5)]}
    assert [(p["name"], len(p["rules"])) for p in split(big)] == [
        ("big-1", MIMIR_MAX_RULES_PER_GROUP), ("big-2", MIMIR_MAX_RULES_PER_GROUP), ("big-3", 5)]
    assert [r for p in split(big) for r in p["rules"]] == big["rules"]
    for group in source:  # a part never reads a record of another part (it would lag one evaluation behind)
        parts = [g for g in groups if g["name"].startswith(group["name"] + "-")]
        for part in parts:
            others = {r["record"] for p in parts if p is not part for r in p["rules"] if "record" in r}
            assert not any(name in rule["expr"] for rule in part["rules"] for name in others), part["name"]
    plain = tmp_path / "groups.yaml"  # the same groups as a Prometheus rule file: promtool checks every rule
    plain.write_text(yaml.safe_dump({"groups": groups}))
    result = subprocess.run([require_binary("promtool"), "check", "rules", str(plain)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
