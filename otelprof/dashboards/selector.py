"""The mixin's ``selector`` applied to rendered dashboards, as the rules apply it to their inputs.

Every raw otelprof series a panel or variable reads gets the extra matchers (``namespace="ml"``);
recording-rule series (``a:b:c``) were filtered by the rules already and ``ALERTS`` / ``up`` carry
other labels, so they are left alone. The dashboards themselves are built once with no selector;
this pass is how ``otelprof mixin --set selector=...`` reaches them.
"""

from __future__ import annotations

import re
from typing import Any

_SELECTOR = re.compile(r"(?<![\w:$])([A-Za-z_][A-Za-z0-9_]*)\{([^{}]*)\}")
_LABEL_VALUES = re.compile(r"label_values\(([A-Za-z_][A-Za-z0-9_]*)\s*,")
_SKIP = frozenset({"ALERTS", "ALERTS_FOR_STATE", "up"})
_EXPR_KEYS = frozenset({"expr", "query", "definition"})


def apply_to_expr(expr: str, selector: str) -> str:
    """``expr`` with ``selector``'s matchers added to every raw series selector in it."""
    selector = selector.strip()
    if not selector:
        return expr

    def series(match: re.Match[str]) -> str:
        name, inner = match.group(1), match.group(2)
        if name in _SKIP or name.startswith("__"):
            return match.group(0)
        return f"{name}{{{selector}, {inner}}}" if inner.strip() else f"{name}{{{selector}}}"

    expr = _SELECTOR.sub(series, expr)
    return _LABEL_VALUES.sub(lambda m: f"label_values({m.group(1)}{{{selector}}},"
                             if m.group(1) not in _SKIP else m.group(0), expr)


def apply(board: Any, selector: str) -> Any:
    """A copy of a dashboard's JSON with ``selector`` applied to every PromQL query in it."""
    if not selector.strip():
        return board
    if isinstance(board, dict):
        return {key: (apply_to_expr(value, selector) if key in _EXPR_KEYS and isinstance(value, str)
                      else apply(value, selector)) for key, value in board.items()}
    if isinstance(board, list):
        return [apply(item, selector) for item in board]
    return board


def _rename(expr: str, names: dict[str, str]) -> str:
    pattern = re.compile(r"(?<![\w:])(" + "|".join(re.escape(n) for n in names) + r")(?![\w:])")
    return pattern.sub(lambda m: names[m.group(1)], expr)


def rename_series(board: Any, names: dict[str, str]) -> Any:
    """A copy of a dashboard's JSON with the series ``names`` (old -> new) renamed in every PromQL query: with the
    mixin's ``gpu_source=dcgm`` otelprof's GPU gauges become the dcgm-exporter records standing for them."""
    if not names:
        return board
    if isinstance(board, dict):
        return {key: (_rename(value, names) if key in _EXPR_KEYS and isinstance(value, str)
                      else rename_series(value, names)) for key, value in board.items()}
    if isinstance(board, list):
        return [rename_series(item, names) for item in board]
    return board
