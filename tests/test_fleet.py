"""A synthetic fleet (benchmarks/fleet.py) of 64 ranks on 8 nodes, judged by a real Prometheus with the shipped
alert rules: each injected fault (straggler, leaking rank, stalled rank, NaN loss) fires for exactly its rank
and nothing else fires; a healthy fleet fires nothing. 16 minutes of 15 s scrapes are backfilled with promtool,
then the recording rules evaluated over them (the alerts read recorded series), and each alert is evaluated over
its ``for:`` window (docs/scale.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from benchmarks import fleet as fl
from otelprof import semconv as sc
from tests.servers import free_port, require_binary

pytestmark = pytest.mark.serial  # alone, after the parallel part of make test: its timings are live

RANKS, NODES, INTERVAL = 64, 8, 15.0
HEALTHY = fl.Faults(straggler=-1, leak=-1, stall=-1, nan=-1)


def _judge(tmp_path: Path, faults: fl.Faults) -> set[tuple[str, str]]:
    require_binary("promtool")
    require_binary("prometheus")
    end = float(int(time.time()) - 60)
    start = end - 16 * 60
    fleet = fl.Fleet(RANKS, NODES, start - 1200, faults)
    fleet.advance(start)
    fleet.inject_nan(end - 4 * 60)
    samples = fl.history(fleet, start, end, INTERVAL, tmp_path / "history.om")
    assert samples > RANKS * 64 * 60  # every rank, every scrape
    fl.backfill(tmp_path / "history.om", tmp_path / "data")
    config = {"global": {"scrape_interval": "15s"}}
    with fl.run_prometheus(tmp_path, config, free_port()) as (url, _):  # the alerts read recorded series too
        fl.backfill_recording_rules(url, start, end, INTERVAL, tmp_path / "data")
    with fl.run_prometheus(tmp_path, config, free_port()) as (url, _):
        recorded = fl.get(url, "/api/v1/query", {"query": "count(otelprof:step_compute_seconds:mean_5m)",
                                                 "time": str(end)})["data"]["result"]
        assert float(recorded[0]["value"][1]) == RANKS - (faults.stall >= 0)  # the stalled rank has no steps
        ranks = fl.get(url, "/api/v1/query", {"query": "count(otelprof_process_start_time_seconds)",
                                              "time": str(end)})["data"]["result"]
        assert float(ranks[0]["value"][1]) == RANKS
        return fl.judge(url, end, INTERVAL)


@pytest.mark.parametrize("faults", [fl.default_faults(RANKS), HEALTHY], ids=["faults", "healthy"])
def test_each_fault_fires_for_exactly_its_rank_and_nothing_else(tmp_path: Path, faults: fl.Faults) -> None:
    firing = _judge(tmp_path, faults)
    assert firing == (set() if faults == HEALTHY else faults.expected())


def test_the_fleet_serves_only_catalog_series_with_the_identity_labels() -> None:
    fleet = fl.Fleet(16, 2, time.time() - 1500)
    fleet.advance(time.time())
    families = {m.prometheus_name for m in sc.METRICS}
    identity = [f'{sc.prometheus_label(label)}="' for label in sc.IDENTITY_LABELS]
    for model in (fleet.models[0], fleet.models[1]):
        text = model.exposition()
        for line in text.splitlines():
            if line.startswith("# TYPE ") and not line.startswith("# TYPE target_info"):
                assert line.split()[2].removesuffix("_total") in families, line
            elif line and not line.startswith(("#", "target_info")):
                assert all(label in line for label in identity), line
    node_wide = fleet.models[0].exposition()
    assert sc.GPU_UTILIZATION.prometheus_name in node_wide  # the sampling rank serves the node's 8 GPUs
    assert sc.GPU_UTILIZATION.prometheus_name not in fleet.models[1].exposition()
