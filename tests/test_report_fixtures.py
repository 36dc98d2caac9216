"""Small recordings with hand-computable figures, written through the recording writer.

``small_run`` is one rank on node ``n1`` (4 CPUs, 2 GPUs), T0 = 1,700,000,000 s:

* process start T0, 20 train steps from T0 + 10 back to back: 19 of 0.1 s, then one of 1.0 s
  (the input stall: its dataloader region is 0.9 s); a 0.1 s gap; 5 eval steps of 0.05 s; shutdown
  5 s after the last step (T0 + 13.25) -> job 18.25 s, initialization 10 s, loop 3.25 s, final 5 s;
* train regions per step: dataloader (0.02 s, the stall step 0.9 s), forward 0.03 s, backward
  0.04 s; eval: dataloader 0.01 s, forward 0.02 s; scalars loss, samples = 32;
* 10 node samples, sample i at T0 + 8 + 0.5 i: every CPU busy (i + 1) / 10, iowait 0 except
  CPU 0 at 0.6 in sample 9; GPU 0 at 0.5 utilization and 4/8 GB, GPU 1 at (9 - i) / 10 and 2/8 GB;
  network counters +1000 B received and sent per sample;
* annotations outside steps: initialization (8 s) and checkpoint (1 s); one profiling window.

Not a test module: the tests import it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otelprof.recording import schema
from otelprof.recording.writer import RecordingWriter

T0 = 1_700_000_000.0
NS = 1_000_000_000


def ns(seconds: float) -> int:
    return round(seconds * NS)


def manifest(rank: int = 0, job: str = "fixture", node: str = "n1", world: int = 1, run_id: str = "run-1",
             lifecycle: dict[str, float | None] | None = None, status: str = schema.STATUS_FINISHED,
             schema_version: str = schema.SCHEMA_VERSION) -> dict[str, Any]:
    return {
        "schema_version": schema_version, "otelprof_version": "0.1.0", "run_id": run_id, "rank": rank,
        "local_rank": rank, "world_size": world, "status": status,
        "resource": {"service.name": job, "host.name": node, "otelprof.rank": rank, "process.pid": 100 + rank},
        "config": {"job_name": job, "outlier_sigma": 3.0, "outlier_min_steps": 20},
        "lifecycle": lifecycle or {},
        "dropped": {"queue": 0},
    }


def step_line(phase: str, number: int, start: float, duration: float,
              regions: list[tuple[str, float, float, int]] = (),  # type: ignore[assignment]
              scalars: dict[str, float] | None = None) -> dict[str, Any]:
    """A steps.jsonl step record as the recorder writes it (regions: name, offset s, duration s, depth)."""
    record: dict[str, Any] = {"k": "s", "ph": phase, "n": number, "t": ns(start), "d": ns(duration)}
    if regions:
        record["a"] = [[name, ns(offset), ns(d), depth] for name, offset, d, depth in regions]
    if scalars:
        record["x"] = scalars
    return record


def write_rank(run: Path, rank: int, man: dict[str, Any], steps: list[dict[str, Any]] = (),  # type: ignore[assignment]
               samples: list[dict[str, Any]] = (), others: list[dict[str, Any]] = (),  # type: ignore[assignment]
               profiles: list[dict[str, Any]] = ()) -> Path:  # type: ignore[assignment]
    directory = run / schema.rank_dir_name(rank)
    writer = RecordingWriter(directory, man, lambda n: None, lambda n: None)
    for record in others:
        writer.add_json(schema.STEPS, record)
    for record in steps:
        writer.add_json(schema.STEPS, record)
    for record in samples:
        writer.add_json(schema.SAMPLES, record)
    for record in profiles:
        writer.add_json(schema.PROFILES, record)
    writer.close()
    return directory


def small_steps(t0: float = T0, stall: float = 0.9, train_step: float = 0.1) -> list[dict[str, Any]]:
    steps = []
    t = t0 + 10
    for n in range(20):
        last = n == 19
        duration = 1.0 if last else train_step
        wait = stall if last else 0.02
        steps.append(step_line("train", n, t, duration,
                               [("dataloader", 0.0, wait, 0), ("forward", wait, 0.03, 0),
                                ("backward", wait + 0.03, 0.04, 0)],
                               {"loss": 2.0 - n * 0.05, "samples": 32.0}))
        t += duration
    t += 0.1
    for n in range(5):
        steps.append(step_line("eval", n, t, 0.05, [("dataloader", 0.0, 0.01, 0), ("forward", 0.01, 0.02, 0)],
                               {"loss": 1.5, "samples": 32.0}))
        t += 0.05
    return steps


def small_samples(t0: float = T0, gpus: bool = True) -> list[dict[str, Any]]:
    samples = []
    for i in range(10):
        busy = (i + 1) / 10
        sample: dict[str, Any] = {
            "t": ns(t0 + 8 + 0.5 * i), "pid": 100, "pcpu": 0.25, "rss": 1000 * (i + 1),
            "cpu": [busy] * 4, "iow": [0.6 if i == 9 else 0.0, 0.0, 0.0, 0.0], "mem": 0.3 + i / 100,
            "disk": [0, 0], "net": [1000 * i, 1000 * i], "thr": 0,
        }
        if gpus:
            sample["gpu"] = {"0": {"u": 0.5, "mu": 4e9, "mt": 8e9, "p": 300.0, "t": 60.0},
                             "1": {"u": (9 - i) / 10, "mu": 2e9, "mt": 8e9, "p": 200.0, "t": 50.0}}
        samples.append(sample)
    return samples


def small_run(root: Path, name: str = "run-1", gpus: bool = True, t0: float = T0, stall: float = 0.9,
              train_step: float = 0.1) -> Path:
    run = root / name
    steps = small_steps(t0, stall, train_step)
    last_end = steps[-1]["t"] / NS + steps[-1]["d"] / NS
    life = {"process_start": t0, "init": t0 + 0.5, "first_step_start": t0 + 10, "last_step_end": last_end,
            "shutdown": last_end + 5}
    others = [{"k": "a", "name": "initialization", "ph": None, "t": ns(t0 + 1), "d": ns(8)},
              {"k": "p", "ph": "train", "t": ns(t0 + 10)},
              {"k": "a", "name": "checkpoint", "ph": "train", "t": ns(last_end + 1), "d": ns(1)}]
    profile = {"start_step": 3, "num_steps": 2, "t": ns(t0 + 10.3), "d": ns(0.2),
               "cpu_ops": [{"name": "aten::conv2d", "calls": 10, "self_s": 0.06, "total_s": 0.1},
                           {"name": "aten::relu", "calls": 20, "self_s": 0.02, "total_s": 0.02}],
               "gpu_ops": [{"name": "sgemm_kernel", "calls": 5, "self_s": 0.03, "total_s": 0.03}],
               "gpu_activity_s": {"kernel": 0.03, "memcpy": 0.01}, "kernel_precision_s": {"fp32": 0.03}}
    write_rank(run, 0, manifest(lifecycle=life, run_id=name), steps, small_samples(t0, gpus), others, [profile])
    return run


def write_lines(path: Path, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        for line in lines:
            handle.write(line + "\n")


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))
