"""Step time of a training loop while its /metrics and control endpoint are attacked, side by side with the
same loop left alone and with the same attack aimed at another process, in one run.

    python benchmarks/endpoints.py            # about 5 minutes on 2 cores
    python benchmarks/endpoints.py --quick    # about a minute; numbers are rough

One otelprof session serves /metrics and the control endpoint (token set) for the whole run. Each round runs
the instrumented loop once per variant, in an order rotated per round. An attack (``attack.py``, a separate
process) starts before the loop and stops after it; it is aimed either at this process or at a decoy (another
process serving the same endpoints with the same kind of registry). The attacker and the decoy run at nice 19,
so that on a small machine their own CPU use does not stand for what the attack costs the training process:
``-> decoy`` rows show what the attack's clients cost the machine, ``-> trainer`` rows add what serving them
costs the training process.

| attack | what the clients do |
| --- | --- |
| (none) | ``quiet``, and ``quiet (control)``: an A/A control whose spread is the noise floor |
| ``scrapers x8`` | 8 clients asking for /metrics in a loop |
| ``control x8`` | 8 clients sending requests the control endpoint refuses (wrong token, nested JSON, resets) |
| ``idle x300`` | 300 connections that send nothing, reopened as soon as the server closes them |
| ``all`` | all three at once |

Reported per workload: ms per step; the ratio to the same round's ``quiet`` loop and, for an attack on the
trainer, to the same attack on the decoy (medians and q1..q3 over rounds); the training process's CPU time
per step (all its threads, so the servers' work too) and its ratio to ``quiet``, which other tenants of a
shared machine disturb far less than wall time; and per round what the attack got:
scrapes answered, control requests answered, idle connections closed by the server, renderings of the
exposition, refusals counted in ``otelprof.endpoint.errors``, and the training process's thread count.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from overhead import Workload, cnn_workload, median, quartiles, table, tiny_workload

import otelprof
from otelprof import semconv as sc

HERE = Path(__file__).resolve().parent
TOKEN = "benchmark-token"
QUIET, CONTROL = "quiet", "quiet (control)"
MODES = {"scrapers x8": "scrape", "control x8": "control", "idle x300": "idle", "all": "scrape,control,idle"}
DECOY, TRAINER = " -> decoy", " -> trainer"
VARIANTS = [QUIET, CONTROL, *(attack + where for attack in MODES for where in (DECOY, TRAINER))]

DECOY_SOURCE = """
import json, sys, threading, time
import otelprof
session = otelprof.init(job_name="decoy", record_dir=sys.argv[1], metrics_exporters=("prometheus",),
                        prometheus_port=0, control_port=int(sys.argv[2]), control_token=sys.argv[3])
print(json.dumps([session.metrics_address, session.control_address]), flush=True)
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.is_set():
    with otelprof.step():
        for region in ("data", "forward", "backward", "optimizer"):
            with otelprof.annotate(region):
                pass
        otelprof.record("loss", 1.0)
        otelprof.record("samples", 32)
    time.sleep(0.005)
otelprof.shutdown()
"""


@dataclass
class Round:
    step_ns: float
    cpu_ns: float = 0.0
    """CPU time of the whole training process (every thread: the loop, the recorder, the servers) per step."""
    attack: dict[str, int] = field(default_factory=dict)
    renders: int = 0
    refused: float = 0.0
    threads: int = 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def refused_total(session: otelprof.Session) -> float:
    with session.registry.lock:
        counter = session.registry.counter(sc.ENDPOINT_ERRORS)
        return sum(counter.values.values())


Address = tuple[str, int]


def run_round(session: otelprof.Session, decoy: tuple[Address, Address], workload: Workload, steps: int,
              variant: str, renders: list[int]) -> Round:
    attack = variant.removesuffix(DECOY).removesuffix(TRAINER)
    attacker = None
    if attack in MODES:
        assert session.metrics_address is not None and session.control_address is not None
        metrics, control = decoy if variant.endswith(DECOY) else (session.metrics_address, session.control_address)
        attacker = subprocess.Popen(
            [sys.executable, str(HERE / "attack.py"), MODES[attack], "--metrics", f"{metrics[0]}:{metrics[1]}",
             "--control", f"{control[0]}:{control[1]}", "--token", TOKEN],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert attacker.stdout is not None
        assert attacker.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # the clients are at it
    before_renders, before_refused, cpu = renders[0], refused_total(session), time.process_time_ns()
    loop_ns = workload.run(steps, instrumented=True)
    result = Round(loop_ns / steps, (time.process_time_ns() - cpu) / steps, renders=renders[0] - before_renders,
                   threads=threading.active_count())
    if attacker is not None:
        out, _ = attacker.communicate("", timeout=60)
        result.attack = json.loads(out.strip().splitlines()[-1])
    result.refused = refused_total(session) - before_refused
    return result


def compare(workload: Workload, rounds: int, steps: int, session: otelprof.Session, decoy: tuple[Address, Address],
            renders: list[int]) -> dict[str, list[Round]]:
    results: dict[str, list[Round]] = {v: [] for v in VARIANTS}
    workload.run(max(5, steps // 10), instrumented=True)  # warm up
    for r in range(rounds):
        shift = r % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            results[variant].append(run_round(session, decoy, workload, steps, variant, renders))
        print(f"  {workload.name}: round {r + 1}/{rounds}", file=sys.stderr, flush=True)
    return results


def ratios(samples: list[Round], reference: list[Round], cpu: bool = False) -> str:
    values = [s.cpu_ns / r.cpu_ns if cpu else s.step_ns / r.step_ns for s, r in zip(samples, reference)]
    q1, q3 = quartiles(values)
    return f"{median(values):.3f} ({q1:.3f}..{q3:.3f})"


def report(workload: Workload, results: dict[str, list[Round]]) -> str:
    rows = []
    for variant, samples in results.items():
        decoy = results.get(variant.removesuffix(TRAINER) + DECOY) if variant.endswith(TRAINER) else None

        def per_round(key: str, samples: list[Round] = samples) -> str:
            return f"{median([s.attack.get(key, 0) for s in samples]):.0f}"

        rows.append([variant, f"{median([s.step_ns for s in samples]) / 1e6:.3f}", ratios(samples, results[QUIET]),
                     ratios(samples, decoy) if decoy else "", f"{median([s.cpu_ns for s in samples]) / 1e6:.3f}",
                     ratios(samples, results[QUIET], cpu=True), per_round("scrapes"), per_round("control requests"),
                     per_round("idle closed by server"), f"{median([s.renders for s in samples]):.0f}",
                     f"{median([s.refused for s in samples]):.0f}", f"{max(s.threads for s in samples)}"])
    headers = ["variant", "ms/step", "vs quiet (q1..q3)", "vs decoy (q1..q3)", "CPU ms/step", "CPU vs quiet",
               "scrapes", "control req", "idle closed", "renders", "refused", "threads"]
    return f"{workload.name}: {workload.description}\n" + table(headers, rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="rounds per workload (default 6, quick 3)")
    parser.add_argument("--cnn-steps", type=int, default=None, help="CNN steps per loop (default 200, quick 60)")
    parser.add_argument("--tiny-steps", type=int, default=None,
                        help="tiny-model steps per loop (default 3000, quick 1000)")
    parser.add_argument("--only", choices=("cnn", "tiny"), help="one workload")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, help="write every round as JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 6)
    torch.set_num_threads(1)
    workloads = [(cnn_workload(), args.cnn_steps or (60 if args.quick else 200)),
                 (tiny_workload(), args.tiny_steps or (1000 if args.quick else 3000))]
    if args.only:
        workloads = [(w, s) for w, s in workloads if w.name == args.only]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        decoy_process = subprocess.Popen(
            [sys.executable, "-c", "import os; os.nice(19)\n" + DECOY_SOURCE, str(Path(tmp) / "decoy"),
             str(free_port()), TOKEN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert decoy_process.stdout is not None
        decoy_metrics, decoy_control = json.loads(decoy_process.stdout.readline())
        decoy = ((decoy_metrics[0], decoy_metrics[1]), (decoy_control[0], decoy_control[1]))
        session = otelprof.init(job_name="endpoints-bench", record_dir=tmp, metrics_exporters=("prometheus",),
                                prometheus_port=0, control_port=free_port(), control_token=TOKEN)
        assert isinstance(session, otelprof.Session)
        renders = [0]
        session.registry.before_collect(lambda: renders.__setitem__(0, renders[0] + 1))
        try:
            for workload, steps in workloads:
                results = compare(workload, rounds, steps, session, decoy, renders)
                print(report(workload, results) + "\n", flush=True)
                out[workload.name] = {v: [vars(r) for r in rs] for v, rs in results.items()}
        finally:
            otelprof.shutdown()
            decoy_process.communicate("", timeout=30)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
