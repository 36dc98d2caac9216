"""One training process of the verdict suite (tests/test_verdicts.py): a steady loop with one injected fault.

``python tests/verdict_job.py '<json>'`` with keys ``duration`` (seconds of the loop), ``compute`` (seconds a
step computes), ``fault`` (one of :data:`FAULTS` or null), ``at`` (seconds into the loop when it starts)
and the fault's own keys. The ranks of a job of several processes (``WORLD_SIZE`` > 1) meet at the end of
every step, inside a ``collective`` region, as DDP's gradient all-reduce makes them meet: the fast ranks
wait there for a straggler. A step's compute is mostly waiting (as a host waits for its GPU) plus a little
CPU work, so a busy neighbour makes it jitter as real steps do. Each line on stdout is a JSON event.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import otelprof
from otelprof import semconv as sc

FAULTS = ("slow_loader", "straggler", "leak", "slow_init", "nan", "stall", "plateau", "outliers")


def _say(event: str, **data: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **data}), flush=True)


def _compute(seconds: float) -> None:
    """``seconds`` of a step: a twentieth busy on the CPU, the rest waiting."""
    busy_until = time.perf_counter() + seconds * 0.05
    while time.perf_counter() < busy_until:
        pass
    time.sleep(seconds * 0.95)


class Meeting:
    """The ranks of a job meet once per step: rank 0 hears from every other rank, then answers them all
    with whether to go on (its clock ends the loop for everyone, so no rank waits for a peer that left)."""

    def __init__(self, rank: int, world: int, port: int) -> None:
        self.rank = rank
        self.peers: list[Connection] = []
        address = ("127.0.0.1", port)
        if rank == 0:
            with Listener(address) as listener:
                self.peers = [listener.accept() for _ in range(world - 1)]
            return
        deadline = time.monotonic() + 120
        while True:
            try:
                self.peers = [Client(address)]
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def go_on(self, wanted: bool) -> bool:
        if self.rank == 0:
            for peer in self.peers:
                peer.recv_bytes()
            for peer in self.peers:
                peer.send_bytes(b"1" if wanted else b"0")
            return wanted
        self.peers[0].send_bytes(b"")
        return self.peers[0].recv_bytes() == b"1"


def main() -> None:
    spec = json.loads(sys.argv[1])
    fault = spec.get("fault")
    duration, compute, at = float(spec["duration"]), float(spec.get("compute", 0.1)), float(spec.get("at", 0.0))
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    session = otelprof.init()
    meeting = Meeting(rank, world, int(os.environ["MASTER_PORT"])) if world > 1 else None
    _say("ready", metrics=session.metrics_address if isinstance(session, otelprof.Session) else None)
    slowdown = float(spec.get("slowdown", 1.0)) if fault == "straggler" and rank == spec.get("straggler") else 1.0
    rng = random.Random(rank)
    leak: list[bytes] = []
    if fault == "slow_init":
        with otelprof.annotate("initialization"):
            time.sleep(float(spec["init_delay"]))
    started = time.time()
    step = 0
    stalled = False
    going = True
    while going:
        elapsed = time.time() - started
        faulty = fault is not None and elapsed > at
        with otelprof.step():
            with otelprof.annotate(sc.REGION_DATALOADER):
                time.sleep(3 * compute if faulty and fault == "slow_loader" else 0.001)
            with otelprof.annotate("forward"):
                spike = faulty and fault == "outliers" and step % int(spec.get("every", 25)) == 0
                _compute(compute * slowdown * (float(spec.get("spike", 4)) if spike else 1))
            if faulty and fault == "stall" and not stalled:
                stalled = True
                _say("stalled")
                time.sleep(max(duration - elapsed, 0.0))  # hangs inside the step, as on a lost peer
            if fault == "plateau":
                loss = 1.0 + rng.uniform(-0.01, 0.01)
            else:
                loss = 2.0 * math.exp(-step * compute / 10) + rng.uniform(-0.01, 0.01)  # -1/e every 10 s
            otelprof.record("loss", math.nan if faulty and fault == "nan" else loss)
            if meeting is not None:
                with otelprof.annotate(sc.REGION_COLLECTIVE):
                    going = meeting.go_on(time.time() - started < duration)
            else:
                going = time.time() - started < duration
        if faulty and fault == "leak":
            leak.append(b"\x01" * int(spec["leak_per_step"]))  # written, so resident
        step += 1
    _say("done", steps=step, leaked=sum(map(len, leak)))
    otelprof.shutdown()


if __name__ == "__main__":
    main()
