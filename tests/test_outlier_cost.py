"""An outlier's cost is the outliers' own: a step slowed by compiling (a ``compile`` region) or by otelprof's
profiling is neither counted as an outlier nor charged to their cost. Seen on nanoGPT compiled through its own
``--compile``: one slow evaluation step was reported as costing 4.8 s, the first step's compile time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

LOOP = """
import sys, time
import otelprof
otelprof.init(job_name="cost", record_dir=sys.argv[1], profile_every=0, system_metrics=False)
for i in range(60):
    with otelprof.step():
        with otelprof.annotate("forward"):
            if i == 0:
                with otelprof.annotate("compile"):
                    time.sleep(1.0)  # the first step compiles
            time.sleep(0.2 if i == 40 else 0.005)  # one step is really slow
otelprof.shutdown()
"""


def test_a_compiled_step_is_no_outlier_and_costs_the_outliers_nothing(tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(LOOP, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL")}
    subprocess.run([sys.executable, str(script), str(tmp_path / "runs")], check=True, timeout=120, env=env)
    out = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "otelprof", "report", str(tmp_path / "runs"), "-o", str(out)], check=True,
                   capture_output=True, timeout=300)
    [row] = json.loads(out.read_text())["steps"]["rows"]
    assert row["outliers"] == 1 and row["outlier_steps"] == [40]
    assert 0.15 < row["outlier_excess"] < 0.5  # the slow step's ~0.2 s, not the compiling step's 1 s
