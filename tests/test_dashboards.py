"""The dashboards' structure: committed files current, Grafana's schema, lint, links from the alerts.

Lint: every target names a data-source variable, every panel has a unit and a description, ids are
unique and the ones alerts link to exist, panel types are current ones, every variable a query uses is
defined, every metric a query reads is in the catalog or the recording rules, and panels do not
overlap. The meaning of the queries is tested against a real Prometheus in test_dashboards_prometheus.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from otelprof.dashboards import ids
from otelprof.dashboards.common import PROMETHEUS_UID, TEMPO_UID
from otelprof.dashboards.generate import DASHBOARDS_DIR, dashboards, render_all, write
from otelprof.dashboards.model import NEEDS, Prom, TraceQL
from otelprof.mixin import MixinConfig
from otelprof.mixin.alerts import alerts
from otelprof.mixin.promql import catalog_series_names
from otelprof.mixin.recording_rules import aggregate_names
from otelprof.mixin.rules import recording_names

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "tests" / "fixtures" / "grafana-dashboard.schema.json").read_text(encoding="utf-8"))
BOARDS = {board.uid: board.to_json() for board in dashboards()}
CURRENT_TYPES = {"timeseries", "table", "heatmap", "stat", "state-timeline", "bargauge", "traces"}
GRAFANA_VARIABLES = {"__range", "__range_s", "__rate_interval", "__interval", "__all_variables", "__url_time_range",
                     "__value", "__field", "__tags"}
REQUIRED_VARIABLES = {ids.VAR_DATASOURCE, ids.VAR_JOB, ids.VAR_NODE, ids.VAR_RANK, ids.VAR_GPU}


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def test_generated_files_are_current() -> None:
    for name, text in render_all().items():
        path = ROOT / DASHBOARDS_DIR / name
        assert path.exists() and path.read_text(encoding="utf-8") == text, \
            f"{path} is stale: run `otelprof generate`"
    committed = {p.name for p in (ROOT / DASHBOARDS_DIR).glob("*.json")}
    assert committed == {name for name in render_all() if name.endswith(".json")}


def test_write_reports_only_changes(tmp_path: Path) -> None:
    first = write(tmp_path)
    assert len(first) == len(render_all())
    assert write(tmp_path) == []


@pytest.mark.parametrize("uid", sorted(BOARDS))
def test_dashboard_matches_grafanas_schema(uid: str) -> None:
    jsonschema.Draft7Validator(SCHEMA).validate(BOARDS[uid])


def test_the_schema_is_strict() -> None:
    """The fixture rejects what Grafana would ignore or choke on: a misspelt panel key, a missing gridPos field."""
    board = json.loads(json.dumps(BOARDS[ids.TRAINING_REPORT]))
    board["panels"][1]["fieldconfig"] = board["panels"][1].pop("fieldConfig")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(board, SCHEMA)
    board = json.loads(json.dumps(BOARDS[ids.TRAINING_REPORT]))
    del board["panels"][1]["gridPos"]["w"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(board, SCHEMA)


def test_uids_titles_and_variables() -> None:
    assert set(BOARDS) == set(ids.ALL_UIDS)
    assert len({b["title"] for b in BOARDS.values()}) == len(BOARDS)
    for uid, board in BOARDS.items():
        names = [v["name"] for v in board["templating"]["list"]]
        assert len(names) == len(set(names)), uid
        assert set(names) >= REQUIRED_VARIABLES, (uid, names)
        assert ids.TAG in board["tags"]


@pytest.mark.parametrize("uid", sorted(BOARDS))
def test_every_target_uses_a_datasource_variable(uid: str) -> None:
    board = BOARDS[uid]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    for panel in panels(board):
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in [*panel["targets"], panel]:
            source = target["datasource"]
            match = re.fullmatch(r"\$\{(\w+)\}", source["uid"])
            assert match, f"{panel['title']}: data source {source} is not a variable"
            variable = variables[match.group(1)]
            assert variable["type"] == "datasource" and variable["query"] == source["type"], panel["title"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == f"${{{ids.VAR_DATASOURCE}}}"


@pytest.mark.parametrize("uid", sorted(BOARDS))
def test_every_panel_has_a_unit_a_description_and_a_current_type(uid: str) -> None:
    for panel in panels(BOARDS[uid]):
        assert panel["type"] in CURRENT_TYPES, panel["type"]
        assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
        assert len(panel["description"]) > 20 and panel["description"].endswith("."), panel["title"]
        assert panel["title"] and panel["title"] == panel["title"].strip()


@pytest.mark.parametrize("uid", sorted(BOARDS))
def test_ids_are_unique_and_panels_do_not_overlap(uid: str) -> None:
    board = BOARDS[uid]
    ids_seen = [p["id"] for p in board["panels"]]
    assert all(isinstance(i, int) and i > 0 for i in ids_seen)
    assert len(ids_seen) == len(set(ids_seen)), sorted(i for i in ids_seen if ids_seen.count(i) > 1)
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24
        area = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area


@pytest.mark.parametrize("uid", sorted(BOARDS))
def test_queries_use_defined_variables_and_known_metrics(uid: str) -> None:
    board = BOARDS[uid]
    defined = {v["name"] for v in board["templating"]["list"]} | GRAFANA_VARIABLES
    known = catalog_series_names() | set(recording_names().values()) | set(aggregate_names().values())
    known |= {"ALERTS", "up"}
    for panel in panels(board):
        texts = [t.get("expr") or t.get("query", "") for t in panel["targets"]]
        texts += [link["url"] for link in panel["fieldConfig"]["defaults"].get("links", [])]
        texts += [link["url"] for override in panel["fieldConfig"]["overrides"] for prop in override["properties"]
                  if prop["id"] == "links" for link in prop["value"]]
        for text in texts:
            for name in re.findall(r"\$\{?(\w+)", text):
                assert name in defined, f"{panel['title']}: ${name} is not a variable of {uid}"
        for target in panel["targets"]:
            if "expr" in target:
                for metric in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", target["expr"]):
                    assert metric in known, f"{panel['title']}: {metric} is neither in the catalog nor a rule"


def test_needs_are_documented() -> None:
    for board in dashboards():
        for panel in board.panels():
            for target in panel.targets:
                if isinstance(target, Prom):
                    assert target.needs <= set(NEEDS), (panel.title, target.needs)


def test_timeline_searches_the_step_spans_and_shows_a_trace() -> None:
    board = next(b for b in dashboards() if b.uid == ids.TIMELINE)
    queries = [t.query for p in board.panels() for t in p.targets if isinstance(t, TraceQL)]
    assert any('name = "otelprof.step"' in q and "service.name" in q for q in queries)
    assert any("otelprof.step.outlier = true" in q for q in queries)
    assert "traces" in {p.kind for p in board.panels()}
    kinds = {p.kind for p in board.panels()}
    assert "state-timeline" in kinds


def test_step_time_panels_link_to_the_traces() -> None:
    for uid, panel_id in ((ids.TRAINING_REPORT, ids.REPORT_STEP_TIME), (ids.TIMELINE, ids.TIMELINE_STEP_TIME)):
        [panel] = [p for p in BOARDS[uid]["panels"] if p["id"] == panel_id]
        urls = [link["url"] for link in panel["fieldConfig"]["defaults"]["links"]]
        assert any(f"/d/{ids.TIMELINE}/" in url and "${__field.labels.rank}" in url for url in urls), urls


def test_every_alert_links_to_a_panel_showing_its_evidence() -> None:
    """The alerts name a dashboard and the panel on it (their declaration's ``panel``), which must exist; the
    alert's link opens it."""
    for alert in alerts(MixinConfig()):
        assert alert.panel is not None, alert.name
        assert alert.panel in {p["id"] for p in BOARDS[alert.dashboard]["panels"]}, (alert.name, alert.panel)
        assert alert.dashboard_url(MixinConfig()).endswith(f"&viewPanel={alert.panel}"), alert.name
    url = ids.dashboard_url("http://grafana:3000/", ids.RANKS, {ids.VAR_JOB: "{{ $labels.job_name }}"},
                            ids.RANKS_STRAGGLER)
    assert url == f"http://grafana:3000/d/{ids.RANKS}?var-job_name={{{{ $labels.job_name }}}}&viewPanel=102"


def test_provisioning() -> None:
    files = render_all()
    provider = yaml.safe_load(files["provisioning/dashboards.yaml"])
    [entry] = provider["providers"]
    assert entry["type"] == "file" and entry["options"]["path"].startswith("/")
    sources = yaml.safe_load(files["provisioning/datasources.yaml"])["datasources"]
    assert {s["uid"]: s["type"] for s in sources} == {PROMETHEUS_UID: "prometheus", TEMPO_UID: "tempo"}
    tempo = next(s for s in sources if s["type"] == "tempo")
    to_metrics = tempo["jsonData"]["tracesToMetrics"]
    assert to_metrics["datasourceUid"] == PROMETHEUS_UID
    assert {t["value"] for t in to_metrics["tags"]} == {ids.VAR_JOB, ids.VAR_RANK}
    for query in to_metrics["queries"]:
        assert "{$$__tags}" in query["query"]  # $$: not expanded as an environment variable by Grafana
        for metric in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", query["query"]):
            assert metric in catalog_series_names()
    [tempo_only] = yaml.safe_load(files["provisioning/datasources-tempo.yaml"])["datasources"]
    assert tempo_only == tempo
    # the dashboards' data-source variables select the provisioned data sources by default
    for board in BOARDS.values():
        for variable in board["templating"]["list"]:
            if variable["type"] == "datasource":
                assert variable["current"]["value"] in (PROMETHEUS_UID, TEMPO_UID)
