"""The dashboards follow the mixin config: every threshold, window and number a panel draws or quotes is the
config's, so ``otelprof mixin -o DIR --set ...`` writes dashboards that agree with its rules and runbook.

The settings the panels use are found, not listed by hand: each MixinConfig field is changed alone and kept when
the dashboards change. For each of them, every panel that changed shows the new value (in its text, query or
threshold) and quotes the default less often than before: a new value replaces the old, it is not added beside it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import otelprof.dashboards
from otelprof.dashboards import ids, queries
from otelprof.dashboards.generate import dashboards, render_all
from otelprof.mixin.alert_text import pct
from otelprof.mixin.config import MixinConfig, seconds, with_overrides
from otelprof.mixin.promql import Q
from otelprof.mixin.settings_doc import perturbed

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = MixinConfig()
"""A changed string setting: the first of these its field accepts (a duration, a selector, a label name or value,
the other GPU source)."""

USED = {
    # selectors, sources and labels the queries read
    "selector", "gpu_source", "train_phase", "target_labels",
    # windows: in recording-rule names and quoted
    "window", "straggler_window", "input_bound_window", "dashboard_rate_window", "host_memory_increase_window",
    "gpu_memory_increase_window", "loss_window", "absent_lookback", "stalled_training_threshold",
    "max_initialization_time",
    # thresholds: drawn and quoted
    "cpu_threshold", "gpu_threshold", "io_threshold", "cpu_bottleneck_threshold", "io_bottleneck_threshold",
    "low_gpu_threshold_p95", "low_gpu_threshold_p5", "batch_size_cpu_threshold_p95",
    "batch_size_gpu_threshold_p95", "batch_size_gpu_memory_threshold_p95", "gpu_memory_capacity_threshold",
    "host_memory_limit_threshold", "load_balancing_threshold", "straggler_ratio", "dataloader_min_threshold",
    "dataloader_max_threshold", "input_bound_threshold", "vanishing_gradient_threshold",
}
"""The MixinConfig fields some panel reads. Windows of recording rules no panel reads (the outlier count, the
per-step loss mean) are not here: the rules are renamed, the panels are not."""


def _perturbed(name: str) -> Any:
    """A valid value of field ``name`` other than its default (the settings table's own)."""
    return perturbed(name)


def _panels(config: MixinConfig) -> dict[tuple[str, int], dict[str, Any]]:
    return {(board.uid, panel["id"]): panel for board in dashboards(config) for panel in board.to_json()["panels"]}


def _leaves(node: Any) -> str:
    """Every string and number in ``node`` (a panel's JSON), one per line: texts, queries, thresholds."""
    if isinstance(node, dict):
        return "\n".join(_leaves(v) for v in node.values())
    if isinstance(node, list):
        return "\n".join(_leaves(v) for v in node)
    return node if isinstance(node, str) else json.dumps(node)


def _quotes(value: Any) -> list[str]:
    """How a panel writes ``value``: ratio, percentage, number; a duration and its seconds; a label's name."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return sorted({queries.percent(value), pct(value), f"{value:g}", json.dumps(value)})
    if isinstance(value, tuple):
        return [q for v in value for q in _quotes(v)]
    try:
        return [value, str(queries.whole(seconds(value)))]
    except ValueError:
        return [value] if value else []


def _count(text: str, quotes: list[str]) -> int:
    """Occurrences of any of ``quotes`` as a whole token (``0.5`` is not in ``0.55``, ``job`` not in ``job_name``)."""
    total = 0
    for quote in quotes:
        left, right = (r"(?<![\d.])", r"(?!\.?\d)") if quote[0].isdigit() else (r"(?<!\w)", r"(?!\w)")
        total += len(re.findall(left + re.escape(quote) + right, text))
    return total


def _boards(config: MixinConfig) -> list[Any]:
    return [board.to_json() for board in dashboards(config)]


def test_the_settings_the_panels_use_are_found() -> None:
    base = _boards(DEFAULT)
    used = {f.name for f in dataclasses.fields(MixinConfig)
            if _boards(dataclasses.replace(DEFAULT, **{f.name: _perturbed(f.name)})) != base}
    assert used, "no setting reaches the dashboards"
    assert used == USED


def _changed(before: dict[tuple[str, int], Any], after: dict[tuple[str, int], Any]) -> list[tuple[str, int]]:
    assert before.keys() == after.keys()
    return [key for key in before if before[key] != after[key]]


@pytest.mark.parametrize("name", sorted(USED))
def test_every_changed_panel_shows_the_new_value(name: str) -> None:
    new = _perturbed(name)
    before, after = _panels(DEFAULT), _panels(dataclasses.replace(DEFAULT, **{name: new}))
    changed = _changed(before, after)
    assert changed, f"{name}={new} changes no panel"
    for key in changed:
        assert _count(_leaves(after[key]), _quotes(new)) > 0, f"{key} changed with {name}={new} but does not show it"


ALL_CHANGED = {name: _perturbed(name) for name in USED}


@pytest.mark.parametrize("name", sorted(USED - {"gpu_source", "selector"}))
def test_no_panel_keeps_quoting_the_default(name: str) -> None:
    """With every other setting changed, changing ``name`` too leaves fewer quotes of its default in each panel it
    changes: the new value replaced the old one (defaults that other settings share are out of the way)."""
    others = dataclasses.replace(DEFAULT, **{**ALL_CHANGED, name: getattr(DEFAULT, name)})
    before, after = _panels(others), _panels(dataclasses.replace(others, **{name: ALL_CHANGED[name]}))
    old = _quotes(getattr(DEFAULT, name))
    changed = _changed(before, after)
    assert changed and old
    for key in changed:
        assert _count(_leaves(after[key]), old) < _count(_leaves(before[key]), old), \
            f"{key} still quotes {name}'s default {getattr(DEFAULT, name)!r} as often with {name}={ALL_CHANGED[name]}"


def _threshold_steps(panel: dict[str, Any]) -> list[tuple[str, float | None]]:
    return [(s["color"], s["value"]) for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]


def test_input_bound_threshold_reaches_every_panel_that_quotes_it() -> None:
    """The issue's example: --set input_bound_threshold=0.3 gives 0.3 red lines and 30 %, never 50 %."""
    boards = {board["uid"]: board for board in _boards(with_overrides(DEFAULT, ["input_bound_threshold=0.3"]))}
    quoting = [(uid, panel) for uid, board in boards.items() for panel in board["panels"]
               if "input-bound" in panel.get("description", "")]
    assert {(uid, panel["id"]) for uid, panel in quoting} == {
        (ids.RANKS, ids.RANKS_WAIT_RATIO), (ids.TRAINING_REPORT, 1303), (ids.TIMELINE, 103)}
    for uid, panel in quoting:
        assert "30%" in panel["description"] and not re.search(r"50 ?%", panel["description"]), (uid, panel["id"])
        assert ("red", 0.3) in _threshold_steps(panel), (uid, panel["id"])
        assert 0.5 not in [value for _, value in _threshold_steps(panel)], (uid, panel["id"])
    timeline = next(panel for uid, panel in quoting if uid == ids.TIMELINE)
    assert _threshold_steps(timeline) == [("green", None), ("#EAB839", 0.15), ("red", 0.3)]


def test_batch_size_thresholds_are_quoted_each_when_they_differ() -> None:
    config = with_overrides(DEFAULT, ["batch_size_gpu_threshold_p95=0.6", "batch_size_gpu_memory_threshold_p95=0.5",
                                      "batch_size_cpu_threshold_p95=0.4"])
    panels = _panels(config)
    assert "below 60 %, 50 % and 40 % respectively at the 95th percentile" in \
        panels[(ids.TRAINING_REPORT, 801)]["description"]
    assert "below 60%, 50% and 40% respectively means nothing is busy" in \
        panels[(ids.GPU_SYSTEM, ids.SYSTEM_BATCH_SIZE)]["description"]
    assert "all below 70 %" in _panels(DEFAULT)[(ids.TRAINING_REPORT, 801)]["description"]


def test_no_module_of_the_dashboards_holds_a_config_or_a_selector() -> None:
    """Thresholds, windows and selectors come from the config a builder is given, never from one frozen at import."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(otelprof.dashboards.__path__):
        module = importlib.import_module(f"otelprof.dashboards.{info.name}")
        for attribute, value in vars(module).items():
            assert not isinstance(value, (MixinConfig, queries.Queries, Q)), f"{info.name}.{attribute}"


def _mixin(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "otelprof", "mixin", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


SETTINGS = ["input_bound_threshold=0.3", "window=5m", "straggler_ratio=1.5", "stalled_training_threshold=45m",
            'selector=namespace="ml"', "gpu_source=dcgm", "train_phase=training", "prometheus_url=http://p:9090"]


def test_the_mixin_command_writes_the_dashboards_of_its_settings(tmp_path: Path) -> None:
    result = _mixin(tmp_path, "-o", "out", *(arg for setting in SETTINGS for arg in ("--set", setting)))
    assert result.returncode == 0, result.stderr
    assert not result.stderr
    expected = render_all(with_overrides(DEFAULT, SETTINGS))
    written = {str(p.relative_to(tmp_path / "out" / "dashboards")): p.read_text(encoding="utf-8")
               for p in (tmp_path / "out" / "dashboards").rglob("*") if p.is_file()}
    assert written == expected
    assert written != render_all(DEFAULT)
    ranks = json.loads(written[f"{ids.RANKS}.json"])
    wait = next(panel for panel in ranks["panels"] if panel["id"] == ids.RANKS_WAIT_RATIO)
    assert "above 30% the input-bound alert fires" in wait["description"]
    assert ("red", 0.3) in _threshold_steps(wait)
