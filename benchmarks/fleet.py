"""A synthetic fleet in a real Prometheus: N ranks on M nodes exporting otelprof's own exposition.

Each rank is a :class:`~otelprof.runtime.metrics.MetricRegistry` driven with the catalog's metrics and rendered by
:func:`otelprof.runtime.export.prometheus.render`, so names, labels and types are the ones a real rank serves.
Ranks differ realistically (synchronous data-parallel steps: every rank's step lasts as long as the slowest
rank's compute, the others wait in the all-reduce) and carry four injected faults: a straggler, a leaking
rank, a stalled rank and a NaN loss.

Two ways to judge it:

* ``history`` + ``judge`` (tests/test_fleet.py): the fleet's last ``minutes`` are written as OpenMetrics,
  backfilled into a TSDB with ``promtool tsdb create-blocks-from openmetrics`` and each shipped alert's
  ``expr`` is evaluated by a real Prometheus over its ``for:`` window (an alert fires at T when its
  expression returns the series at every evaluation in [T - for, T]).
* ``main`` (``python benchmarks/fleet.py --ranks 1024``): the same fleet served live on 127.0.0.1, one
  target per rank, scraped by a real Prometheus loaded with deploy/prometheus/*: rule group evaluation
  time, every dashboard query's latency, Prometheus memory and ingestion.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import yaml

from otelprof import semconv as sc
from otelprof.runtime.export.prometheus import render
from otelprof.runtime.metrics import MetricRegistry

ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = (ROOT / "deploy/prometheus/otelprof-rules.yaml", ROOT / "deploy/prometheus/otelprof-alerts.yaml")
JOB = "fleet"
TRAIN = "train"
GPUS_PER_NODE = 8
SAMPLE_INTERVAL = 0.5  # otelprof's default sampler interval
MIB = 1024**2
REGIONS = ("dataloader", "forward", "backward", "optimizer")


@dataclass(frozen=True)
class Faults:
    """The rank of each injected fault (-1: none) and the alert each must fire."""

    straggler: int
    leak: int
    stall: int
    nan: int

    def expected(self) -> set[tuple[str, str]]:
        return {("OtelprofRankStraggler", str(self.straggler)), ("OtelprofHostMemoryIncrease", str(self.leak)),
                ("OtelprofTrainingStalled", str(self.stall)), ("OtelprofNonFiniteValues", str(self.nan))}


def default_faults(ranks: int) -> Faults:
    """Faults on different nodes, never on a node's sampling rank (local rank 0)."""
    return Faults(straggler=ranks // 4 + 3, leak=ranks // 2 + 5, stall=3 * ranks // 4 + 6, nan=ranks - 1)


class RankModel:
    """One rank's registry, advanced through simulated time."""

    def __init__(self, rank: int, nodes: int, ranks: int, faults: Faults, origin: float) -> None:
        per_node = max(ranks // nodes, 1)
        self.rank, self.local_rank, self.node = rank, rank % per_node, f"node-{rank // per_node:04d}"
        self.faults = faults
        self.registry = MetricRegistry({"job_name": JOB, "rank": str(rank), "local_rank": str(self.local_rank),
                                        "node": self.node})
        self.random = random.Random(rank)
        # compute time per step: +-5 % between ranks; the straggler's is 1.6 x
        self.compute = 0.40 * (1 + 0.05 * math.sin(rank * 1.7)) * (1.6 if rank == faults.straggler else 1.0)
        self.origin = origin  # the job started 20 min before the simulated window
        self.clock = origin
        self.carry = 0.0
        self.samples_carry = 0.0
        self.memory = 3.0 * 1024 * MIB + rank % 7 * 64 * MIB
        self.stalled_at = origin + 100 if rank == faults.stall else math.inf
        self.nan_at = math.inf
        r = self.registry
        with r.lock:
            r.gauge(sc.PROCESS_START_TIME).set(origin - 60)
            r.gauge(sc.STEP_FIRST_TIMESTAMP).set(origin)
            r.gauge(sc.DATALOADER_WORKERS).set(10)  # 80 of a node's 96 CPUs
            for spec in (sc.STEP_OUTLIERS, sc.LOSS_SPIKES, sc.STEPS, sc.LOSS_RECORDED, sc.LOSS_SQUARED):
                r.counter(spec).add(0, (TRAIN,))
            r.counter(sc.NONFINITE).add(0, (TRAIN, "loss"))
            if self.local_rank == 0:
                r.gauge(sc.CPU_AVAILABLE).set(96)
                for spec in (sc.SAMPLER_SAMPLES, sc.SAMPLER_HIGH_CPU, sc.SAMPLER_LOW_GPU, sc.SAMPLER_CPU_BOTTLENECK,
                             sc.SAMPLER_IO_BOTTLENECK):
                    r.counter(spec).add(0)

    def gpu(self, index: int) -> tuple[str, str]:
        return (str(index), f"GPU-{self.node}-{index}")

    def advance(self, until: float, job_step: float) -> None:
        """Simulate training from the last call to ``until``; every step lasts ``job_step`` seconds."""
        elapsed = until - self.clock
        if elapsed <= 0:
            return
        r, rnd = self.registry, self.random
        training = min(until, self.stalled_at) - self.clock  # a stalled rank's steps stop, its process lives on
        with r.lock:
            if training > 0:
                self.carry += training / job_step
                steps, self.carry = int(self.carry), self.carry % 1
                step_hist, exposed = r.histogram(sc.STEP_DURATION), r.histogram(sc.COLLECTIVE_EXPOSED)
                regions, wait = r.histogram(sc.ANNOTATION_DURATION), r.histogram(sc.DATALOADER_WAIT_RATIO)
                for i in range(steps):
                    duration = job_step * (1 + rnd.gauss(0, 0.01))
                    step_hist.observe(duration, (TRAIN,))
                    exposed.observe(max(duration - self.compute, 0.0), (TRAIN,))
                    wait.observe(0.01 + rnd.random() * 0.01, (TRAIN,))
                    for region, share in zip(REGIONS, (0.02, 0.3, 0.6, 0.08)):
                        regions.observe(self.compute * share, (TRAIN, region))
                    now = self.clock + (i + 1) / max(steps, 1) * training
                    loss = 0.5 + 2.0 * math.exp(-(now - self.origin) / 3000) + rnd.gauss(0, 0.02)
                    if self.rank == self.faults.nan and now >= self.nan_at:
                        r.counter(sc.NONFINITE).add(1, (TRAIN, "loss"))
                        self.nan_at = math.inf
                        continue
                    r.gauge(sc.LOSS_SUMMED).set(_value(r, sc.LOSS_SUMMED, (TRAIN,)) + loss, (TRAIN,))
                    r.counter(sc.LOSS_RECORDED).add(1, (TRAIN,))
                    r.counter(sc.LOSS_SQUARED).add(loss * loss, (TRAIN,))
                    r.gauge(sc.LOSS).set(loss, (TRAIN,))
                if steps:
                    r.counter(sc.STEPS).add(steps, (TRAIN,))
                    r.counter(sc.SAMPLES).add(steps * 32, (TRAIN,))
                    r.gauge(sc.STEP_LAST_TIMESTAMP).set(self.clock + training, (TRAIN,))
                    r.gauge(sc.STEP_NUMBER).set(_value(r, sc.STEP_NUMBER, (TRAIN,)) + steps, (TRAIN,))
            if self.rank == self.faults.leak:  # 120 MiB a minute from 20 min into the job
                self.memory += 2 * MIB * max(until - max(self.clock, self.origin + 1200), 0.0)
            r.gauge(sc.PROCESS_MEMORY_USAGE).set(self.memory + rnd.gauss(0, 4 * MIB))
            if self.local_rank == 0:
                self._sample_node(elapsed)
        self.clock = until

    def _sample_node(self, elapsed: float) -> None:
        r, rnd = self.registry, self.random
        self.samples_carry += elapsed / SAMPLE_INTERVAL
        samples, self.samples_carry = int(self.samples_carry), self.samples_carry % 1
        r.counter(sc.SAMPLER_SAMPLES).add(samples)
        for spec in (sc.SAMPLER_HIGH_CPU, sc.SAMPLER_LOW_GPU, sc.SAMPLER_CPU_BOTTLENECK, sc.SAMPLER_IO_BOTTLENECK):
            r.counter(spec).add(0)
        node_cpu = r.histogram(sc.NODE_CPU_UTILIZATION)
        for _ in range(samples):
            node_cpu.observe(min(max(rnd.gauss(0.3, 0.05), 0.0), 1.0))
        for index in range(GPUS_PER_NODE):
            labels = self.gpu(index)
            util, memory = r.histogram(sc.GPU_UTILIZATION_DISTRIBUTION), r.histogram(
                sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION)
            value = 0.93
            for _ in range(samples):
                value = min(max(rnd.gauss(0.93, 0.02), 0.0), 1.0)
                util.observe(value, labels)
                memory.observe(0.71, labels)
            r.gauge(sc.GPU_UTILIZATION).set(value, labels)
            r.gauge(sc.GPU_MEMORY_UTILIZATION).set(0.71, labels)

    def exposition(self, openmetrics: bool = False) -> str:
        with self.registry.lock:
            metrics = self.registry.collect()
        return render(metrics, {}, openmetrics=openmetrics)


def _value(registry: MetricRegistry, spec: sc.MetricSpec, labels: tuple[str, ...]) -> float:
    gauge: Any = registry.gauge(spec)
    return float(gauge.values.get(labels, 0.0))


class Fleet:
    """``ranks`` ranks on ``nodes`` nodes with ``faults``; the NaN appears ``nan_after`` s into the window."""

    def __init__(self, ranks: int, nodes: int, origin: float, faults: Faults | None = None) -> None:
        self.faults = faults or default_faults(ranks)
        self.models = [RankModel(rank, nodes, ranks, self.faults, origin) for rank in range(ranks)]
        self.job_step = max(m.compute for m in self.models if m.rank != self.faults.stall) + 0.02
        self.lock = threading.Lock()

    def inject_nan(self, at: float) -> None:
        self.models[self.faults.nan].nan_at = at

    def advance(self, until: float) -> None:
        with self.lock:
            for model in self.models:
                model.advance(until, self.job_step)


# ------------------------------------------------------------------------------------- backfill + judge

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)")


def history(fleet: Fleet, start: float, end: float, interval: float, path: Path) -> int:
    """Write the fleet's scrapes every ``interval`` s in [start, end] as one OpenMetrics file (families kept
    together, as promtool's backfill wants); returns the number of samples."""
    families: dict[str, list[str]] = {}
    count = 0
    t = start
    while t <= end + 1e-9:
        fleet.advance(t)
        stamp = f" {t:.3f}"
        for model in fleet.models:
            family = ""
            for line in model.exposition(openmetrics=True).splitlines():
                if line.startswith("# TYPE "):
                    family = line.split()[2]
                    families.setdefault(family, [line])
                elif line and not line.startswith("#") and family and family != "target_info":
                    families[family].append(line.split(" # ")[0] + stamp)
                    count += 1
        t += interval
    with path.open("w") as out:
        for lines in families.values():
            if len(lines) > 1:
                out.write("\n".join(lines) + "\n")
        out.write("# EOF\n")
    return count


def backfill(openmetrics: Path, data: Path) -> None:
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(data)],
                   check=True, capture_output=True, timeout=600)


def backfill_recording_rules(url: str, start: float, end: float, interval: float, data: Path) -> None:
    """Evaluate the shipped recording rules every ``interval`` s over [start, end] against the Prometheus at ``url``
    and add the results to ``data`` as blocks (``promtool tsdb create-blocks-from rules``), as the recording group
    would have recorded them live: the alerts that read recorded series judge them. Restart the Prometheus on
    ``data`` afterwards to read them. (promtool cannot backfill a rule that reads another recorded series: only the
    dashboards' aggregates do, and no alert reads them.)"""
    blocks = data.parent / "recorded"
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "rules", f"--url={url}", f"--start={int(start)}",
                    f"--end={int(end)}", f"--eval-interval={int(interval)}s", f"--output-dir={blocks}", "--quiet",
                    str(RULE_FILES[0])], check=True, capture_output=True, timeout=600)
    for block in blocks.iterdir():
        block.rename(data / block.name)


def _seconds(duration: str | None) -> float:
    if not duration:
        return 0.0
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", duration))


def alert_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for group in yaml.safe_load(RULE_FILES[1].read_text())["groups"]:
        rules += [rule for rule in group["rules"] if "alert" in rule]
    return rules


def get(url: str, path: str, params: dict[str, str], timeout: float = 60) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=timeout) as response:
            return dict(json.load(response))
    except urllib.error.HTTPError as exc:
        return dict(json.load(exc))
    except OSError as exc:  # no answer within ``timeout``
        return {"status": "error", "error": f"{exc!r} after {timeout} s"}


def judge(url: str, at: float, interval: float) -> set[tuple[str, str]]:
    """(alert, rank or else node) of every shipped alert that fires at ``at``: its expression holds the series at every
    evaluation every ``interval`` s over its ``for:`` window."""
    firing: set[tuple[str, str]] = set()
    for rule in alert_rules():
        hold = _seconds(rule.get("for"))
        body = get(url, "/api/v1/query_range", {"query": rule["expr"], "start": f"{at - hold:.3f}",
                                                "end": f"{at:.3f}", "step": str(interval)})
        if body.get("status") != "success":
            raise RuntimeError(f"{rule['alert']}: {body.get('error')}")
        needed = round(hold / interval) + 1
        for series in body["data"]["result"]:
            if len(series["values"]) >= needed:
                labels = series["metric"]
                firing.add((rule["alert"], labels.get("rank", labels.get("node", ""))))
    return firing


@contextmanager
def run_prometheus(workdir: Path, config: dict[str, Any], port: int, extra: tuple[str, ...] = ()) -> Iterator[
        tuple[str, subprocess.Popen[bytes]]]:
    """A real Prometheus on ``port`` with ``config`` and its TSDB in ``workdir / data``."""
    (workdir / "prometheus.yml").write_text(json.dumps(config))
    log = (workdir / "prometheus.log").open("w")
    process = subprocess.Popen(
        ["prometheus", f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d", *extra],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # a restart on a large head replays its WAL first
        while True:
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("prometheus did not start:\n" + (workdir / "prometheus.log").read_text()[-2000:])
            time.sleep(0.3)
        yield url, process
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


# ------------------------------------------------------------------------------------- live benchmark

def _render_loop(fleet: Fleet, tick: float, out: Connection) -> None:
    """The renderer process: every ``tick`` s, advance each rank to now and send every rank's exposition (bytes),
    with the process's CPU seconds so far; at a lower priority than Prometheus."""
    import os

    with suppress(OSError):
        os.nice(NICE)
    while True:
        started = time.monotonic()
        now = time.time()
        bodies = []
        for model in fleet.models:
            model.advance(now, fleet.job_step)
            bodies.append(model.exposition().encode())
        try:
            out.send((bodies, time.process_time()))
        except OSError:  # the server went away
            return
        time.sleep(max(tick - (time.monotonic() - started), 0.0))


NICE = 10


class Served:
    """Every rank's exposition, rendered once per tick in a process of its own at a lower priority and served as
    bytes by this one.

    Rendering per scrape would cost the generator about as much CPU as Prometheus spends ingesting, on the same
    cores: a benchmark of a starved Prometheus measures nothing. A rendering thread would hold the server's GIL
    whenever the scheduler preempts it (more often, the lower its priority), so scrapes would wait for it.
    Values are at most one tick old when scraped, as with a real exporter's sampling interval.
    """

    def __init__(self, fleet: Fleet, tick: float) -> None:
        import multiprocessing

        context = multiprocessing.get_context("fork")  # the child starts from the fleet as advanced here
        receive, send = context.Pipe(duplex=False)
        self.process = context.Process(target=_render_loop, args=(fleet, tick, send), daemon=True)
        self.process.start()
        send.close()
        self.receive = receive
        self.bodies, self.render_cpu = receive.recv()
        self.rounds = 1
        threading.Thread(target=self._receive, daemon=True).start()

    def _receive(self) -> None:
        while True:
            try:
                self.bodies, self.render_cpu = self.receive.recv()
            except (EOFError, OSError):
                return
            self.rounds += 1

    def cpu(self) -> float:
        """CPU seconds of the renderer process so far."""
        pid = self.process.pid
        return _cpu_seconds(pid) if pid is not None and self.process.is_alive() else self.render_cpu

    def stop(self) -> None:
        self.process.terminate()
        self.process.join(10)


class _Handler(BaseHTTPRequestHandler):
    served: Served

    def do_GET(self) -> None:
        match = re.fullmatch(r"/metrics/(\d+)", self.path)
        bodies = self.served.bodies
        if match is None or int(match.group(1)) >= len(bodies):
            self.send_error(404)
            return
        body = bodies[int(match.group(1))]
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the scrape timed out and Prometheus hung up: counted by its scrape_duration
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dashboard_queries() -> list[tuple[str, str, bool]]:
    """(where, expr, instant) of every PromQL target of the generated dashboards."""
    from otelprof.dashboards.generate import dashboards
    from otelprof.dashboards.model import Prom

    out = []
    for board in dashboards():
        for panel in board.panels():
            for index, target in enumerate(panel.targets):
                if isinstance(target, Prom):
                    out.append((f"{board.uid} #{panel.id} {panel.title!r} [{index}]", target.expr, target.instant))
    return out


def substitute(expr: str, range_s: int, scrape: int) -> str:
    values = {"$__range_s": str(range_s), "$__range": f"{range_s}s", "$__rate_interval": f"{4 * scrape}s",
              "$__interval": f"{scrape}s", "$job_name": JOB, "$cluster": ".*", "$namespace": ".*", "$node": ".*",
              "$rank": ".*", "$gpu": ".*"}
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(name, values[name])
    return expr


def replaced_panels() -> list[tuple[str, str, str]]:
    """(panel, what it computed before the otelprof-aggregation recording rules, what it reads now)."""
    from otelprof.dashboards import queries as pq
    from otelprof.dashboards.ranks import _extremes
    from otelprof.mixin.config import MixinConfig
    from otelprof.mixin.promql import JOB, PHASE, RANK, by
    from otelprof.mixin.recording_rules import PER_JOB

    qs = pq.Queries(MixinConfig())
    proc, train = qs.proc, qs.train
    compute = qs.rule("step_compute_mean", proc, train)
    median = qs.rule("job_step_compute_median", qs.job, train)

    def per_rank(quantile: float, spec: sc.MetricSpec) -> str:
        return pq.rate_quantile(quantile, proc, spec, (RANK,), train)

    return [
        ("Ranks #105 step time p95 per rank", _extremes(per_rank(0.95, sc.STEP_DURATION)),
         _extremes(qs.rule("step_p95_rate", proc, train))),
        ("Ranks #202 data wait p95 per rank", _extremes(per_rank(0.95, sc.DATALOADER_WAIT)),
         _extremes(qs.rule("dataloader_wait_p95_rate", proc, train))),
        ("Ranks #102 compute time vs the job's median",
         _extremes(f"{compute} / on ({JOB}, {PHASE}) group_left() quantile by ({JOB}, {PHASE}) (0.5, {compute})"),
         _extremes(f"{compute} / on ({by(*PER_JOB)}) group_left() {median}")),
        ("Report #603 step time p50 per rank", per_rank(0.5, sc.STEP_DURATION), qs.rule("step_p50_rate", proc, train)),
        ("Report #603, Timeline #201 step time p95 per rank", per_rank(0.95, sc.STEP_DURATION),
         qs.rule("step_p95_rate", proc, train)),
    ]


def compare(url: str, scrape: int, began: float, end: float, repeat: int) -> None:
    """Each replaced panel's old and new query over the same range, alternately ``repeat`` times: median
    latency of each, and how far the new values are from the old at the last point (the panel's meaning)."""
    print(f"\nreplaced panels, old vs new query over the same {end - began:.0f} s (median of {repeat}, s):")
    params = {"start": f"{began:.3f}", "end": f"{end:.3f}", "step": str(scrape)}
    for name, old, new in replaced_panels():
        times: dict[str, list[float]] = {"old": [], "new": []}
        last: dict[str, dict[str, float]] = {}
        for _ in range(repeat):
            for which, expr in (("old", old), ("new", new)):
                t0 = time.perf_counter()
                body = get(url, "/api/v1/query_range", {"query": substitute(expr, int(end - began), scrape), **params},
                           timeout=60)
                times[which].append(time.perf_counter() - t0)
                last[which] = {s["metric"].get("rank", ""): float(s["values"][-1][1])
                               for s in body.get("data", {}).get("result", []) if s["values"]}
        common = [r for r in last["old"] if r in last["new"] and last["old"][r]]
        drift = max((abs(last["new"][r] / last["old"][r] - 1) for r in common), default=float("nan"))
        print(f"  {name:52s} {statistics.median(times['old']):7.3f} -> {statistics.median(times['new']):6.3f}"
              f"   ranks at the last point: {len(last['old'])} / {len(last['new'])}, in both {len(common)}, "
              f"largest difference {drift:.1%}", flush=True)


def _metric(url: str, promql: str) -> list[tuple[dict[str, str], float]]:
    body = get(url, "/api/v1/query", {"query": promql})
    return [(s["metric"], float(s["value"][1])) for s in body.get("data", {}).get("result", [])]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _load() -> str:
    import os

    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--nodes", type=int, default=0, help="default: ranks / 8")
    parser.add_argument("--scrape", type=int, default=15, help="scrape and evaluation interval, seconds")
    parser.add_argument("--minutes", type=float, default=5.0, help="how long to scrape live")
    parser.add_argument("--memory-limit", default="4GiB", help="GOMEMLIMIT of the Prometheus")
    parser.add_argument("--repeat", type=int, default=5,
                        help="runs of each replaced panel's old and new query (the side-by-side comparison; 0: none)")
    parser.add_argument("--rules", type=Path, default=RULE_FILES[0].parent,
                        help="directory of the rule files to load (default: the shipped deploy/prometheus; another "
                             "checkout's to compare)")
    args = parser.parse_args()
    nodes = args.nodes or max(args.ranks // GPUS_PER_NODE, 1)
    now = time.time()
    fleet = Fleet(args.ranks, nodes, now - 1500)
    fleet.advance(now)
    fleet.inject_nan(now + 30)
    one = fleet.models[1].exposition()
    print(f"fleet: {args.ranks} ranks on {nodes} nodes; a rank serves "
          f"{sum(1 for line in one.splitlines() if line and not line.startswith('#'))} series")
    served = Served(fleet, args.scrape)
    del fleet  # the renderer process has it
    server = ThreadingHTTPServer(("127.0.0.1", _free_port()), type("H", (_Handler,), {"served": served}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        targets = [{"targets": [address],
                    "labels": {"__metrics_path__": f"/metrics/{rank}", "instance": f"rank-{rank}"}}
                   for rank in range(args.ranks)]
        (work / "targets.json").write_text(json.dumps(targets))
        port = _free_port()
        interval = f"{args.scrape}s"
        config: dict[str, Any] = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(args.rules / p.name) for p in RULE_FILES],
            "scrape_configs": [{"job_name": "otelprof", "honor_labels": True,
                                "file_sd_configs": [{"files": [str(work / "targets.json")]}]},
                               {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}
        import os

        os.environ["GOMEMLIMIT"] = args.memory_limit
        with run_prometheus(work, config, port) as (url, process):
            began = time.time()
            cpu0, prom0, rounds0, render0 = _own_cpu(), _cpu_seconds(process.pid), served.rounds, served.cpu()
            while time.time() - began < args.minutes * 60:
                time.sleep(5)
                up = _metric(url, 'count(up{job="otelprof"} == 1)')
                print(f"  {time.time() - began:5.0f} s: {int(up[0][1]) if up else 0} targets up, load {_load()}",
                      flush=True)
            live = time.time() - began
            rounds = max(served.rounds - rounds0, 1)
            rendering, serving = served.cpu() - render0, _own_cpu() - cpu0
            generator, prometheus = rendering + serving, _cpu_seconds(process.pid) - prom0
            print(f"\nlive {live:.0f} s, load average {_load()} (1/5/15 min)")
            print(f"generator CPU: {generator:.1f} s in {rounds} rounds = {generator / rounds:.2f} s per round of "
                  f"{args.ranks} ranks (rendering {rendering / rounds:.2f} s, serving the scrapes and this "
                  f"benchmark's queries {serving / rounds:.2f} s), {generator / live:.1%} of a core")
            print(f"prometheus CPU: {prometheus:.1f} s = {prometheus / live:.1%} of a core "
                  f"({prometheus / live * args.scrape:.2f} s per {args.scrape} s interval)")
            report(url, args, began)
            if args.repeat:
                compare(url, args.scrape, began, time.time(), args.repeat)
            end = time.time()
        served.stop()
        quiet_cost(work, args.rules, end, args.scrape, port)
    server.shutdown()


def quiet_cost(work: Path, rules: Path, at: float, scrape: int, port: int, repeat: int = 3) -> None:
    """What each rule costs Prometheus, without the contention of the live run: a Prometheus restarted on the
    live run's data with no scrapes and no rules evaluates each rule's expression at ``at`` (the live run's end),
    alone, ``repeat`` times; the median wall time and Prometheus CPU seconds of each, summed per group against
    the evaluation interval (a group's CPU per evaluation: what it needs of a core of its own)."""
    with run_prometheus(work, {"global": {"scrape_interval": f"{scrape}s"}}, port) as (url, process):
        print(f"\nquiet Prometheus on the same data, each rule alone at the live run's end (median of {repeat}; "
              f"load {_load()}):\n  {'group':24s} {'wall s':>8s} {'CPU s':>8s}  CPU share of its interval")
        costs: list[tuple[float, float, str]] = []
        for path in (rules / p.name for p in RULE_FILES):
            for group in yaml.safe_load(path.read_text())["groups"]:
                wall = cpu = 0.0
                for rule in group["rules"]:
                    runs = []
                    for _ in range(repeat):
                        c0, t0 = _cpu_seconds(process.pid), time.perf_counter()
                        body = get(url, "/api/v1/query", {"query": rule["expr"], "time": f"{at:.3f}"})
                        runs.append((time.perf_counter() - t0, _cpu_seconds(process.pid) - c0))
                        if body.get("status") != "success":
                            print(f"  error: {rule.get('record') or rule.get('alert')}: {body.get('error')}")
                    w, c = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
                    wall, cpu = wall + w, cpu + c
                    costs.append((c, w, rule.get("record") or rule["alert"]))
                every = _seconds(group.get("interval")) or scrape
                print(f"  {group['name']:24s} {wall:8.3f} {cpu:8.2f}  {cpu / every:6.1%} of {every:g} s")
        print(f"  all groups                {sum(w for _, w, _ in costs):8.3f} {sum(c for c, _, _ in costs):8.2f}")
        print("  costliest (CPU s / wall s): " + ", ".join(f"{name} {c:.2f}/{w:.2f}"
                                                         for c, w, name in sorted(costs)[-10:]))


def report(url: str, args: argparse.Namespace, began: float) -> None:
    window = f"{max(int(time.time() - began) // 60 - 1, 1)}m"
    print(f"\nrule groups (evaluation time, s: last, median and max over the last {window}; last as a share of the "
          "group's own interval; missed iterations):")
    median = {labels["rule_group"]: value for labels, value in _metric(
        url, f"quantile_over_time(0.5, prometheus_rule_group_last_duration_seconds[{window}])")}
    top = {labels["rule_group"]: value for labels, value in _metric(
        url, f"max_over_time(prometheus_rule_group_last_duration_seconds[{window}])")}
    missed = {labels["rule_group"]: value for labels, value in _metric(
        url, "prometheus_rule_group_iterations_missed_total")}
    interval = {labels["rule_group"]: value for labels, value in _metric(
        url, "prometheus_rule_group_interval_seconds")}  # the group's own (the recording groups': 30 s)
    for labels, value in sorted(_metric(url, "prometheus_rule_group_last_duration_seconds"),
                                key=lambda x: x[0].get("rule_group", "")):
        group = labels["rule_group"]
        print(f"  {group.split(';')[-1]:24s} {value:8.3f} {median.get(group, math.nan):8.3f} "
              f"{top.get(group, math.nan):8.3f}  {value / interval.get(group, args.scrape):6.1%} of \
{interval.get(group, args.scrape):.0f} s  {missed.get(group, 0):.0f}")
    groups = get(url, "/api/v1/rules", {})["data"]["groups"]
    rules = [(float(rule.get("evaluationTime", 0.0)), rule["name"]) for group in groups for rule in group["rules"]]
    print("slowest rules (last evaluation, s): " + ", ".join(f"{name} {t:.2f}" for t, name in sorted(rules)[-8:]))
    for group in groups:
        print(f"  {group['name']}: " + ", ".join(f"{rule['name']} {float(rule.get('evaluationTime', 0)):.3f}"
                                                  for rule in group["rules"]))
    for name, promql in (("head series", "prometheus_tsdb_head_series"),
                         ("samples/s appended", "rate(prometheus_tsdb_head_samples_appended_total[2m])"),
                         ("resident memory, bytes", 'process_resident_memory_bytes{job="prometheus"}'),
                         ("Go heap in use, bytes", 'go_memstats_heap_inuse_bytes{job="prometheus"}'),
                         ("scrape duration max, s", 'max(scrape_duration_seconds{job="otelprof"})'),
                         ("scrape duration max over the run, s",
                          f'max(max_over_time(scrape_duration_seconds{{job="otelprof"}}[{window}]))'),
                         ("targets down", 'count(up{job="otelprof"} == 0) or vector(0)')):
        values = _metric(url, promql)
        print(f"{name}: {values[0][1]:.4g}" if values else f"{name}: (none)")
    end = time.time()
    range_s = int(end - began)
    latencies: list[tuple[float, str]] = []
    errors = 0
    for where, expr, instant in dashboard_queries():
        q = substitute(expr, range_s, args.scrape)
        t0 = time.perf_counter()
        if instant:
            body = get(url, "/api/v1/query", {"query": q, "time": f"{end:.3f}"}, timeout=30)
        else:
            body = get(url, "/api/v1/query_range", {"query": q, "start": f"{began:.3f}", "end": f"{end:.3f}",
                                                    "step": str(args.scrape)}, timeout=30)
        latencies.append((time.perf_counter() - t0, where))
        errors += body.get("status") != "success"
        print(f"  {latencies[-1][0]:7.3f} s  {where}", flush=True)
    latencies.sort(reverse=True)
    print(f"\ndashboard queries: {len(latencies)} ({errors} errors), over 2 s: "
          f"{sum(1 for seconds, _ in latencies if seconds > 2)}, over 1 s: "
          f"{sum(1 for seconds, _ in latencies if seconds > 1)}; load {_load()}; slowest:")
    for seconds, where in latencies:
        if seconds > 1 or seconds == latencies[0][0]:
            print(f"  {seconds:7.3f} s  {where}")
    firing = {(s["metric"]["alertname"], s["metric"].get("rank", "")) for s in
              get(url, "/api/v1/query", {"query": 'ALERTS{alertstate="firing"}'})["data"]["result"]}
    pending = {(s["metric"]["alertname"], s["metric"].get("rank", "")) for s in
               get(url, "/api/v1/query", {"query": 'ALERTS{alertstate="pending"}'})["data"]["result"]}
    print(f"\nalerts firing: {sorted(firing)}\nalerts pending: {sorted(pending)}")


if __name__ == "__main__":
    main()
