"""The report of many ranks: sections summarise them (distribution, worst and best 5, how many folded) instead
of a row each; small jobs keep their tables; the progress bar on stderr."""

from __future__ import annotations

import json
import os
import pty
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from otelprof.analysis.ranksummary import THRESHOLD, TOP
from otelprof.analysis.report import build_report, load
from otelprof.report.html import render
from tests.test_report_fixtures import T0, manifest, ns, write_rank

STEPS = 30
GPUS = 8


def _duration(rank: int, n: int) -> float:
    """Rank 23 is slow, rank 11 fast, the others a little slower the higher their rank."""
    base = 0.3 if rank == 23 else 0.05 if rank == 11 else 0.1 + rank * 0.001
    return base * (1 + 0.01 * (n % 3))


def _wait(rank: int) -> float:
    return 0.002 + (rank * 7 % 40) * 0.0005


def _fleet(root: Path, ranks: int, per_node: int = GPUS) -> tuple[Path, dict[int, list[float]], dict[int, float]]:
    """``ranks`` ranks on nodes of ``per_node``; returns the run, each rank's step durations and its data-wait
    share. Node n's CPUs are busier the higher n."""
    run = root / f"fleet-{ranks}"
    durations: dict[int, list[float]] = {}
    shares: dict[int, float] = {}
    for rank in range(ranks):
        node, local = divmod(rank, per_node)
        t = T0 + 10
        steps: list[dict[str, Any]] = []
        waits = []
        durations[rank] = []
        for n in range(STEPS):
            d = _duration(rank, n)
            steps.append({"k": "s", "ph": "train", "n": n, "t": ns(t), "d": ns(d),
                          "a": [["dataloader", 0, ns(_wait(rank)), 0], ["forward", ns(_wait(rank)), ns(d / 2), 0]]})
            durations[rank].append(d)
            waits.append(_wait(rank))
            t += d + 0.01
        shares[rank] = sum(ns(w) for w in waits) / sum(ns(d) for d in durations[rank])
        samples = []
        for i in range(10):
            sample: dict[str, Any] = {"t": ns(T0 + 10 + 0.5 * i), "pid": 100 + rank, "pcpu": 0.5, "rss": 1000}
            if local == 0:
                sample.update({"cpu": [0.2 + node / 100] * 4, "iow": [0.0] * 4, "mem": 0.3, "disk": [0, 0],
                               "net": [0, 0], "thr": 0,
                               "gpu": {str(g): {"u": 0.5 + (node * GPUS + g) / 200, "mu": 4e9, "mt": 8e9}
                                       for g in range(GPUS)}})
            samples.append(sample)
        man = manifest(rank, node=f"node-{node}", world=ranks, lifecycle={
            "process_start": T0, "init": T0 + 1, "first_step_start": T0 + 10, "last_step_end": t,
            "shutdown": t + 1})
        man["local_rank"] = local
        write_rank(run, rank, man, steps, samples)
    return run, durations, shares


def _percentile(values: list[float], q: int) -> float:
    """The q-th percentile, linear interpolation between the closest ranks (as numpy's default)."""
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def test_many_ranks_are_summarised_with_worst_best_and_folded(tmp_path: Path) -> None:
    ranks = 40
    run, durations, shares = _fleet(tmp_path, ranks)
    report = build_report(load(run), checks=False)

    medians = {rank: statistics.median(d) for rank, d in durations.items()}
    summary = next(s for s in report.steps.summaries if s.figure == "median step" and s.group == "train")
    assert summary.count == ranks
    assert summary.folded == ranks - 2 * TOP
    slowest = sorted(medians, key=lambda r: -medians[r])[:TOP]
    fastest = sorted(medians, key=lambda r: medians[r])[:TOP]
    assert [x.subject for x in summary.worst] == [f"rank {r}" for r in slowest]
    assert [x.subject for x in summary.best] == [f"rank {r}" for r in fastest]
    assert slowest[0] == 23 and fastest[0] == 11
    values = list(medians.values())
    expected = (min(values), _percentile(values, 5), statistics.median(values), _percentile(values, 95), max(values))
    got = (summary.min, summary.p5, summary.median, summary.p95, summary.max)
    assert all(abs(a - b) < 1e-6 for a, b in zip(got, expected)), (got, expected)

    wait = next(s for s in report.dataloader.summaries if s.figure == "wait share")
    assert [x.subject for x in wait.worst] == [f"rank {r}" for r in sorted(shares, key=lambda r: -shares[r])[:TOP]]
    assert abs(wait.median - statistics.median(shares.values())) < 1e-9

    compute = next(s for s in report.load.summaries if s.figure == "mean compute")
    assert compute.worst[0].subject == "rank 23" and compute.best[0].subject == "rank 11"
    assert compute.count == ranks and compute.folded == ranks - 2 * TOP

    gpu = next(s for s in report.gpus.summaries if s.figure == "median utilization")
    assert gpu.count == ranks // GPUS * GPUS and not gpu.higher_is_worse
    assert [x.subject for x in gpu.worst] == [f"node-0 GPU {g}" for g in range(TOP)]  # the least busy first
    assert gpu.best[0].subject == f"node-{ranks // GPUS - 1} GPU {GPUS - 1}"

    assert report.system.summaries == ()  # 5 nodes: each keeps its rows
    rss = next(s for s in report.system.process_summaries if s.unit == "bytes")
    assert rss.count == ranks and rss.max == 1000
    job = report.summary
    assert next(s for s in job.rank_summaries if s.figure == "steps").median == STEPS
    assert job.standing_out == ()  # every rank finished, dropped nothing

    html = render(report)
    steps = html[html.index('<section id="steps"'):]
    steps = steps[:steps.index("</section>")]
    assert f"{ranks} ranks: the distribution" in steps
    assert "rank 23 (" in steps and "rank 11 (" in steps
    middle = sorted(medians, key=lambda r: medians[r])[ranks // 2]
    assert f"rank {middle} (" not in steps  # folded: neither worst nor best
    assert not re.search(rf"<td class=\"l\">{middle}</td>", steps)  # and no per-rank row
    balance = html[html.index('<section id="balance"'):]
    assert balance[:balance.index("</section>")].count("<rect") < ranks


def test_up_to_the_threshold_every_rank_keeps_its_row(tmp_path: Path) -> None:
    run, durations, _ = _fleet(tmp_path, THRESHOLD)
    report = build_report(load(run), checks=False)
    assert report.steps.summaries == () and report.dataloader.summaries == () and report.load.summaries == ()
    assert len({x.rank for x in report.steps.rows}) == THRESHOLD
    html = render(report)
    steps = html[html.index('<section id="steps"'):]
    steps = steps[:steps.index("</section>")]
    assert "the distribution of each figure" not in steps
    for rank in durations:
        assert f'<td class="l">{rank}</td><td class="l">node-{rank // GPUS}</td>' in steps


def _report_cli(run: Path, out: Path, *args: str, tty: bool) -> str:
    """Run ``otelprof report``; returns what it wrote to stderr (through a pseudo-terminal when ``tty``)."""
    command = [sys.executable, "-m", "otelprof", "report", str(run), "-o", str(out), "--no-checks", *args]
    env = dict(os.environ, COLUMNS="100")
    if not tty:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr
        return done.stderr
    main, child = pty.openpty()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=child, env=env)
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    assert process.wait(timeout=300) == 0
    return b"".join(chunks).decode("utf-8", errors="replace")


def test_progress_bar_on_a_terminal_only_and_quiet_silences_it(tmp_path: Path) -> None:
    run, _, _ = _fleet(tmp_path, 24)
    on_tty = _report_cli(run, tmp_path / "a.html", tty=True)
    bars = re.findall(r"\r\S* *\[[#.]+\] +(\d+)/(\d+) ranks", on_tty)
    assert bars, on_tty
    assert bars[-1] == ("24", "24")
    assert [int(done) for done, _ in bars] == sorted(int(done) for done, _ in bars)

    piped = _report_cli(run, tmp_path / "b.html", tty=False)
    assert "\r" not in piped and "ranks [" not in piped and "] " not in piped.replace("s] ", "")
    for stage in ("step durations", "regions", "step time breakdown"):  # a tenth of the 24 ranks apart, and the last
        said = re.findall(rf"\] {stage} of rank (\d+) \((\d+) of 24 ranks\)", piped)
        assert [rank for rank, _ in said] == ["0", "2", "4", "6", "8", "10", "12", "14", "16", "18", "20", "22", "23"]
    asked = _report_cli(run, tmp_path / "c.html", "--progress", tty=False)
    assert re.search(r"\[[#.]+\] +24/24 ranks", asked), asked
    quiet = _report_cli(run, tmp_path / "d.html", "--quiet", "--progress", tty=True)
    assert "ranks" not in quiet and "\r" not in quiet
    assert (tmp_path / "d.html").stat().st_size > 0

    done = subprocess.run([sys.executable, "-m", "otelprof", "check", str(run), "--json", "--progress"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    assert {c["alert"] for c in json.loads(done.stdout)["checks"]}  # stdout is the JSON alone
    assert re.search(r"\[#+\] +24/24 ranks", done.stderr), done.stderr
    done = subprocess.run([sys.executable, "-m", "otelprof", "compare", str(run), str(run), "--format", "json",
                           "--progress"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["runs"]) == 2
    assert re.search(r"reading 2/2 \[#+\] +24/24 ranks", done.stderr), done.stderr


def test_timeline_selects_ranks_and_steps(tmp_path: Path) -> None:
    run, _, _ = _fleet(tmp_path, 12)
    out = tmp_path / "trace.json"
    done = subprocess.run([sys.executable, "-m", "otelprof", "timeline", str(run), "-o", str(out), "--ranks",
                           "0,3,8-10", "--steps", "5-12"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    events = json.loads(out.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    ranks = {int(name.split()[1]) for name in names.values() if name.startswith("rank ")}
    assert ranks == {0, 3, 8, 9, 10}
    steps = [e for e in events if e.get("cat") in ("step", "outlier step")]
    # exactly steps 5..12 of each selected rank (its own, whatever the others' timing): the fleet's ranks run
    # their steps at different speeds, so a time window would take in other steps of the faster ranks
    starts = {}
    for rank in (0, 3, 8, 9, 10):
        t = T0 + 10
        for n in range(STEPS):
            starts[rank, n] = t
            t += _duration(rank, n) + 0.01
    assert len({round(starts[r, 12] - starts[r, 5], 6) for r in (0, 3, 8, 9, 10)}) > 1  # the timings differ
    expected = {(r, n) for r in (0, 3, 8, 9, 10) for n in range(5, 13)}
    got = {(int(names[e["pid"]].split()[1]), e["args"]["number"]) for e in steps}
    assert got == expected
    assert {names[e["pid"]].split()[1] for e in events if e.get("ph") != "M" and e["pid"] in names
            and names[e["pid"]].startswith("rank ")} <= {"0", "3", "8", "9", "10"}
    assert {e["pid"] for e in steps} == {pid for pid, name in names.items() if name.startswith("rank ")}

    for bad in (("--ranks", "3-1"), ("--ranks", "x"), ("--steps", "9-2"), ("--ranks", "40-41")):
        bad = (*bad, "--quiet")
        done = subprocess.run([sys.executable, "-m", "otelprof", "timeline", str(run), "-o", str(out), *bad],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("otelprof timeline: "), done.stderr


def test_many_nodes_show_the_distribution_and_the_details_of_the_worst(tmp_path: Path) -> None:
    nodes = THRESHOLD + 4
    run, _, _ = _fleet(tmp_path, nodes, per_node=1)
    report = build_report(load(run), checks=False)
    cpu = next(s for s in report.system.summaries if s.figure == "CPU p95")
    assert cpu.count == nodes and cpu.folded == nodes - 2 * TOP
    assert [x.subject for x in cpu.worst] == [f"node-{n}" for n in range(nodes - 1, nodes - 1 - TOP, -1)]
    assert abs(cpu.max - (0.2 + (nodes - 1) / 100)) < 1e-9
    assert len(report.system.detailed) == TOP
    html = render(report)
    system = html[html.index('<section id="system"'):]
    system = system[:system.index("</section>")]
    assert system.count("<h3>Node ") == TOP
    assert f"the other {nodes - TOP:,} are folded" in system
