"""The verdict suite: one injected fault per alert this machine can provoke, each firing its alert through a
real Prometheus scraping real instrumented training processes *and* through the offline twin (``otelprof
check --json`` on the same run's recording); healthy jobs beside a busy neighbour raise nothing at warning or
critical, live or offline.

Every job (tests/verdict_job.py: explicit-API loops, and PyTorch where the fault is about its hooks: a slow
``DataLoader``, DDP stragglers) runs at the same time against one Prometheus (2 s scrapes and evaluations)
that loads the generated alert rules with shortened windows and ``for`` durations (:data:`VERDICT_CONFIG`;
thresholds, ratios, counts and the in-process outlier settings are the production ones), while a CPU hog
keeps a core busy. The test waits until every expected alert has fired and the healthy jobs have been
judged for a while, then asserts per job which alerts fired at warning or critical, with which ``job_name``
and ``rank`` -- the faulty rank and only it, the named alert and no other -- and that ``otelprof check``
gives the same verdicts (``fired``, ``ok``, ``no data``). Run with ``-s`` for the time each alert took.

The per-layer tensor alerts are provoked by their own suite (``tests/test_tensors_live.py``). RecordingRulesMissing
by its own test here (a Prometheus loading the alerts without the recording rules). What a CPU
machine cannot provoke is listed in :data:`NOT_PROVOKED`, with the reason; promtool cases and
the offline twin's tests cover those on recorded series.
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

import pytest

from otelprof.analysis.checks import OFFLINE_CHECKS
from otelprof.mixin import MixinConfig
from otelprof.mixin.alerts import alerts
from otelprof.mixin.config import ALERT_PREFIX, with_overrides
from otelprof.mixin.generate import render_alerts, render_rules
from otelprof.mixin.rule_groups import EVALUATED, GROUP_LABEL, rule_groups
from otelprof.mixin.rules import recording_names
from tests.servers import Prometheus, free_port, prometheus, require_binary
from tests.test_tensors_live import JOBS as TENSOR_JOBS

pytestmark = pytest.mark.serial  # alone, after the parallel part of make test: its timings are live

ROOT = Path(__file__).resolve().parent.parent
JOB_SCRIPT = Path(__file__).resolve().parent / "verdict_job.py"

SETTINGS = [
    "patience=10s",
    "straggler_window=20s", "straggler_for=10s",
    "step_outlier_window=40s",
    "max_initialization_time=120s",
    "input_bound_window=10s", "input_bound_for=5s",
    "dataloader_for=5s",
    "loss_window=15s", "loss_for=10s", "loss_spike_window=30s",
    "nonfinite_window=30s",
    "vanishing_gradient_window=10s",
    "stalled_training_threshold=15s",
    "overfit_window=15s", "overfit_for=5s",
    "host_memory_increase_window=15s", "host_memory_increase_for=10s", "host_memory_limit_window=15s",
    "absent_for=5s", "sampler_window=10s", "dropped_window=30s",
    "recording_interval=",  # the recording groups every 2 s too: their windows are as short as the alerts'
]
"""Windows and ``for`` durations short enough for jobs of a minute or two. Starting two dozen processes at
once on a small machine takes a while (a 3-rank DDP job took over 60 s to its first step on a loaded CI
machine): initialization counts as slow after 120 s."""
VERDICT_CONFIG = with_overrides(MixinConfig(), SETTINGS)
SCRAPE = "2s"
"""Scrape and evaluation interval: two dozen processes on two CPUs, each rendering its metrics every second,
would be a load of their own."""

MIN_RUN = 90.0
"""Seconds every job runs at least: the healthy ones are judged over full windows, the loss check twice over, and
the 3-rank DDP jobs (the last to take their first step on a loaded machine) past the memory check's warm-up."""
JUDGED_AFTER_START = 60.0
"""Seconds every process runs after its otelprof is up: the memory check judges only past its warm-up (patience
and two windows after the first step), which a rank that started late on a loaded machine reaches late."""
DEADLINE = 240.0
"""Seconds for every expected alert to fire."""
LOUD = ("warning", "critical")
GPU_CHECKS = ("CPUBottleneck", "IOBottleneck", "GPUUnderutilized", "GPUUtilizationFluctuating", "BatchSizeTooSmall",
              "GPUMemoryIncrease", "GPUMemoryNearCapacity", "GPULoadImbalance")
"""Offline checks that judge GPU samples: here they have nothing to judge."""

NOT_PROVOKED = {
    **{name: "reads GPU series (NVML): no GPU here" for name in (
        "GPUUnderutilized", "GPUUtilizationFluctuating", "BatchSizeTooSmall", "GPUMemoryIncrease",
        "GPUMemoryNearCapacity", "GPULoadImbalance", "GPUTelemetryAbsent")},
    "CPUBottleneck": "counts samples with a CPU above 90 % busy *while a GPU is below 10 %*: no GPU here",
    "IOBottleneck": "counts samples with a CPU above 50 % in iowait *while a GPU is below 10 %*: no GPU here",
    "HostMemoryNearLimit": "needs a container memory limit to fill (a cgroup of our own needs root), or a host "
                           "90 % full, which would starve the machine",
}
"""Alerts this suite cannot provoke on a CPU machine, and why."""


@dataclass(frozen=True, eq=False)
class Job:
    name: str
    kind: str
    """The loop of tests/verdict_job.py."""
    ranks: int = 1
    options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    live: frozenset[tuple[str, str]] = frozenset()
    """(alert, rank label or "" for node-level alerts) expected at warning or critical."""
    info: frozenset[str] = frozenset()
    """Info alerts expected too."""
    offline: frozenset[tuple[str, str]] = frozenset()
    """(check, subject) expected to fire in ``otelprof check``."""
    judged: tuple[str, ...] = ()
    """Checks that must have judged the run and stayed quiet (``ok``)."""
    empty: tuple[str, ...] = ()
    """Checks that had nothing to judge (``no data``)."""

    @property
    def healthy(self) -> bool:
        return not self.live and not self.info


def _job(name: str, kind: str, alert: str = "", rank: str = "0", subject: str = "rank 0", **kw: Any) -> Job:
    live = frozenset({(alert, rank)}) if alert else frozenset()
    offline = frozenset({(alert, subject)}) if alert in OFFLINE_CHECKS else frozenset()
    return Job(name, kind, live=kw.pop("live", live), offline=kw.pop("offline", offline), **kw)


STEP_CHECKS = ("StepOutliers", "InputBound", "TrainingStalled", "SlowInitialization", "NonFiniteValues",
               "LossNotDecreasing", "HostMemoryIncrease", "HostMemoryNearLimit")
API_CHECKS = (*STEP_CHECKS, "LossSpike", "Overfitting", "VanishingGradients")
"""What a healthy explicit-API loop (losses in train and eval steps, gradient norms) must have judged quietly."""
JOBS = (
    # healthy: an explicit-API loop with evaluation passes and gradient norms, and a 2-rank DDP job
    _job("healthy", "steady", judged=API_CHECKS, empty=("RankStraggler",)),
    _job("healthy-ddp", "ddp", ranks=2, judged=(*STEP_CHECKS, "RankStraggler", "LossSpike"),
         empty=("Overfitting", "VanishingGradients")),
    # healthy but unusual (issue #24): nothing at warning or above, live or offline
    _job("checkpoints", "checkpoint", judged=API_CHECKS, empty=("RankStraggler",)),  # 3 s inside every 40th step
    _job("long-eval", "long_eval", judged=API_CHECKS, empty=("RankStraggler",)),  # 40 eval steps every 40 steps
    _job("warmup-steps", "warmup", judged=API_CHECKS, empty=("RankStraggler",)),  # the first 20 steps 3x as long
    _job("lr-warmup", "lr_warmup", judged=API_CHECKS, empty=("RankStraggler",),  # 15 % loss noise, 0.1-s steps
         options={"step": 0.1}),
    _job("variable-length", "varlen", judged=API_CHECKS, empty=("RankStraggler",)),  # 16-64 tokens, some 256
    _job("healthy-ddp-3", "ddp", ranks=3, judged=(*STEP_CHECKS, "RankStraggler", "LossSpike"),
         empty=("Overfitting", "VanishingGradients")),
    # one fault each
    _job("slow-loader", "slow_loader", "InputBound", subject="rank 0 train",
         info=frozenset({"TooFewDataLoaderWorkers"})),
    _job("straggler-2", "ddp", "RankStraggler", rank="1", subject="rank 1 train", ranks=2,
         options={"slow_rank": 1, "factor": 1.3}),
    _job("straggler-4", "ddp", "RankStraggler", rank="2", subject="rank 2 train", ranks=4,
         options={"slow_rank": 2, "factor": 1.3}),
    _job("straggler-3", "ddp", "RankStraggler", rank="1", subject="rank 1 train", ranks=3,  # subtle: 25 % slower
         options={"slow_rank": 1, "factor": 1.25}),
    _job("loss-spike", "spike", "LossSpike", subject="rank 0 train", options={"onset": 20.0}),
    _job("leak", "leak", "HostMemoryIncrease"),
    _job("slow-init", "slow_init", "SlowInitialization", options={"init_seconds": 130}),
    _job("nan", "nan", "NonFiniteValues",  # the evaluation passes after it see NaN too
         offline=frozenset({("NonFiniteValues", "rank 0 train loss"), ("NonFiniteValues", "rank 0 eval loss")})),
    _job("stall", "stall", "TrainingStalled"),
    _job("plateau", "plateau", "LossNotDecreasing", subject="rank 0 train"),
    _job("outliers", "outliers", "StepOutliers", subject="rank 0 train", options={"step": 0.05}),
    _job("overfit", "overfit", "Overfitting"),
    _job("vanishing", "vanishing", "VanishingGradients", subject="rank 0 train"),
    _job("rank-dies", "dies", ranks=2, options={"rank": 1},
         live=frozenset({("TelemetryAbsent", "1"), ("TargetDown", "1")})),
    _job("no-sampler", "steady", "SystemTelemetryAbsent", rank="", env={"OTELPROF_SYSTEM_METRICS": "false"}),
    _job("many-workers", "workers", info=frozenset({"TooManyDataLoaderWorkers"})),
    _job("collector-down", "steady", info=frozenset({"TelemetryDropped"}),
         env={"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TIMEOUT": "1000"}),
)


RULES_MISSING = "RecordingRulesMissing"
RULES_MISSING_JOBS = (Job("rules-steady", "steady"), Job("rules-stalled", "stall", options={"onset": 5.0}))
"""Scraped at once by a Prometheus that loads only the alerts file, where RecordingRulesMissing fires for each job
and recording group, and by one that loads both files, where it stays quiet -- also for the job whose steps stop
(the compute-time record leaves it out then)."""


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
        # fewer wake-ups: 1 s samples, and no periodic metric snapshots of two dozen processes at once
        "OTELPROF_SAMPLE_INTERVAL_MS": "1000", "OTEL_METRIC_EXPORT_INTERVAL": "600000",
    })
    env.update(job.env)
    if env["OTEL_TRACES_EXPORTER"] == "otlp":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"  # nothing listens: collector down
    return env


@contextmanager
def _busy_neighbour() -> Iterator[None]:
    """A process that keeps one CPU busy for the whole run: the noise healthy jobs must not alert on."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


@contextmanager
def _jobs(tmp: Path, ports: dict[tuple[str, int], int], stop: Path,
          jobs: tuple[Job, ...] = JOBS) -> Iterator[list[Process]]:
    """Every job's processes, each in a session of its own; on exit they are asked to stop (the stop file),
    and whatever is left after a minute is killed with its data-loader workers."""
    processes: list[Process] = []
    try:
        for job in jobs:
            master = free_port()
            for rank in range(job.ranks):
                out = tmp / f"{job.name}-{rank}.log"
                with open(out, "wb") as sink:
                    popen = subprocess.Popen(
                        [sys.executable, str(JOB_SCRIPT), job.kind, str(stop), json.dumps(job.options)],
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
                os.killpg(p.popen.pid, signal.SIGKILL)  # its session: the loop and its data-loader workers
            p.popen.wait()


def _fired(prom: Prometheus, since: float) -> list[dict[str, str]]:
    """Labels of every alert that was firing at some evaluation since ``since``."""
    window = max(int(time.time() - since) + 2, 5)
    return [r["metric"] for r in prom.query(f'max_over_time(ALERTS{{alertstate="firing"}}[{window}s])')]


def _first_firing(prom: Prometheus, since: float) -> dict[tuple[str, str, str], float]:
    """(alert, job_name, rank) -> the first evaluation at which it was firing."""
    params = {"query": 'ALERTS{alertstate="firing"}', "start": str(since), "end": str(time.time()),
              "step": SCRAPE.removesuffix("s")}
    with urllib.request.urlopen(f"{prom.url}/api/v1/query_range?" + urllib.parse.urlencode(params),
                                timeout=30) as response:
        body = json.load(response)
    return {(m["alertname"], m.get("job_name", ""), m.get("rank", "")): float(series["values"][0][0])
            for series in body["data"]["result"] for m in (series["metric"],)}


def _short(alertname: str) -> str:
    return alertname.removeprefix(ALERT_PREFIX)


def _check(run: Path) -> tuple[int, list[dict[str, Any]], str]:
    """``otelprof check --json`` with the suite's windows, evaluated every second."""
    sets = [arg for setting in SETTINGS for arg in ("--set", setting)]
    result = subprocess.run([sys.executable, "-m", "otelprof", "check", str(run), "--json", "--interval", "1", *sets],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    rows = json.loads(result.stdout)["checks"] if result.stdout.strip() else []
    return result.returncode, rows, result.stderr


def test_every_fault_fires_its_alert_live_and_offline_and_healthy_jobs_stay_quiet(tmp_path: Path) -> None:
    require_binary("prometheus")
    began = time.time()
    records = tmp_path / "runs"
    rules = tmp_path / "alerts.yaml"
    rules.write_text(render_alerts(VERDICT_CONFIG))
    recording = tmp_path / "rules.yaml"  # several alerts read recorded series (the straggler, input-bound, ...)
    recording.write_text(render_rules(VERDICT_CONFIG))
    ports = {(job.name, rank): free_port() for job in JOBS for rank in range(job.ranks)}
    targets = [f"127.0.0.1:{port}" for port in ports.values()]
    expected = {(ALERT_PREFIX + a, job.name, r) for job in JOBS for a, r in job.live} | \
               {(ALERT_PREFIX + a, job.name, "*") for job in JOBS for a in job.info}  # any rank
    with prometheus(tmp_path, targets, SCRAPE, [rules, recording]) as prom, _busy_neighbour(), \
            _jobs(tmp_path, ports, tmp_path / "stop") as processes:
        launched = time.time()
        while True:  # the verdicts are taken while every job still runs (a job that ends is a target down)
            fired = _fired(prom, launched)
            seen = {(m["alertname"], m.get("job_name", ""), m.get("rank", "")) for m in fired}
            missing = expected - seen - {(a, j, "*") for a, j, _ in seen}
            elapsed = time.time() - launched
            starts = [p.events().get("start") for p in processes]
            judged = all(t is not None and time.time() - t >= JUDGED_AFTER_START for t in starts)
            if (not missing and elapsed >= MIN_RUN and judged) or elapsed >= DEADLINE:
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

    # ---- every process ran as asked (the dying rank was killed as planned), quietly
    for p in processes:
        died = p.job.kind == "dies" and p.rank == p.job.options["rank"]
        if p.popen.returncode != (-signal.SIGKILL if died else 0) or "Traceback" in p.log():
            problems.append(f"{p.job.name} rank {p.rank} exited {p.popen.returncode}:\n{p.log()[-3000:]}")

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
        summary.append(f"  {job.name:<14} live {sorted(by_job[job.name])}  offline {sorted(fired_offline)}")
        if fired_offline != set(job.offline):
            problems.append(f"{job.name}: offline {sorted(fired_offline)}, expected {sorted(job.offline)}")
        if code != (1 if any(r["fired"] for r in rows) else 0):
            problems.append(f"{job.name}: otelprof check exited {code}: {stderr}")
        wrong = {c: statuses[c] for c in GPU_CHECKS + job.empty if statuses[c] != "no data"}
        wrong |= {c: statuses[c] for c in job.judged if statuses[c] != "ok"}
        wrong |= {c: statuses[c] for c, _ in job.offline if statuses[c] != "fired"}
        if wrong:
            problems.append(f"{job.name}: statuses {wrong}")
        onsets = [p.events()["onset"] for p in processes if p.job is job and "onset" in p.events()]
        onset, since = (min(onsets), "") if onsets else (launched, " (from the launch)")
        for alert, rank in sorted(job.live | {(a, "*") for a in job.info}):
            live_at = min((t for (a, j, r), t in first.items() if (a, j) == (ALERT_PREFIX + alert, job.name)
                           and rank in (r, "*")), default=None)
            offline_at = next((r["first_fired"] for r in rows if _short(r["alert"]) == alert and r["fired"]), None)
            timings.append(f"  {job.name:<14} {alert:<25} rank {rank or '-':<2} live "
                           f"{'-' if live_at is None else f'{live_at - onset:5.1f} s'}  offline "
                           f"{'-' if offline_at is None else f'{offline_at - onset:5.1f} s'}{since}")
    print(f"\nverdict suite: {len(JOBS)} jobs, {len(processes)} processes, live part {live_run:.0f} s, "
          f"total {time.time() - began:.0f} s\n" + "\n".join(summary) + "\nfrom the onset of each fault to its "
          "alert:\n" + "\n".join(timings))
    assert not problems, "\n".join(problems)


def test_the_suite_provokes_every_alert_a_cpu_machine_can() -> None:
    """Every alert of the mixin is provoked by a job or listed as not provokable here; each job names its
    alert and the offline twin's verdict wherever the twin exists; healthy jobs expect nothing."""
    provoked = {a for job in JOBS for a, _ in job.live} | {a for job in JOBS for a in job.info}
    provoked |= {a for _, fired in TENSOR_JOBS.values() for a, _ in fired}  # the per-layer suite's own jobs
    provoked.add(RULES_MISSING)  # its own test: a Prometheus without the recording rules
    everything = {a.short for a in alerts(MixinConfig())}
    assert provoked | set(NOT_PROVOKED) == everything, sorted(everything - provoked - set(NOT_PROVOKED))
    assert not provoked & set(NOT_PROVOKED)
    for job in JOBS:
        assert {c for c, _ in job.offline} == {a for a, _ in job.live if a in OFFLINE_CHECKS}, job.name
    assert [job.ranks for job in JOBS if ("RankStraggler", str(job.options.get("slow_rank"))) in job.live] == [2, 4, 3]
    assert {job.name for job in JOBS if job.healthy} == {"healthy", "healthy-ddp", "checkpoints", "long-eval",
                                                         "warmup-steps", "lr-warmup", "variable-length",
                                                         "healthy-ddp-3"}


def test_alerts_without_the_recording_rules_fire_recording_rules_missing(tmp_path: Path) -> None:
    require_binary("prometheus")
    config = with_overrides(VERDICT_CONFIG, ["rules_missing_for=10s"])
    alerts_file, rules_file = tmp_path / "alerts.yaml", tmp_path / "rules.yaml"
    alerts_file.write_text(render_alerts(config))
    rules_file.write_text(render_rules(config))
    ports = {(job.name, rank): free_port() for job in RULES_MISSING_JOBS for rank in range(job.ranks)}
    targets = [f"127.0.0.1:{port}" for port in ports.values()]
    name = ALERT_PREFIX + RULES_MISSING
    groups = {g["name"] for g in rule_groups(config)}
    expected = {(job.name, group) for job in RULES_MISSING_JOBS for group in groups}
    for sub in ("alone", "both"):
        (tmp_path / sub).mkdir()
    compute = recording_names(config)["step_compute_mean"]
    with prometheus(tmp_path / "alone", targets, SCRAPE, [alerts_file]) as alone, \
            prometheus(tmp_path / "both", targets, SCRAPE, [alerts_file, rules_file]) as both, \
            _jobs(tmp_path, ports, tmp_path / "stop", RULES_MISSING_JOBS) as processes:
        launched = time.time()
        seen: set[tuple[str, str]] = set()
        complete = None
        while time.time() - launched < 120:
            seen = {(m["job_name"], m["rule_group"]) for m in _fired(alone, launched) if m["alertname"] == name}
            complete = complete or (time.time() if seen >= expected else None)
            if complete and time.time() - complete >= 20:  # the other Prometheus judged for twice the `for` more
                break
            time.sleep(2)
        quiet = [m for m in _fired(both, launched) if m["alertname"] == name]
        now = both.query(f'ALERTS{{alertname="{name}"}}')  # not even pending
        evaluated = {r["metric"][GROUP_LABEL] for r in both.query(EVALUATED)}
        computed = {r["metric"]["job_name"] for r in both.query(compute)}
        took = (complete or time.time()) - launched
    for p in processes:
        assert p.popen.returncode == 0 and "Traceback" not in p.log(), p.log()[-3000:]
    print(f"\nRecordingRulesMissing fired for {len(expected)} (job, group) pairs {took:.0f} s after the launch "
          "(10 s `for`)")
    assert seen == expected, sorted(expected - seen)
    assert not quiet and not now, quiet or now
    assert evaluated == groups
    assert computed == {"rules-steady"}  # the stalled job had no step in the window: quiet all the same
    assert all("onset" in p.events() for p in processes if p.job.kind == "stall")
