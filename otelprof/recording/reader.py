"""The only parser of run recordings: :func:`read_recording` (a run or one rank, large runs in several
processes), :func:`read_rank`, :func:`latest_run`.

Tolerant of a killed writer and safe on hostile files: a truncated, corrupt or oversized line is
skipped and counted, never fatal (limits in :mod:`otelprof.recording.limits`); a manifest that is not
what the writer writes, an unknown schema major version, or a recording file that is not a regular
file is a :class:`RecordingError` (one line for the user). The parsed recording is a
:class:`Recording` of :class:`RankRecording` (:mod:`otelprof.recording.ranks`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from otelprof.recording import schema
from otelprof.recording.errors import RecordingError
from otelprof.recording.files import blocks, check_file, reason
from otelprof.recording.limits import MAX_LINE_BYTES
from otelprof.recording.manifest import read_manifest
from otelprof.recording.ranks import RankRecording, Recording
from otelprof.recording.samples import parse_samples
from otelprof.recording.steps import read_steps

__all__ = ["RankRecording", "Recording", "RecordingError", "latest_run", "read_rank", "read_recording"]


def read_rank(path: Path) -> RankRecording:
    """Parse one rank directory (``rank-<n>/``)."""
    path = Path(path)
    rank = RankRecording(path, read_manifest(path))
    for name in (schema.STEPS, schema.SPANS, schema.METRICS, schema.SAMPLES, schema.PROFILES):
        check_file(path / name)
    steps = path / schema.STEPS
    if not os.path.lexists(steps):
        return rank
    try:
        for text, over in blocks(steps, MAX_LINE_BYTES[schema.STEPS]):
            rank.skipped_lines += over
            read_steps(rank, text)
    except OSError as exc:
        raise RecordingError(f"cannot read {steps}: {reason(exc)}") from exc
    return rank


def read_recording(path: str | Path, *, samples: bool = False, workers: int | None = None,
                   progress: Callable[[int, int], None] | None = None, regions: bool = False,
                   ranks_done: Callable[[int, int], None] | None = None,
                   only: Collection[int] | None = None,
                   prepare: Callable[[RankRecording], None] | None = None) -> Recording:
    """Parse a run directory (``<run-id>/`` with ``rank-*/``) or a single rank directory.

    ``samples`` also parses every rank's samples.jsonl into :meth:`RankRecording.sample_columns`;
    ``regions`` also totals each rank's regions (:meth:`StepColumns.summarize_regions`) while parsing.
    Large recordings are parsed by ``workers`` processes (default: one per CPU when the files add up
    to more than 64 MiB); ``progress(done_bytes, total_bytes)`` is called as files are done, ``ranks_done(done,
    total)`` as ranks are (all their files parsed). ``only`` reads just those ranks of a run (by their
    ``rank-<n>`` directories); none of them there is a :class:`RecordingError`. ``prepare(rank)`` is called on
    each rank once its files are parsed, in the parsing process (a module-level function: it is sent there by
    name; each rank is then one job, its steps and samples together), to compute what the rank's columns cache
    for the analyses beside the parsing."""
    root = Path(path)
    if not root.is_dir():
        raise RecordingError(f"{root} is not a directory")
    if (root / schema.MANIFEST).exists():
        rank_dirs = [root]
    else:
        rank_dirs = sorted((p for p in root.glob("rank-*") if p.is_dir()), key=lambda p: _rank_number(p.name))
        if not rank_dirs:
            raise RecordingError(f"{root} holds no rank-*/ directories: not an otelprof recording")
        if only is not None:
            rank_dirs = [p for p in rank_dirs if _rank_number(p.name) in only]
            if not rank_dirs:
                raise RecordingError(f"{root} holds none of the ranks asked for")
    steps_job = "steps+regions" if regions else "steps"
    kinds = (steps_job, "samples") if samples else (steps_job,)
    if samples and prepare is not None:
        steps_job += "+samples"
        kinds = (steps_job,)
    jobs = [(p, kind, prepare) for p in rank_dirs for kind in kinds]
    sizes = {job: (_size(job[0] / schema.SAMPLES) if "samples" in job[1] else 0)
             + (_size(job[0] / schema.STEPS) if job[1] != "samples" else 0) for job in jobs}
    total = sum(sizes.values())
    if workers is None:
        workers = min(os.cpu_count() or 1, len(jobs)) if total > PARALLEL_BYTES else 1
    if "fork" not in _start_methods():
        workers = 1
    results: dict[tuple[Path, str, Any], Any] = {}
    done = 0
    left = {p: len(kinds) for p in rank_dirs}

    def finished(job: tuple[Path, str, Any]) -> None:
        left[job[0]] -= 1
        if ranks_done is not None and not left[job[0]]:
            ranks_done(sum(1 for n in left.values() if not n), len(left))

    if workers <= 1:
        for job in jobs:
            results[job] = _job(job)
            done += sizes[job]
            finished(job)
            if progress is not None:
                progress(done, total)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = {pool.submit(_job, job): job for job in sorted(jobs, key=lambda j: -sizes[j])}
            for future in as_completed(futures):
                job = futures[future]
                results[job] = future.result()
                done += sizes[job]
                finished(job)
                if progress is not None:
                    progress(done, total)
    ranks = []
    seen: dict[int, Path] = {}
    for p in rank_dirs:
        rank: RankRecording = results[(p, steps_job, prepare)]
        if rank.rank in seen:
            raise RecordingError(f"{seen[rank.rank]} and {p} both hold rank {rank.rank}: not one run's recording")
        seen[rank.rank] = p
        if "samples" in kinds:
            rank.add_sample_columns(results[(p, "samples", prepare)])
        ranks.append(rank)
    return Recording(root, ranks)


PARALLEL_BYTES = 64 * 2**20
"""Recordings larger than this are parsed by several processes."""


def _job(job: tuple[Path, str, Callable[[RankRecording], None] | None]) -> Any:
    path, kind, prepare = job
    if kind == "samples":
        return parse_samples(path / schema.SAMPLES)
    rank = read_rank(path)
    if kind.startswith("steps+regions"):
        rank.step_columns.summarize_regions()
    if kind.endswith("+samples"):
        rank.add_sample_columns(parse_samples(path / schema.SAMPLES))
    if prepare is not None:
        prepare(rank)
    return rank


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _start_methods() -> list[str]:
    import multiprocessing

    return list(multiprocessing.get_all_start_methods())


def _rank_number(name: str) -> int:
    try:
        return int(name.split("-", 1)[1])
    except (IndexError, ValueError):
        return 1 << 30


def latest_run(record_dir: str | Path) -> Path | None:
    """The most recently modified run directory under ``record_dir``."""
    root = Path(record_dir)
    if not root.is_dir():
        return None
    runs = [p for p in root.iterdir() if p.is_dir() and any(p.glob("rank-*/manifest.json"))]
    return max(runs, key=lambda p: p.stat().st_mtime, default=None)
