"""Report benchmark: a synthetic 24-hour, 8-rank recording -> ``otelprof report`` in <= 30 s and <= 2 GB.

    python benchmarks/report.py                 # generate (cached) + report, the issue's figures
    python benchmarks/report.py --quick         # 1 hour, 8 ranks: a smoke run
    python benchmarks/report.py --keep DIR      # generate into DIR and keep it (re-used when present)

The recording is what eight ranks on one 8-GPU, 64-core node would write in 24 hours:
1,000,000 step records in all (125,000 per rank, about 0.69 s a step, each with dataloader, forward,
backward, collective and optimizer regions and loss/samples/learning-rate scalars, a slow step now
and then and an eval phase every 5,000 steps), node samples every 500 ms from rank 0 (64 cores'
busy and iowait, host memory, disk, network, 8 GPUs' utilization, memory, power, ...), process
samples every 500 ms from every rank and a few operator-profiling windows (metrics.jsonl stays
empty: the report reads only its newest snapshot).

The report runs in a child process, timed from outside; its peak memory is that process's and its
parsing workers' memory together (proportional set size: shared pages count once), sampled every
50 ms. It runs three times: HTML with the offline checks, HTML with ``--no-checks``, and JSON.
Progress of the generation and of the report goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

T0 = 1_750_000_000.0
NODE = "node-a"
JOB = "bench-24h"
CORES = 64
GPUS = 8
INTERVAL = 0.5
REGIONS = ("dataloader", "forward", "backward", "collective", "optimizer")


def _manifest(run_id: str, rank: int, world: int, hours: float, first_step: float,
              last_step: float) -> dict[str, object]:
    end = T0 + hours * 3600
    return {
        "schema_version": "1.0", "otelprof_version": "0.1.0", "run_id": run_id, "rank": rank,
        "local_rank": rank, "world_size": world, "status": "finished",
        "resource": {"service.name": JOB, "host.name": NODE, "k8s.node.name": NODE, "otelprof.rank": rank,
                     "otelprof.local_rank": rank, "otelprof.world_size": world, "otelprof.run.id": run_id,
                     "process.pid": 1000 + rank},
        "config": {"job_name": JOB, "rank": rank, "local_rank": rank, "world_size": world, "outlier_sigma": 3.0,
                   "outlier_min_steps": 20, "sample_interval": INTERVAL, "node_sampler_local_rank": 0},
        "lifecycle": {"process_start": T0 + rank * 0.01, "init": T0 + 2.0, "first_step_start": first_step,
                      "last_step_end": last_step, "shutdown": end - 1.0},
        "dropped": {"queue": 0},
    }


def _write_steps(path: Path, rank: int, steps: int, start: float, end: float, rng: random.Random) -> float:
    """One rank's steps.jsonl; returns the last step's end (Unix seconds)."""
    period = (end - start - 400.0) / steps  # room for the slow steps and the gaps between steps
    t = int(start * 1e9)
    lines: list[str] = []
    train_n = eval_n = 0
    phase = "train"
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps({"k": "a", "name": "initialization", "ph": None, "t": int((T0 + 3) * 1e9),
                              "d": int((start - T0 - 4) * 1e9)}) + "\n")
        out.write(f'{{"k":"p","ph":"train","t":{t}}}\n')
        for i in range(steps):
            now = "eval" if i % 5050 >= 5000 else "train"
            if now != phase:
                phase = now
                lines.append(f'{{"k":"p","ph":"{phase}","t":{t}}}')
            base = period * 0.995 * (0.6 if phase == "eval" else 1.0)
            d = base * rng.uniform(0.97, 1.03)
            if i % 997 == 500:
                d *= 3.0  # a slow step: an outlier
            dur = int(d * 1e9)
            # rank 7 is a straggler: more compute, so it waits less in the all-reduce than the others
            straggler = rank == 7
            dl, fw, bw, co = (int(dur * 0.06), int(dur * (0.34 if straggler else 0.3)),
                              int(dur * (0.52 if straggler else 0.45)), int(dur * (0.02 if straggler else 0.12)))
            if phase == "train":
                op = int(dur * 0.12)
                a = (f'[["dataloader",1000,{dl},0],["forward",{dl + 2000},{fw},0],'
                     f'["backward",{dl + fw + 3000},{bw},0],["collective",{dl + fw + bw // 2},{co},1],'
                     f'["optimizer",{dl + fw + bw + 4000},{op},0]]')
                loss = 3.0 * 0.99999 ** train_n + rng.uniform(-0.01, 0.01)
                lines.append(f'{{"k":"s","ph":"train","n":{train_n},"t":{t},"d":{dur},"a":{a},'
                             f'"x":{{"loss":{loss:.6f},"samples":256.0,"learning_rate":0.001}}}}')
                train_n += 1
            else:
                a = f'[["dataloader",1000,{dl},0],["forward",{dl + 2000},{fw},0]]'
                lines.append(f'{{"k":"s","ph":"eval","n":{eval_n},"t":{t},"d":{dur},"a":{a},'
                             f'"x":{{"loss":{3.0 * 0.99999 ** train_n:.6f},"samples":256.0}}}}')
                eval_n += 1
            t += max(dur, int(period * 1e9)) + 500_000
            if len(lines) >= 20000:
                out.write("\n".join(lines) + "\n")
                lines.clear()
        out.write(json.dumps({"k": "a", "name": "checkpoint", "ph": "train", "t": t + 10**9, "d": 30 * 10**9}) + "\n")
        if lines:
            out.write("\n".join(lines) + "\n")
    return t / 1e9


def _write_samples(path: Path, rank: int, hours: float, rng: random.Random) -> None:
    n = int(hours * 3600 / INTERVAL)
    pool = [f"{v / 1000:.4f}".rstrip("0").rstrip(".") or "0" for v in range(1001)]
    busy = [pool[v] for v in range(350, 1001)]
    idle = [pool[v] for v in range(0, 40)]
    lines: list[str] = []
    disk_r = disk_w = net_r = net_t = 0
    with open(path, "w", encoding="utf-8") as out:
        for i in range(n):
            t = int((T0 + 1 + i * INTERVAL) * 1e9)
            head = f'{{"t":{t},"pid":{1000 + rank},"pcpu":{rng.uniform(0.5, 1.5):.4f},"rss":{8_000_000_000 + i * 10}'
            if rank != 0:
                lines.append(head + "}")
            else:
                stall = i % 600 < 30  # 15 s of every 5 minutes: input stall, GPUs idle, a core pegged
                cpu = ("1.0," if stall else rng.choice(busy) + ",") + ",".join(rng.choices(busy, k=CORES - 1))
                iow = ("0.6," if stall else rng.choice(idle) + ",") + ",".join(rng.choices(idle, k=CORES - 1))
                disk_r += 50_000_000
                disk_w += 1_000_000
                net_r += 400_000_000
                net_t += 400_000_000
                gpus = ",".join(
                    f'"{g}":{{"u":{0.02 if stall else rng.uniform(0.8, 1.0):.4f},"mc":0.3,'
                    f'"mu":{60e9 + g * 1e9 + i * 1000:.0f},"mt":80000000000,"p":{rng.uniform(300, 650):.1f},'
                    f'"pl":700.0,"t":{rng.uniform(55, 75):.1f},"clk":1980000000}}'
                    for g in range(GPUS))
                lines.append(f'{head},"cpu":[{cpu}],"iow":[{iow}],'
                             f'"mem":{rng.uniform(0.3, 0.4):.4f},"disk":[{disk_r},{disk_w}],'
                             f'"net":[{net_r},{net_t}],"thr":0,"gpu":{{{gpus}}}}}')
            if len(lines) >= 5000:
                out.write("\n".join(lines) + "\n")
                lines.clear()
        if lines:
            out.write("\n".join(lines) + "\n")


def _write_profiles(path: Path, first_step: float) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for k, start in enumerate((100, 50_000, 100_000)):
            record = {"start_step": start, "num_steps": 5, "t": int((first_step + start * 0.69) * 1e9),
                      "d": 3_500_000_000,
                      "cpu_ops": [{"name": f"aten::op{j}", "calls": 100 * (j + 1), "self_s": 0.5 / (j + 1) + k,
                                   "total_s": 1.0 / (j + 1) + k} for j in range(10)],
                      "gpu_ops": [{"name": f"kernel_{j}", "calls": 50, "self_s": 0.8 / (j + 1),
                                   "total_s": 0.8 / (j + 1)} for j in range(10)],
                      "gpu_activity_s": {"kernel": 2.5, "memcpy": 0.3, "memset": 0.01, "sync": 0.1},
                      "kernel_precision_s": {"bf16": 2.0, "fp32": 0.5}}
            out.write(json.dumps(record) + "\n")


def generate(root: Path, hours: float = 24.0, total_steps: int = 1_000_000, ranks: int = 8) -> Path:
    """Write the synthetic recording under ``root/<run-id>/`` (re-used when complete) and return the run dir."""
    run_id = f"bench-{hours:g}h-{total_steps}"
    run = root / run_id
    if (run / "complete").exists():
        return run
    shutil.rmtree(run, ignore_errors=True)
    first_step = T0 + 300.0
    end_steps = T0 + hours * 3600 - 120.0
    for rank in range(ranks):
        started = time.monotonic()
        rng = random.Random(rank)
        d = run / f"rank-{rank}"
        d.mkdir(parents=True)
        last = _write_steps(d / "steps.jsonl", rank, total_steps // ranks, first_step, end_steps, rng)
        _write_samples(d / "samples.jsonl", rank, hours, rng)
        if rank == 0:
            _write_profiles(d / "profiles.jsonl", first_step)
        (d / "spans.jsonl").write_text("", encoding="utf-8")
        (d / "metrics.jsonl").write_text("", encoding="utf-8")
        (d / "manifest.json").write_text(json.dumps(_manifest(run_id, rank, ranks, hours, first_step, last)))
        print(f"generated rank {rank} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    (run / "complete").write_text("", encoding="utf-8")
    return run


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _run_report(run: Path, out: Path, *options: str) -> tuple[float, float, list[str]]:
    """Seconds, peak RSS (MiB, the report process and its parsing workers together) and progress lines of
    ``otelprof report`` in a child process."""
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-m", "otelprof", "report", str(run), "-o", str(out), *options],
                             stderr=subprocess.PIPE, text=True)
    lines: list[str] = []

    def drain() -> None:
        assert child.stderr is not None
        for line in child.stderr:
            lines.append(line.rstrip())
            print("   ", line.rstrip(), file=sys.stderr)

    import threading

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    peak = 0
    process = psutil.Process(child.pid)
    while child.poll() is None:
        try:  # PSS: pages the forked workers share with the report process count once
            used = sum(_pss(p) for p in (process, *process.children(recursive=True)))
            peak = max(peak, used)
        except psutil.Error:
            pass
        time.sleep(0.05)
    seconds = time.monotonic() - started
    reader.join(5)
    if child.returncode != 0:
        raise SystemExit(f"otelprof report failed ({child.returncode})")
    return seconds, peak / 2**20, lines


def _pss(process: psutil.Process) -> int:
    try:
        return int(process.memory_full_info().pss)
    except (AttributeError, OSError):
        return int(process.memory_info().rss)


def _phase_times(lines: list[str], total: float) -> str:
    """Seconds spent reading, in the analyses (the checks run beside them in a second process on long
    runs) and after them (waiting for the checks, rendering), from the progress lines' timestamps."""
    stamps: dict[str, float] = {}
    for line in lines:
        if line.startswith("[") and "]" in line:
            at = float(line[1:line.index("]")].strip().rstrip("s").strip())
            text = line[line.index("]") + 1:].strip()
            key = ("read" if text.startswith("reading") else "collect" if text.startswith("offline checks: collecting")
                   else "other")
            stamps.setdefault(key + " first", at)
            stamps[key + " last"] = at
    read = stamps.get("read last", 0.0)
    collect = stamps.get("collect first")
    if collect is None:
        return f"read {read:.1f} s, then analyses and rendering"
    return (f"read {read:.1f} s, analyses with the checks beside them {collect - read:.1f} s, "
            f"then {max(total - collect, 0.0):.1f} s (the checks' rest, rendering, start-up)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 hour, 40,000 steps instead of 24 h, 1,000,000")
    parser.add_argument("--keep", default=None, metavar="DIR", help="generate into DIR and keep it")
    parser.add_argument("--hours", type=float, default=None)
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    hours = args.hours or (1.0 if args.quick else 24.0)
    steps = args.steps or (40_000 if args.quick else 1_000_000)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="otelprof-bench-"))
    try:
        started = time.monotonic()
        run = generate(root, hours, steps)
        print(f"recording: {run} ({_du(run) / 2**20:.0f} MiB, generated in {time.monotonic() - started:.0f} s)",
              file=sys.stderr)
        results = {}
        for label, out, options in (("HTML, with the checks", root / "report.html", ()),
                                    ("HTML, --no-checks", root / "report-nochecks.html", ("--no-checks",)),
                                    ("JSON, with the checks", root / "report.json", ("--format", "json"))):
            print(f"otelprof report -> {label}", file=sys.stderr)
            seconds, peak, lines = _run_report(run, out, *options)
            results[label] = (seconds, peak, out.stat().st_size, _phase_times(lines, seconds))
        print(f"\n{hours:g} h, {steps:,} steps on 8 ranks, {_du(run) / 2**20:.0f} MiB recording, "
              f"{os.cpu_count()} CPUs")
        print("| report | time (s) | peak RSS (MiB) | output (KiB) | where the time went | goal <= 30 s, <= 2048 MiB |")
        print("| --- | --- | --- | --- | --- | --- |")
        for label, (seconds, peak, size, phases) in results.items():
            ok = "met" if seconds <= 30 and peak <= 2048 else "MISSED"
            print(f"| {label} | {seconds:.1f} | {peak:.0f} | {size / 1024:.0f} | {phases} | {ok} |")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
