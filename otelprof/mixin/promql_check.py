"""What the mixin writes, checked before it is written: PromQL parsed by a real parser (``promql-parser``, the
Rust parser of GreptimeDB's PromQL engine), selectors parsed as label matchers, alert templates balanced.

One typo in a rules file makes Prometheus refuse the whole file — every otelprof alert lost — so a user's
setting or rule that would give PromQL Prometheus refuses is a one-line error before anything is written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import promql_parser

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_PROBE = "otelprof_selector_probe"


def check_expression(expr: str, where: str) -> None:
    """Raise ValueError naming ``where`` when ``expr`` is not PromQL Prometheus accepts."""
    try:
        promql_parser.parse(expr)
    except Exception as exc:  # the parser raises ValueError; anything else from it means the same
        raise ValueError(f"{where}: invalid PromQL: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None


def check_selector(selector: str, setting: str) -> None:
    """``selector`` must be label matchers alone (``name="v", other=~"r.*"``): nothing that leaves the braces."""
    if not selector:
        return
    try:
        parsed: Any = promql_parser.parse(f"{_PROBE}{{{selector}}}")
    except Exception as exc:
        raise ValueError(f"{setting} must be label matchers such as namespace=\"ml\": {str(exc)[:200]}") from None
    if type(parsed).__name__ != "VectorSelector" or getattr(parsed, "name", None) != _PROBE:
        raise ValueError(f"{setting} must be label matchers such as namespace=\"ml\", not an expression")


def check_label_value(value: str, setting: str) -> None:
    """A value otelprof writes inside ``label="..."``: no quote, backslash or control character."""
    if not value or any(ch in value for ch in '"\\') or any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError(f"{setting} must be a plain label value (no quotes, backslashes or control characters)")


def check_label_name(value: str, setting: str) -> None:
    if LABEL_NAME.fullmatch(value) is None:
        raise ValueError(f"{setting} must be a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*), not {value!r}")


def check_template(text: str, where: str) -> None:
    """Go-template actions in an alert's labels and annotations must be closed: ``{{ ... }}``, not nested."""
    depth = 0
    for token in re.findall(r"\{\{|\}\}", text):
        depth += 1 if token == "{{" else -1
        if depth not in (0, 1):
            raise ValueError(f"{where}: unbalanced {{{{ }}}} in a template")
    if depth:
        raise ValueError(f"{where}: a template opened with {{{{ is never closed")


def check_groups(groups: Iterable[Mapping[str, Any]], source: str) -> None:
    """Every rule of a Prometheus rules document: its expression and templates."""
    for group in groups:
        for rule in group.get("rules", []):
            name = rule.get("alert") or rule.get("record") or "a rule"
            where = f"{source}: {name}"
            check_expression(str(rule.get("expr", "")), where)
            for key in ("labels", "annotations"):
                for field, text in (rule.get(key) or {}).items():
                    check_template(str(text), f"{where} {key}.{field}")
