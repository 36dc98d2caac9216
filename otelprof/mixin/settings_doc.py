"""The mixin settings documented from the source: each :class:`~otelprof.mixin.config.MixinConfig` field's
default, its meaning (the field's attribute docstring) and what it reaches.

What a field reaches is found, not listed: the alerts, recording rules and dashboards are built with the field
alone changed (:func:`perturbed`) and compared with the default build. A field that only matters with
``gpu_source=dcgm`` is changed on top of that setting instead. ``otelprof generate`` writes the tables into
docs/mixin-settings.md (:func:`settings_markdown`, :func:`alerts_markdown`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from otelprof.mixin import config as mc
from otelprof.mixin.config import MixinConfig, validate

DEFAULT = MixinConfig()
BASES: tuple[tuple[str, MixinConfig], ...] = (
    ("", DEFAULT),
    ("with `gpu_source=dcgm`", dataclasses.replace(DEFAULT, gpu_source=mc.GPU_SOURCE_DCGM)),
)
"""The configs a field is changed on, in order: the first on which the change reaches something is reported."""
STRING_CANDIDATES = ("777s", 'perturbed="x"', "perturbed_label", "dcgm")
"""A changed string setting: the first of these its field accepts (a duration, a selector, a label name or value,
the other GPU source)."""
NOT_PERTURBED: Mapping[str, str] = {
    "custom_rules": "adds the alerts of its file, in the group `otelprof-custom`",
}
"""Fields whose effect needs more than a changed value (a file of rules): what they reach, in words."""
OTHER_FILES: Mapping[str, tuple[str, ...]] = {
    "grafana_url": ("kubernetes/kube-prometheus-stack-values.yaml",),
    "webhook_url": ("kubernetes/alertmanagerconfig.yaml",),
    "prometheus_url": ("dashboards/provisioning/datasources.yaml", "kubernetes/grafana-provisioning.yaml"),
    "tempo_url": ("dashboards/provisioning/datasources.yaml", "dashboards/provisioning/datasources-tempo.yaml",
                  "kubernetes/grafana-datasources.yaml", "kubernetes/grafana-provisioning.yaml"),
    "prometheus_rule_name": ("otelprof-prometheusrule.yaml",),
    "prometheus_rule_release": ("otelprof-prometheusrule.yaml", "kubernetes/podmonitor.yaml",
                                "kubernetes/servicemonitor.yaml"),
}
"""Files of ``otelprof mixin -o DIR`` besides the rules and the dashboards (and their ConfigMap copies) that a
field changes (a test renders the bundle to keep this true)."""
COMMON_SHARE = 0.5
"""A field that reaches more than this share of the alerts is named once above the per-alert table, not in it."""

_SECTION = re.compile(r"^    # ---- (.+)$")
_NOTE = re.compile(r"^    # (.+)$")


@dataclass(frozen=True)
class Setting:
    """One MixinConfig field as the docs show it."""

    name: str
    default: Any
    meaning: str
    """The attribute docstring, on one line ("" without one)."""
    section: str
    """The ``# ---- `` comment above it in config.py."""
    note: str
    """The comment lines below that heading (what the section's fields share)."""


@dataclass(frozen=True)
class Uses:
    """What changing one field changes."""

    alerts: tuple[str, ...]
    """Alerts whose expression or ``for`` changes (or that appear or disappear), by name."""
    alert_texts: tuple[str, ...]
    """Alerts of which only labels, annotations or the runbook entry change."""
    records: tuple[str, ...]
    """Recording rules (their names with the default config) and rule groups that change."""
    panels: tuple[tuple[str, str], ...]
    """(dashboard title, panel title) of the panels that change; panel title "" for the dashboard's own
    variables and links."""
    base: str = ""
    """The base config's description when the field was changed on top of ``gpu_source=dcgm``."""
    note: str = ""
    """What the field reaches, in words, for a field not perturbed."""

    @property
    def empty(self) -> bool:
        return not (self.alerts or self.alert_texts or self.records or self.panels or self.note)


def settings() -> list[Setting]:
    """Every MixinConfig field in declaration order, with its docstring and section."""
    lines, _ = inspect.getsourcelines(MixinConfig)
    class_def = ast.parse("".join(lines)).body[0]
    assert isinstance(class_def, ast.ClassDef)
    docs: dict[str, str] = {}
    body = class_def.body
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            after = body[i + 1] if i + 1 < len(body) else None
            text = ""
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                    and isinstance(after.value.value, str):
                text = " ".join(after.value.value.split())
            docs[node.target.id] = text
    section, note = "", list[str]()
    field_section: dict[str, tuple[str, str]] = {}
    for line in lines:
        heading = _SECTION.match(line.rstrip("\n"))
        comment = _NOTE.match(line.rstrip("\n"))
        field = re.match(r"^    (\w+): ", line)
        if heading:
            section, note = heading.group(1).strip(), []
        elif comment and section:
            note.append(comment.group(1).strip())
        elif field and field.group(1) in docs:
            field_section[field.group(1)] = (section, " ".join(note))
    return [Setting(f.name, getattr(DEFAULT, f.name), docs.get(f.name, ""), *field_section.get(f.name, ("", "")))
            for f in dataclasses.fields(MixinConfig)]


def perturbed(name: str, base: MixinConfig = DEFAULT) -> Any:
    """A valid value of field ``name`` other than its value in ``base``."""
    value = getattr(base, name)
    if name == "actions":  # every alert gets an action other than its own
        own = dict(value)
        return tuple((a.short, mc.ACTION_CAPTURE if own.get(a.short) == mc.ACTION_STOP else mc.ACTION_STOP)
                     for a in _alerts(base))
    if name == "disabled_alerts":  # every alert left out
        return tuple(a.short for a in _alerts(base))
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 7
    if isinstance(value, float):
        return 0.37 if value <= 1 else round(value * 1.5 + 0.07, 6)
    if isinstance(value, tuple):
        return tuple(f"perturbed_{v}" for v in value) or ("Perturbed",)
    for candidate in STRING_CANDIDATES:
        if candidate == value:
            continue
        try:
            validate(_replaced(base, name, candidate))
        except ValueError:
            continue
        return candidate
    raise ValueError(f"no valid changed value for {name}")


def _replaced(config: MixinConfig, name: str, value: Any) -> MixinConfig:
    changes: dict[str, Any] = {name: value}
    return dataclasses.replace(config, **changes)


def _alerts(config: MixinConfig) -> list[Any]:
    from otelprof.mixin.alerts import alerts

    return alerts(config)


@dataclass(frozen=True)
class _Build:
    """What a config builds, keyed so that a renamed recording rule (a window in its name) is the same one."""

    conditions: dict[str, tuple[str, str]]
    texts: dict[str, Any]
    records: dict[str, Any]
    panels: dict[tuple[str, int], Any]
    """(dashboard, panel id) -> panel; id 0 is the dashboard's own variables and links."""
    titles: dict[tuple[str, int], str]


def _build(config: MixinConfig) -> _Build:
    from otelprof.dashboards.generate import dashboards
    from otelprof.mixin import gpu_source
    from otelprof.mixin.recording_rules import aggregates
    from otelprof.mixin.rule_groups import rule_groups
    from otelprof.mixin.rules import recording_rules

    conditions, texts = {}, {}
    for alert in _alerts(config):
        rule = alert.rule(config)
        conditions[alert.name] = (alert.expr, alert.for_)
        texts[alert.name] = (rule["labels"], rule["annotations"], alert.runbook, alert.summary, alert.description)
    default_names = _default_record_names()
    records: dict[str, Any] = {}
    for r in recording_rules(config):
        records[default_names.get(r.key, r.name)] = (r.name, r.expr, r.group)
    for a in aggregates(config):
        records[default_names.get(a.key, a.name)] = (a.name, a.expr, a.labels)
    for group in rule_groups(config):
        # a group's own settings (interval); the DCGM mapping group's rules too, which have no keys
        whole = group["name"] == gpu_source.GROUP
        records[f"group {group['name']}"] = group if whole else {k: v for k, v in group.items() if k != "rules"}
    panels: dict[tuple[str, int], Any] = {}
    titles: dict[tuple[str, int], str] = {}
    for board in dashboards(config):
        data = board.to_json()
        name = _board(data["title"])
        for panel in data["panels"]:
            if panel.get("type") != "row":  # a row only groups panels
                panels[(name, panel["id"])] = panel
                titles[(name, panel["id"])] = panel.get("title") or f"panel {panel['id']}"
        panels[(name, 0)] = {k: v for k, v in data.items() if k != "panels"}
    return _Build(conditions, texts, records, panels, titles)


@functools.cache
def _default_record_names() -> dict[str, str]:
    from otelprof.mixin.recording_rules import aggregates
    from otelprof.mixin.rules import recording_rules

    return {**{r.key: r.name for r in recording_rules(DEFAULT)}, **{a.key: a.name for a in aggregates(DEFAULT)}}


@functools.cache
def _base_build(index: int) -> _Build:
    return _build(BASES[index][1])


def _changed(before: Mapping[Any, Any], after: Mapping[Any, Any]) -> list[Any]:
    """Keys whose value differs, appeared or disappeared, in ``before``'s order then ``after``'s."""
    return [k for k in before if before[k] != after.get(k, _MISSING)] + [k for k in after if k not in before]


_MISSING = object()


def uses(name: str) -> Uses:
    """What changing field ``name`` alone changes (on the first of :data:`BASES` where it changes anything)."""
    if name in NOT_PERTURBED:
        return Uses((), (), (), (), note=NOT_PERTURBED[name])
    for index, (label, base) in enumerate(BASES):
        before = _base_build(index)
        after = _build(_replaced(base, name, perturbed(name, base)))
        conditions = _changed(before.conditions, after.conditions)
        texts = [a for a in _changed(before.texts, after.texts) if a not in conditions]
        records = _changed(before.records, after.records)
        panels = [(board, before.titles.get((board, i)) or after.titles.get((board, i), "")) if i else (board, "")
                  for board, i in _changed(before.panels, after.panels)]
        found = Uses(tuple(conditions), tuple(texts), tuple(records), tuple(panels), label)
        if not found.empty:
            return found
    return Uses((), (), (), ())


@functools.cache
def all_uses() -> dict[str, Uses]:
    """:func:`uses` of every field."""
    return {f.name: uses(f.name) for f in dataclasses.fields(MixinConfig)}


# ---- Markdown

def _md(text: str) -> str:
    """A docstring's reStructuredText as Markdown in a table cell."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    return text.replace("|", "\\|")


def _default(name: str, value: Any) -> str:
    if name == "actions":
        value = ",".join(f"{alert}:{action}" for alert, action in value)
    elif isinstance(value, tuple):
        value = ",".join(value)
    if value == "":
        return "(empty)"
    text = repr(value) if isinstance(value, float) else str(value)
    return f"`{text}`".replace("|", "\\|")


def _names(names: tuple[str, ...], every: list[str], what: str) -> str:
    """``names`` in backticks; "every X" when they are all of ``every``, "every X but ..." when most are."""
    if not names:
        return ""
    rest = [n for n in every if n not in names]
    if not rest and set(names) <= set(every):
        return f"every {what}"
    if len(rest) < len(names) / 2 and set(names) <= set(every):
        return f"every {what} but " + ", ".join(f"`{n}`" for n in rest)
    return ", ".join(f"`{n}`" for n in names)


def _alerts_cell(u: Uses, every: list[str]) -> str:
    if u.note:
        return _md(u.note)
    parts = []
    if u.alerts:
        parts.append(_names(u.alerts, every, "alert"))
    if u.alert_texts:
        parts.append(("texts of " if u.alerts else "texts only: ") + _names(u.alert_texts, every, "alert"))
    return "; ".join(parts)


def _records_cell(u: Uses, every: list[str]) -> str:
    rules = tuple(r for r in u.records if not r.startswith("group "))
    groups = tuple(r.removeprefix("group ") for r in u.records if r.startswith("group "))
    parts = [_names(rules, every, "recording rule")] if rules else []
    if groups:
        parts.append(("group " if len(groups) == 1 else "groups ") + ", ".join(f"`{g}`" for g in groups))
    return "; ".join(parts)


def _board(title: str) -> str:
    return title.removeprefix("otelprof / ")


def _panels_cell(u: Uses, every: Mapping[str, list[str]], name: str) -> str:
    boards: dict[str, list[str]] = {}
    for board, panel in u.panels:
        boards.setdefault(board, [])
        if panel:
            boards[board].append(panel)
    parts = []
    for board, panels in boards.items():
        rest = [p for p in every[board] if p not in panels]
        if not panels:
            text = "its variables"
        elif not rest:
            text = "every panel"
        elif len(rest) < len(panels) / 2:
            text = "every panel but " + " · ".join(dict.fromkeys(rest))
        else:
            text = " · ".join(dict.fromkeys(panels))
        parts.append(f"**{board}**: {text}")
    files = OTHER_FILES.get(name, ())
    if files:
        parts.append("files " + ", ".join(f"`{f}`" for f in files))
    return _md("<br>".join(parts))


def settings_markdown() -> str:
    """The settings tables of docs/mixin-settings.md: one per section of config.py."""
    build = _base_build(0)
    alerts = list(build.conditions)
    records = [r for r in build.records if not r.startswith("group ")]
    panels: dict[str, list[str]] = {}
    for board, i in build.panels:
        panels.setdefault(board, [])
        if i:
            panels[board].append(build.titles[(board, i)])
    found = all_uses()
    out: list[str] = []
    section = None
    for s in settings():
        if s.section != section:
            section = s.section
            out += ["", f"### {_md(section)}", ""]
            if s.note:
                out += [_md(s.note), ""]
            out += ["| Setting | Default | Meaning | Alerts | Recording rules | Dashboard panels, other files |",
                    "| --- | --- | --- | --- | --- | --- |"]
        u = found[s.name]
        cells = [_alerts_cell(u, alerts), _records_cell(u, records), _panels_cell(u, panels, s.name)]
        if u.base:
            cells = [f"{u.base}: {c}" if c else "" for c in cells]
        out.append(f"| `{s.name}` | {_default(s.name, s.default)} | {_md(s.meaning)} | "
                   + " | ".join(c or "-" for c in cells) + " |")
    return "\n".join(out).strip("\n")


def common_settings() -> list[str]:
    """Fields that reach more than :data:`COMMON_SHARE` of the alerts (the selectors, the links)."""
    total = len(_base_build(0).conditions)
    return [name for name, u in all_uses().items()
            if len(set(u.alerts) | set(u.alert_texts)) > COMMON_SHARE * total]


def alert_settings() -> dict[str, tuple[list[str], list[str]]]:
    """Alert name -> (fields that change its expression or ``for``, fields that change only its texts), leaving out
    :func:`common_settings`, in runbook order."""
    common = set(common_settings())
    result: dict[str, tuple[list[str], list[str]]] = {name: ([], []) for name in _base_build(0).conditions}
    for name, u in all_uses().items():
        if name in common or u.base:
            continue
        for alert in u.alerts:
            if alert in result:
                result[alert][0].append(name)
        for alert in u.alert_texts:
            if alert in result:
                result[alert][1].append(name)
    return result


def alerts_markdown() -> str:
    """The per-alert table of docs/mixin-settings.md: where each alert's thresholds, windows and ``for`` live."""
    common = ", ".join(f"`{name}`" for name in common_settings())
    rows = [f"Besides {common}, which reach more than half of the alerts:", "",
            "| Alert | Settings of its expression and `for` | Settings only in its texts |", "| --- | --- | --- |"]
    for alert, (condition, texts) in alert_settings().items():
        rows.append(f"| `{alert}` | {', '.join(f'`{n}`' for n in condition) or '-'} | "
                    f"{', '.join(f'`{n}`' for n in texts) or '-'} |")
    return "\n".join(rows)
