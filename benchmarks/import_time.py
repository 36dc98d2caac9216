"""What ``import otelprof`` costs in a fresh interpreter: CPU time and ``-X importtime``, optionally side by side
with another checkout (``--against``), the two interleaved with their order alternated.

    python benchmarks/import_time.py                        # this checkout: medians of 5 runs, 3 rounds
    python benchmarks/import_time.py --against ../previous  # and another checkout of otelprof, interleaved

CPU time is the child's user + system time less a bare ``python -c pass``'s; ``-X importtime`` is the
``otelprof`` line's cumulative time (wall clock: on a loaded machine it moves more than CPU time). Also printed:
how many modules the import adds and how many of them are ``otelprof.integrations`` modules.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COUNT = ("import sys; before = set(sys.modules); import otelprof; added = set(sys.modules) - before; "
         "print(len(added), sum(m.startswith('otelprof.integrations') for m in added))")


def _run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, check=True)


def cpu_ms(root: Path) -> float:
    """CPU milliseconds of ``import otelprof`` beyond an interpreter that imports nothing."""
    spent = []
    for code in ("import otelprof", "pass"):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        _run(root, "-c", code)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return (spent[0] - spent[1]) * 1000


def importtime_ms(root: Path) -> float:
    """The cumulative milliseconds ``-X importtime`` gives the ``otelprof`` package."""
    for line in _run(root, "-X", "importtime", "-c", "import otelprof").stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[2].strip() == "otelprof":
            return int(parts[1]) / 1000
    raise RuntimeError("no otelprof line in -X importtime's output")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, help="another checkout of otelprof, measured interleaved")
    parser.add_argument("--runs", type=int, default=5, help="runs per figure (their median)")
    parser.add_argument("--rounds", type=int, default=3, help="figures per checkout")
    options = parser.parse_args()
    roots = [ROOT] + ([options.against.resolve()] if options.against else [])
    for _ in range(options.rounds):
        cpu: dict[Path, list[float]] = {root: [] for root in roots}
        wall: dict[Path, list[float]] = {root: [] for root in roots}
        for run in range(options.runs):
            for root in roots if run % 2 == 0 else roots[::-1]:
                cpu[root].append(cpu_ms(root))
                wall[root].append(importtime_ms(root))
        for root in roots:
            modules, integrations = _run(root, "-c", COUNT).stdout.split()
            print(f"{root}: CPU {statistics.median(cpu[root]):.0f} ms, -X importtime "
                  f"{statistics.median(wall[root]):.0f} ms, {modules} modules ({integrations} integrations)")


if __name__ == "__main__":
    main()
