"""Job summary: when the job ran, and how its time split into initialization, training loop and finalization.

Initialization runs from the earliest process start to the first step's start, the training loop
from there to the last step's end, finalization from there to the last shutdown (or, for a process
that was killed, to the last thing it recorded). Unlike the original report, which ended the
training loop at the *start* of the last step, the loop here includes the last step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from otelprof.analysis import ranksummary as rs
from otelprof.analysis.run import RunView
from otelprof.analysis.stats import share
from otelprof.recording import schema

INIT_WARN = 0.2
INIT_MIN_SECONDS = 60.0
"""Initialization is slow above this share of the job and this long."""


@dataclass(frozen=True)
class RankSummary:
    rank: int
    local_rank: int
    node: str
    status: str
    process_start: float | None
    first_step_start: float | None
    last_step_end: float | None
    shutdown: float | None
    steps: int
    skipped_lines: int
    dropped: tuple[tuple[str, float], ...]
    """Records the training process dropped instead of blocking (by exporter), from the manifest."""
    status_basis: str = ""
    """What the status rests on, or why it is unknown (from Prometheus: the process's last scrape)."""
    sigterm: float | None = None
    """When the process got SIGTERM (Unix seconds; the recording's manifest), if it did."""


@dataclass(frozen=True)
class JobSummary:
    run_id: str
    job: str
    otelprof_version: str
    schema_version: str
    world_size: int
    ranks: tuple[RankSummary, ...]
    nodes: tuple[str, ...]
    start: float | None
    """Unix seconds."""
    end: float | None
    duration: float | None
    training_start: float | None
    training_end: float | None
    training_duration: float | None
    initialization: float | None
    finalization: float | None
    initialization_share: float
    training_share: float
    finalization_share: float
    steps_per_phase: tuple[tuple[str, int], ...]
    killed_ranks: tuple[int, ...]
    """Ranks whose recording never reached shutdown (killed, or still running)."""
    skipped_lines: int
    """Truncated or corrupt lines the reader skipped."""
    missing: tuple[str, ...]
    """What this recording lacks that some section needs (no steps, no system samples, ...)."""
    terminated: tuple[tuple[int, float], ...] = ()
    """(rank, Unix seconds) of the ranks that got SIGTERM: evicted, preempted, deleted or stopped."""
    slow_start: bool = field(init=False)
    """Initialization took more than INIT_WARN of the job and more than INIT_MIN_SECONDS."""
    rank_summaries: tuple[rs.RankSummary, ...] = field(init=False)
    """With more than ranksummary.THRESHOLD ranks: steps, first step start and last step end over them."""
    standing_out: tuple[RankSummary, ...] = field(init=False)
    """With more than ranksummary.THRESHOLD ranks: those not finished, that dropped records or whose lines were
    skipped (at most ranksummary.TOP x 2); else every rank."""

    def __post_init__(self) -> None:
        crowded = rs.many(len(self.ranks))
        out = []
        if crowded:
            named = [(f"rank {x.rank}", x) for x in self.ranks]
            out = [rs.summarize(((n, x.steps) for n, x in named), "steps", "count", higher_is_worse=False),
                   rs.summarize(((n, (x.first_step_start or math.nan) - (self.start or 0.0)) for n, x in named),
                                "first step, after the job's start", "seconds"),
                   rs.summarize(((n, (x.last_step_end or math.nan) - (self.start or 0.0)) for n, x in named),
                                "last step end, after the job's start", "seconds", higher_is_worse=False)]
        object.__setattr__(self, "rank_summaries", tuple(out))
        object.__setattr__(self, "standing_out", tuple(
            x for x in self.ranks if x.status != schema.STATUS_FINISHED or x.skipped_lines
            or any(v for _, v in x.dropped))[:rs.TOP * 2] if crowded else self.ranks)
        object.__setattr__(self, "slow_start", self.initialization_share > INIT_WARN
                           and (self.initialization or 0.0) > INIT_MIN_SECONDS)


def _listed(steps_per_phase: dict[str, int], shown: frozenset[str]) -> tuple[tuple[str, int], ...]:
    """The shown phases' step counts by name, then one row adding up the others."""
    listed = sorted((phase, n) for phase, n in steps_per_phase.items() if phase in shown)
    others = [n for phase, n in steps_per_phase.items() if phase not in shown]
    return tuple(listed + ([(f"{len(others):,} other phases", sum(others))] if others else []))


def job_summary(view: RunView) -> JobSummary:
    ranks = []
    steps_per_phase: dict[str, int] = {}
    for index, (rank, info) in enumerate(zip(view.ranks, view.info)):
        life = rank.lifecycle
        for phase, (steps, _) in view.phase_totals(index).items():
            steps_per_phase[phase] = steps_per_phase.get(phase, 0) + steps
        dropped = rank.manifest.get("dropped") or {}
        sigterm = rank.manifest.get(schema.SIGTERM)
        ranks.append(RankSummary(
            rank.rank, info.local_rank, info.node, info.status, life.get("process_start"),
            life.get("first_step_start"), life.get("last_step_end"), life.get("shutdown"),
            len(rank.step_columns), rank.skipped_lines,
            tuple(sorted((str(k), float(v)) for k, v in dropped.items() if isinstance(v, (int, float)))), "",
            float(sigterm) if isinstance(sigterm, (int, float)) and not isinstance(sigterm, bool)
            and math.isfinite(sigterm) else None))
    start, end = view.first_time(), view.last_time()
    firsts = [r.first_step_start for r in ranks if r.first_step_start is not None]
    lasts = [r.last_step_end for r in ranks if r.last_step_end is not None]
    training_start = min(firsts) if firsts else None
    training_end = max(lasts) if lasts else None
    duration = end - start if start is not None and end is not None else None
    training = training_end - training_start if training_start is not None and training_end is not None else None
    init = training_start - start if training_start is not None and start is not None else None
    final = end - training_end if end is not None and training_end is not None else None
    whole = duration or 0.0
    missing = []
    if not view.ranks:
        missing.append("no ranks")
    if not any(len(r.step_columns) for r in view.ranks):
        missing.append("no steps: nothing ran inside otelprof.step() (or the training loop never started)")
    if not any(len(view.samples(i)) for i in range(len(view.ranks))):
        missing.append("no system samples (OTELPROF_SYSTEM_METRICS off, or the process ended at once)")
    elif not view.nodes():
        missing.append("no node samples: no rank sampled the node's CPUs, memory and GPUs")
    elif not any(columns.gpus for _, columns in view.nodes().values()):
        missing.append("no GPU samples (no NVIDIA GPU or NVML library visible)")
    if not any(True for r in view.ranks for _ in r.profiles()):
        missing.append("no operator-profiling windows (otelprof.torch.profile_window or otelprof capture)")
    killed = tuple(r.rank for r in ranks if r.status != schema.STATUS_FINISHED or r.shutdown is None)
    manifest = view.ranks[0].manifest if view.ranks else {}
    return JobSummary(
        view.recording.run_id, view.info[0].job if view.info else "", str(manifest.get("otelprof_version", "")),
        str(manifest.get("schema_version", "")), int(manifest.get("world_size", len(ranks)) or len(ranks)),
        tuple(ranks), tuple(sorted({i.node for i in view.info})), start, end, duration, training_start,
        training_end, training, init, final,
        max(share(init or 0.0, whole), 0.0), max(share(training or 0.0, whole), 0.0),
        max(share(final or 0.0, whole), 0.0), _listed(steps_per_phase, view.shown_phases()), killed,
        view.recording.skipped_lines, tuple(missing),
        tuple((r.rank, r.sigterm) for r in ranks if r.sigterm is not None))
