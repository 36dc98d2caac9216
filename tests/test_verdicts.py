"""The verdict suite: every alert this machine can provoke fires on its injected fault, through a real
Prometheus (2 s scrapes and evaluations of the generated rules) and through the offline twin on the same
runs' recordings, and nothing else fires at warning or above; healthy jobs run beside a busy neighbour
process and raise nothing at warning or above.

All jobs run at once (one to four processes each, for about a minute), with the production rules except
shorter windows (:data:`VERDICT_CONFIG`). The delay from each job's start to its alert is printed (run with
-s to see it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otelprof.analysis import checks
from otelprof.mixin import MixinConfig
from otelprof.mixin.alerts import alerts
from otelprof.mixin.config import with_overrides
from otelprof.mixin.generate import render_alerts
from otelprof.recording.reader import read_recording
from tests.servers import Prometheus, free_port, prometheus, require_binary

ROOT = Path(__file__).resolve().parent.parent
JOB_SCRIPT = Path(__file__).resolve().parent / "verdict_job.py"
MIB = 2**20

# The production rules with windows short enough for jobs of about a minute. Thresholds are the defaults,
# except the least RSS growth: 16 MiB per 10-s window instead of 64 MiB per 5 min. Starting a dozen Python
# processes at once on a small machine takes a while: initialization counts as slow after 60 s.
VERDICT_CONFIG = with_overrides(MixinConfig(), [
    "patience=20s",
    "input_bound_window=10s", "input_bound_for=0s",
    "straggler_window=30s", "straggler_for=10s",
    "step_outlier_window=40s",
    "max_initialization_time=60s",
    "stalled_training_threshold=10s",
    "loss_window=10s",
    "host_memory_increase_window=10s", "host_memory_increase_for=0s",
    f"host_memory_increase_min_bytes={16 * MIB}",
])
SEVERE = ("warning", "critical")
SCRAPE = "2s"
"""Scrape and evaluation interval: a dozen processes on two CPUs, each serving its metrics every second,
would be a load of their own."""


@dataclass
class Job:
    name: str
    spec: dict[str, Any]
    expected: tuple[tuple[str, int], ...] = ()
    """(alert without prefix, rank) that must fire at warning or above; nothing else may."""
    world: int = 1
    processes: list[subprocess.Popen[str]] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    outputs: list[tuple[str, str]] = field(default_factory=list)
    spawned: float = 0.0

    def events(self, name: str) -> list[dict[str, Any]]:
        return [json.loads(line) for out, _ in self.outputs for line in out.splitlines()
                if line.startswith("{") and json.loads(line)["event"] == name]


def jobs() -> list[Job]:
    """Steps of 250 ms (as many real ones take); the loops all last as long, so that no job steps while the
    others shut down (a dozen processes flushing at once on two CPUs stall their neighbours for seconds)."""
    d = 50.0
    step = {"duration": d, "compute": 0.25}
    return [
        Job("slow-loader", {**step, "fault": "slow_loader"}, (("InputBound", 0),)),
        Job("straggler-2", {**step, "fault": "straggler", "straggler": 1, "slowdown": 1.5},
            (("RankStraggler", 1),), world=2),
        Job("straggler-4", {**step, "fault": "straggler", "straggler": 2, "slowdown": 1.5},
            (("RankStraggler", 2),), world=4),
        Job("leak", {**step, "fault": "leak", "at": 25.0, "leak_per_step": 4 * MIB}, (("HostMemoryIncrease", 0),)),
        Job("slow-init", {**step, "duration": 5.0, "fault": "slow_init", "init_delay": 70.0},
            (("SlowInitialization", 0),)),
        Job("nan", {**step, "fault": "nan", "at": 5.0}, (("NonFiniteValues", 0),)),
        Job("stall", {**step, "fault": "stall", "at": 10.0}, (("TrainingStalled", 0),)),
        Job("plateau", {**step, "fault": "plateau"}, (("LossNotDecreasing", 0),)),
        # short steps, so that a spike every 25th (rare enough for mean + 3 sigma) gives 11 in the window
        Job("outliers", {"duration": d, "fault": "outliers", "compute": 0.04, "at": 5.0, "spike": 6, "every": 25},
            (("StepOutliers", 0),)),
        Job("healthy", step),
        Job("healthy-ddp", step, world=2),
    ]


NEIGHBOUR = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


@contextmanager
def busy_neighbour(seconds: float) -> Iterator[None]:
    """A process that keeps one CPU busy: the noise healthy jobs must not alert on."""
    process = subprocess.Popen([sys.executable, "-c", NEIGHBOUR.format(seconds=seconds)])
    try:
        yield
    finally:
        process.kill()
        process.wait()


def start(job: Job, record_dir: Path) -> None:
    master = free_port()
    job.spawned = time.time()
    for rank in range(job.world):
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OTELPROF_JOB_NAME": job.name, "OTELPROF_RUN_ID": job.name,
               "OTELPROF_RECORD_DIR": str(record_dir), "OTEL_METRICS_EXPORTER": "prometheus",
               "OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_PROMETHEUS_PORT": str(port - rank),
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(job.world), "MASTER_PORT": str(master),
               "OTELPROF_SAMPLE_INTERVAL_MS": "1000", "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        job.ports.append(port)
        job.processes.append(subprocess.Popen([sys.executable, str(JOB_SCRIPT), json.dumps(job.spec)], env=env,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))


def live_verdicts(prom: Prometheus, job: Job) -> tuple[set[tuple[str, str, int]], dict[str, float]]:
    """Alerts that fired while the job ran (asked at its end: a finished job's targets go down after it), and
    when each first fired."""
    end = max(e["t"] for e in job.events("done"))
    span = f"{int(end - job.spawned) + 2}s"
    selector = f'ALERTS{{alertstate="firing", job_name="{job.name}"}}'
    fired = {(job.name, a["metric"]["alertname"], int(a["metric"].get("rank", "-1")))
             for a in prom.query(f"max_over_time({selector}[{span}])", at=end)}
    first = {a["metric"]["alertname"]: float(a["value"][1]) - job.spawned
             for a in prom.query(f"min by (alertname) (min_over_time(timestamp({selector})[{span}:{SCRAPE}]))",
                                 at=end)}
    return fired, first


def offline_verdicts(job: Job, record_dir: Path) -> set[tuple[str, str, int]]:
    out = set()
    for result in checks.evaluate(read_recording(record_dir / job.name), VERDICT_CONFIG, interval=1.0):
        for subject in result.subjects:
            words = subject.split()
            out.add((job.name, result.alert, int(words[1]) if words[0] == "rank" else -1))
    return out


def severe(verdicts: set[tuple[str, str, int]]) -> set[tuple[str, str, int]]:
    severity = {a.name: a.severity for a in alerts(VERDICT_CONFIG)}
    return {v for v in verdicts if severity.get(v[1]) in SEVERE}


def test_every_fault_fires_its_alert_and_healthy_jobs_stay_quiet(tmp_path: Path) -> None:
    require_binary("prometheus")
    began = time.time()
    suite = jobs()
    rules = tmp_path / "alerts.yaml"
    rules.write_text(render_alerts(VERDICT_CONFIG))
    record_dir = tmp_path / "runs"
    with busy_neighbour(120.0):
        for job in suite:
            start(job, record_dir)
        targets = [f"127.0.0.1:{port}" for job in suite for port in job.ports]
        with prometheus(tmp_path, targets, scrape_interval=SCRAPE, rule_files=[rules]) as prom:
            try:
                for job in suite:
                    job.outputs = [p.communicate(timeout=180) for p in job.processes]
            finally:
                for job in suite:
                    for process in job.processes:
                        if process.poll() is None:
                            process.kill()
            for job in suite:
                for process, (out, err) in zip(job.processes, job.outputs):
                    assert process.returncode == 0 and job.events("done"), f"{job.name}: {out[-1000:]}{err[-3000:]}"
            live = {job.name: live_verdicts(prom, job) for job in suite}

    problems = []
    latencies = []
    for job in suite:
        expected = {(job.name, "Otelprof" + short, rank) for short, rank in job.expected}
        fired, first = live[job.name]
        if severe(fired) != expected:
            problems.append(f"live {job.name}: missing {sorted(expected - fired)}, unexpected "
                            f"{sorted(severe(fired) - expected)}")
        offline = severe(offline_verdicts(job, record_dir))
        if offline != expected:
            problems.append(f"offline {job.name}: missing {sorted(expected - offline)}, unexpected "
                            f"{sorted(offline - expected)}")
        latencies += [f"{name} {first[name]:.0f} s" for name in sorted({e[1] for e in expected}) if name in first]
    assert not problems, "\n".join(problems)
    print(f"\nverdict suite: {len(suite)} jobs in {time.time() - began:.0f} s; from a job's start to its alert: "
          + "; ".join(latencies))


def test_the_suite_covers_every_alert_this_machine_can_provoke() -> None:
    """Each injected fault names an alert with an offline twin; and no two jobs test the same alert twice
    except the straggler at two world sizes."""
    provoked = [short for job in jobs() for short, _ in job.expected]
    assert set(provoked) == {"InputBound", "RankStraggler", "HostMemoryIncrease", "SlowInitialization",
                             "NonFiniteValues", "TrainingStalled", "LossNotDecreasing", "StepOutliers"}
    assert sorted(provoked).count("RankStraggler") == 2 and len(provoked) == len(set(provoked)) + 1
    assert set(provoked) <= set(checks.OFFLINE_CHECKS)
    assert not [job for job in jobs() if job.name.startswith("healthy") and job.expected]
