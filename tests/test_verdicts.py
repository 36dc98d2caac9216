"""The verdict suite: one injected fault per alert this machine can produce, each firing its alert through a
real Prometheus scraping real instrumented training processes *and* through the offline twin (``otelprof
check`` on the same run's recording); healthy controls beside a busy neighbour raise nothing at warning or
critical, live or offline.

Every job (tests/verdict_jobs.py) runs at the same time against one Prometheus (1 s scrape and rule
evaluation) that loads the generated alert rules with shortened windows and ``for`` durations (:data:`CONFIG`;
the thresholds, ratios and in-process outlier settings are the production ones), while a CPU hog keeps a core
busy. The test waits until every expected alert has fired and the healthy runs have been judged for a while,
then asserts per job: which alerts fired at warning or critical, with which ``job_name`` and ``rank`` -- the
faulty rank and only it, the named alert and no other -- and that ``otelprof check --json`` with the same
config gives the same verdicts (``fired`` / ``ok`` / ``no data``). Run with ``-s`` for the time each alert took.

Not produced here (no device, and nothing a CPU machine can fake without a fake): the GPU alerts
(GPUUnderutilized, GPUUtilizationFluctuating, BatchSizeTooSmall, GPUMemoryIncrease, GPUMemoryNearCapacity,
GPULoadImbalance, GPUTelemetryAbsent) and CPUBottleneck / IOBottleneck, which count samples where a CPU is busy
*while a GPU idles*; HostMemoryNearLimit needs a container memory limit (or a host 90 % full); TelemetryDropped
(info) needs a full queue or disk. promtool cases and the offline twin's tests cover them on recorded series.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otelprof.analysis.checks import OFFLINE_CHECKS
from otelprof.mixin import MixinConfig
from otelprof.mixin.config import ALERT_PREFIX, with_overrides
from otelprof.mixin.generate import render_alerts
from tests.servers import Prometheus, free_port, prometheus, require_binary

ROOT = Path(__file__).resolve().parent.parent

SETTINGS = [
    "patience=10s", "window=20s",
    "straggler_window=20s", "straggler_for=10s",
    "step_outlier_window=30s",
    "max_initialization_time=40s",
    "input_bound_window=10s", "input_bound_for=5s",
    "dataloader_for=5s",
    "loss_window=15s",
    "nonfinite_window=30s",
    "vanishing_gradient_window=10s",
    "stalled_training_threshold=15s",
    "overfit_window=15s", "overfit_for=5s",
    "host_memory_increase_window=15s", "host_memory_increase_for=10s", "host_memory_limit_window=15s",
    "absent_for=5s", "sampler_window=10s", "dropped_window=30s",
]
"""Short windows and ``for`` durations; thresholds, ratios, counts and shares stay the production ones."""
CONFIG = with_overrides(MixinConfig(), SETTINGS)

MIN_RUN = 75.0
"""Seconds every job runs at least: the healthy ones are judged over full windows, the loss check twice over."""
DEADLINE = 240.0
"""Seconds for every expected alert to fire."""
LOUD = ("warning", "critical")
GPU_CHECKS = ("CPUBottleneck", "IOBottleneck", "GPUUnderutilized", "GPUUtilizationFluctuating", "BatchSizeTooSmall",
              "GPUMemoryIncrease", "GPUMemoryNearCapacity", "GPULoadImbalance")
"""Offline checks that judge GPU samples: on this machine they have nothing to judge."""


@dataclass(frozen=True, eq=False)
class Job:
    name: str
    kind: str
    """The loop of tests/verdict_jobs.py."""
    ranks: int = 1
    options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    live: frozenset[tuple[str, str]] = frozenset()
    """(alert, rank label or "" for node-level alerts) expected at warning or critical."""
    info: frozenset[str] = frozenset()
    """Info alerts expected too."""
    offline: frozenset[tuple[str, str]] = frozenset()
    """(check, subject) expected to fire in ``otelprof check``."""

    @property
    def healthy(self) -> bool:
        return not self.live and not self.info


def _job(name: str, kind: str, alert: str = "", rank: str = "0", subject: str = "rank 0", **kw: Any) -> Job:
    live = frozenset({(alert, rank)}) if alert else frozenset()
    offline = frozenset({(alert, subject)}) if alert in OFFLINE_CHECKS else frozenset()
    return Job(name, kind, live=kw.pop("live", live), offline=kw.pop("offline", offline), **kw)


JOBS = (
    # healthy controls: a loop of the explicit API with evaluation passes, and a 2-rank DDP job
    _job("healthy-api", "steady"),
    _job("healthy-ddp", "ddp", ranks=2),
    # one fault each
    _job("slow-loader", "slow_loader", "InputBound", subject="rank 0 train",
         info=frozenset({"TooFewDataLoaderWorkers"})),
    _job("straggler-2", "ddp", "RankStraggler", rank="1", subject="rank 1 train", ranks=2,
         options={"slow_rank": 1, "factor": 1.3}),
    _job("straggler-4", "ddp", "RankStraggler", rank="2", subject="rank 2 train", ranks=4,
         options={"slow_rank": 2, "factor": 1.5}),
    _job("leak", "leak", "HostMemoryIncrease"),
    _job("slow-init", "slow_init", "SlowInitialization", options={"init_seconds": 55}),
    _job("nan", "nan", "NonFiniteValues",  # the evaluation passes after it see NaN too
         offline=frozenset({("NonFiniteValues", "rank 0 train loss"), ("NonFiniteValues", "rank 0 eval loss")})),
    _job("stall", "stall", "TrainingStalled"),
    _job("plateau", "plateau", "LossNotDecreasing"),
    _job("outliers", "outliers", "StepOutliers", subject="rank 0 train"),
    _job("overfit", "overfit", "Overfitting"),
    _job("vanishing", "vanishing", "VanishingGradients"),
    _job("rank-dies", "dies", ranks=2, options={"rank": 1},
         live=frozenset({("TelemetryAbsent", "1"), ("TargetDown", "1")})),
    _job("no-sampler", "steady", "SystemTelemetryAbsent", rank="", env={"OTELPROF_SYSTEM_METRICS": "false"}),
    _job("many-workers", "workers", info=frozenset({"TooManyDataLoaderWorkers"})),
)


@dataclass
class Process:
    job: Job
    rank: int
    popen: subprocess.Popen[bytes]
    out: Path
    """Its standard output (the loop's events) and error."""

    def events(self) -> dict[str, float]:
        found: dict[str, float] = {}
        for line in self.out.read_text().splitlines():
            if line.startswith('{"event"'):
                event = json.loads(line)
                found.setdefault(event["event"], event["t"])
        return found

    def log(self) -> str:
        return self.out.read_text()


def _env(job: Job, rank: int, port: int, master_port: int, records: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    env.update({
        "PYTHONPATH": str(ROOT), "OTELPROF_JOB_NAME": job.name, "OTELPROF_RUN_ID": job.name,
        "OTELPROF_RECORD_DIR": str(records), "OTEL_METRICS_EXPORTER": "prometheus", "OTEL_TRACES_EXPORTER": "none",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        # each process serves /metrics on base + LOCAL_RANK, as ranks sharing a pod do
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(port - rank),
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(job.ranks),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
    })
    env.update(job.env)
    return env


@contextmanager
def _cpu_hog() -> Iterator[None]:
    """A busy neighbour: one process spinning on a core for the whole run."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


@contextmanager
def _jobs(tmp: Path, ports: dict[tuple[str, int], int], stop: Path) -> Iterator[list[Process]]:
    """Every job's processes, each in a session of its own; on exit they are asked to stop (the stop file),
    and whatever is left after a minute is killed with its data-loader workers."""
    processes: list[Process] = []
    try:
        for job in JOBS:
            master = free_port()
            for rank in range(job.ranks):
                out = tmp / f"{job.name}-{rank}.log"
                with open(out, "wb") as sink:
                    popen = subprocess.Popen(
                        [sys.executable, "-m", "tests.verdict_jobs", job.kind, str(stop), json.dumps(job.options)],
                        env=_env(job, rank, ports[(job.name, rank)], master, tmp / "runs"), cwd=tmp,
                        stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
                processes.append(Process(job, rank, popen, out))
        yield processes
    finally:
        stop.touch()
        deadline = time.monotonic() + 60
        for p in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(max(deadline - time.monotonic(), 0.1))
        for p in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGKILL)  # its session: the loop and its workers
            p.popen.wait()


def _fired(prom: Prometheus, since: float) -> list[dict[str, str]]:
    """Labels of every alert that was firing at some evaluation since ``since``."""
    window = max(int(time.time() - since) + 2, 5)
    return [r["metric"] for r in prom.query(f'max_over_time(ALERTS{{alertstate="firing"}}[{window}s])')]


def _first_firing(prom: Prometheus, since: float) -> dict[tuple[str, str, str], float]:
    """(alert, job_name, rank) -> the first evaluation at which it was firing."""
    params = {"query": 'ALERTS{alertstate="firing"}', "start": str(since), "end": str(time.time()), "step": "1"}
    url = f"{prom.url}/api/v1/query_range?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.load(response)
    first = {}
    for series in body["data"]["result"]:
        m = series["metric"]
        first[(m["alertname"], m.get("job_name", ""), m.get("rank", ""))] = float(series["values"][0][0])
    return first


def _short(alertname: str) -> str:
    return alertname.removeprefix(ALERT_PREFIX)


def _check(run: Path) -> tuple[int, list[dict[str, Any]], str]:
    sets = [arg for setting in SETTINGS for arg in ("--set", setting)]
    result = subprocess.run([sys.executable, "-m", "otelprof", "check", str(run), "--json", "--interval", "1", *sets],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    rows = json.loads(result.stdout) if result.stdout.strip() else []
    return result.returncode, rows, result.stderr


def test_every_fault_fires_its_alert_live_and_offline_and_healthy_runs_stay_quiet(tmp_path: Path) -> None:
    require_binary("prometheus")
    began = time.time()
    records = tmp_path / "runs"
    rules = tmp_path / "alerts.yaml"
    rules.write_text(render_alerts(CONFIG))
    ports = {(job.name, rank): free_port() for job in JOBS for rank in range(job.ranks)}
    targets = [f"127.0.0.1:{port}" for port in ports.values()]
    with prometheus(tmp_path, targets, "1s", [rules]) as prom, _cpu_hog(), \
            _jobs(tmp_path, ports, tmp_path / "stop") as processes:
        launched = time.time()
        expected = {(ALERT_PREFIX + a, job.name, r) for job in JOBS for a, r in job.live} | \
                   {(ALERT_PREFIX + a, job.name, "") for job in JOBS for a in job.info}
        while True:
            fired = _fired(prom, launched)
            missing = expected - {(m["alertname"], m.get("job_name", ""), m.get("rank", "")) for m in fired}
            elapsed = time.time() - launched
            if (not missing and elapsed >= MIN_RUN) or elapsed >= DEADLINE:
                break
            time.sleep(2)
        first = _first_firing(prom, launched)
    live_run = time.time() - began

    # ---- live: the named alert on the faulty rank, and no other alert at warning or critical
    problems = [f"not fired within {DEADLINE:.0f} s: {sorted(missing)}"] if missing else []
    by_job: dict[str, set[tuple[str, str, str]]] = {job.name: set() for job in JOBS}
    for labels in fired:
        assert labels.get("job_name") in by_job, f"an alert outside the suite's jobs: {labels}"
        by_job[labels["job_name"]].add((_short(labels["alertname"]), labels.get("rank", ""), labels["severity"]))
    for job in JOBS:
        loud = {(a, r) for a, r, severity in by_job[job.name] if severity in LOUD}
        info = {a for a, _, severity in by_job[job.name] if severity == "info"}
        if loud != set(job.live):
            problems.append(f"{job.name}: live {sorted(loud)}, expected {sorted(job.live)}")
        if not job.info <= info:
            problems.append(f"{job.name}: info alerts {sorted(info)}, expected {sorted(job.info)} among them")

    # ---- every process ran as asked (the dead rank was killed as planned)
    for p in processes:
        died = p.job.kind == "dies" and p.rank == p.job.options["rank"]
        log = p.log()
        assert p.popen.returncode == (-9 if died else 0), f"{p.job.name} rank {p.rank}:\n{log[-3000:]}"
        if "Traceback" in log:
            problems.append(f"{p.job.name} rank {p.rank} printed a traceback:\n{log[-3000:]}")

    # ---- offline: otelprof check on each run's recording gives the same verdicts
    with ThreadPoolExecutor(2) as pool:
        checks = list(pool.map(lambda job: _check(records / job.name), JOBS))
    timings, summary = [], []
    for job, (code, rows, stderr) in zip(JOBS, checks):
        if not rows:
            problems.append(f"{job.name}: otelprof check printed nothing: {stderr}")
            continue
        statuses = {_short(r["alert"]): r["status"] for r in rows}
        fired_offline = {(_short(r["alert"]), s) for r in rows if r["fired"] and r["severity"] in LOUD
                         for s in r["subjects"]}
        summary.append(f"  {job.name:<13} live {sorted(by_job[job.name])}  offline {sorted(fired_offline)}")
        if fired_offline != set(job.offline):
            problems.append(f"{job.name}: offline {sorted(fired_offline)}, expected {sorted(job.offline)}")
        if code != (1 if any(r["fired"] for r in rows) else 0):
            problems.append(f"{job.name}: otelprof check exited {code}: {stderr}")
        if any(statuses[c] != "no data" for c in GPU_CHECKS):
            problems.append(f"{job.name}: GPU checks judged something on a machine without GPUs: {statuses}")
        judged = ("StepOutliers", "InputBound", "LossNotDecreasing", "TrainingStalled", "HostMemoryIncrease")
        if job.healthy and any(statuses[c] != "ok" for c in judged):  # judged, and quiet
            problems.append(f"{job.name}: healthy, but {[(c, statuses[c]) for c in judged]}")
        onset = min(p.events().get("onset", launched) for p in processes if p.job is job)
        for alert, rank in sorted(job.live):
            live_at = first.get((ALERT_PREFIX + alert, job.name, rank))
            offline_at = next((r["first_fired"] for r in rows if _short(r["alert"]) == alert and r["fired"]), None)
            timings.append(f"  {job.name:<13} {alert:<22} rank {rank or '-':<2} live "
                           f"{'-' if live_at is None else f'{live_at - onset:5.1f} s'}  offline "
                           f"{'-' if offline_at is None else f'{offline_at - onset:5.1f} s'} after the onset")
    print(f"\nverdict suite: {len(JOBS)} jobs, {len(processes)} processes, live part {live_run:.0f} s, "
          f"total {time.time() - began:.0f} s\n" + "\n".join(summary) + "\ntime to fire:\n" + "\n".join(timings))
    assert not problems, "\n".join(problems)
