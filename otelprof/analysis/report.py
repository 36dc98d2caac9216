"""The whole report as data: every section's result, computed from one recording.

:func:`build_report` runs the topic modules in the order of the original profiling report;
:func:`report_dict` turns the result into plain JSON-ready data (``otelprof report --format json``);
:mod:`otelprof.report` renders it as HTML.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otelprof.analysis.batch import BatchSize, batch_size
from otelprof.analysis.bottlenecks import Bottleneck, bottleneck
from otelprof.analysis.check_recording import prepare_rank, prepare_sections
from otelprof.analysis.dataloader import DataLoaderAnalysis, dataloader_analysis
from otelprof.analysis.device import DeviceAnalysis, device_analysis
from otelprof.analysis.diagnosis import Diagnosis, diagnose, pending
from otelprof.analysis.environment import Environment, recording_environment
from otelprof.analysis.framework import FrameworkSummary, framework_summary
from otelprof.analysis.gpu import GpuAnalysis, gpu_analysis
from otelprof.analysis.layers import LayerHeatmap, layer_heatmap
from otelprof.analysis.loadbalance import LoadBalance, load_balance
from otelprof.analysis.progress import Progress, no_progress
from otelprof.analysis.progress import progress as training_progress
from otelprof.analysis.rules import RulesSummary, rules_summary_later, skipped_rules
from otelprof.analysis.run import RunView
from otelprof.analysis.steps import StepAnalysis, step_analysis
from otelprof.analysis.summary import JobSummary, job_summary
from otelprof.analysis.system import SystemUsage, system_usage
from otelprof.mixin.config import MixinConfig
from otelprof.recording.ranks import Recording
from otelprof.recording.reader import read_recording

FORMAT_VERSION = 1
ORIGIN_RECORDING = "recording"
ORIGIN_PROMETHEUS = "prometheus"


@dataclass(frozen=True)
class Report:
    format_version: int
    source: str
    """The recording's directory, or the Prometheus URL."""
    generated: float
    """Unix seconds."""
    summary: JobSummary
    system: SystemUsage
    framework: FrameworkSummary
    rules: RulesSummary
    steps: StepAnalysis
    gpus: GpuAnalysis
    batch: BatchSize
    cpu_bottleneck: Bottleneck
    io_bottleneck: Bottleneck
    load: LoadBalance
    dataloader: DataLoaderAnalysis
    notes: tuple[str, ...] = ()
    origin: str = ORIGIN_RECORDING
    """Where the figures come from: ORIGIN_RECORDING (every step, region and operator window) or
    ORIGIN_PROMETHEUS (metrics only: histograms at bucket resolution, counters, gauges)."""
    environment: Environment = dataclasses.field(default_factory=lambda: Environment((), ()))
    """Instance type, GPUs, driver, CUDA, PyTorch, Python, OS: per rank and node."""
    progress: Progress = dataclasses.field(default_factory=no_progress)
    """Loss, learning rate and throughput over the steps; step time over the run."""
    device: DeviceAnalysis = dataclasses.field(default_factory=DeviceAnalysis)
    """Device (CUDA event) time beside host time, and model FLOPs / MFU (recordings only)."""
    diagnosis: Diagnosis = dataclasses.field(default_factory=pending)
    """The findings ranked by what they cost, from the sections above (made when the report is built)."""
    layers: LayerHeatmap = dataclasses.field(default_factory=LayerHeatmap)
    """Per-layer norms over the saved steps of the tensor collections, and the layers the tensor checks named."""

    def __post_init__(self) -> None:
        if not self.diagnosis.headline:
            object.__setattr__(self, "diagnosis", diagnose(
                self.rules, self.summary, self.framework, self.steps, self.dataloader, self.load, self.gpus,
                self.system, self.cpu_bottleneck, self.io_bottleneck, self.batch,
                None if self.origin == ORIGIN_PROMETHEUS else self.device))


def load(path: str | Path, progress: Callable[[str], None] | None = None,
         ranks_done: Callable[[int, int], None] | None = None, checks: bool = True) -> Recording:
    """Read a recording with its samples, telling ``progress`` how far a long load is (and ``ranks_done`` how many
    ranks are read); what the sections (and with ``checks`` the offline checks) compute per rank is computed
    while parsing (:func:`~otelprof.analysis.check_recording.prepare_rank`)."""
    started = time.monotonic()
    last = [0.0]

    def bytes_done(done: int, total: int) -> None:
        now = time.monotonic()
        if progress is not None and total > 32 * 2**20 and (now - last[0] > 1.0 or done == total):
            last[0] = now
            progress(f"reading {Path(path).name}: {done / 2**20:,.0f} of {total / 2**20:,.0f} MiB "
                     f"({now - started:.0f} s)")

    return read_recording(path, samples=True, regions=True, progress=bytes_done, ranks_done=ranks_done,
                          prepare=prepare_rank if checks else prepare_sections)


def build_report(recording: Recording, config: MixinConfig | None = None, check_interval: float | None = None,
                 progress: Callable[[str], None] | None = None, checks: bool = True) -> Report:
    config = config or MixinConfig()
    view = RunView(recording, progress)
    if checks:  # started first: on long runs they go on in another process beside the analyses below
        duration = job_summary(view).duration
        view.say(f"offline checks ({duration or 0:.0f} s of run)")
        rules_later = rules_summary_later(recording, duration, config, check_interval)
    system = system_usage(view)
    environment = recording_environment(view)
    curves = training_progress(view)
    view.say("framework summary")
    framework = framework_summary(view)
    steps = step_analysis(view)
    view.say("GPU, batch size, bottlenecks, load balance, data loader")
    gpus = gpu_analysis(view, config)
    cpu = bottleneck(view, "cpu", config)
    io = bottleneck(view, "io", config)
    load_ = load_balance(view, config)
    loader = dataloader_analysis(view, config)
    if checks:
        view.say("offline checks: collecting the results")
        rules = rules_later()
    else:
        rules = skipped_rules("the checks were not evaluated for this report (--no-checks); otelprof check RUN_DIR "
                              "evaluates them")
    summary = job_summary(view)  # again: the checks' reads count skipped lines too
    notes = []
    if summary.skipped_lines:
        notes.append(f"{summary.skipped_lines} truncated or corrupt lines of the recording were skipped "
                     "(a process killed while writing leaves one).")
    return Report(FORMAT_VERSION, str(recording.path), time.time(), summary, system, framework, rules, steps, gpus,
                  batch_size(system, gpus, steps, config), cpu, io, load_, loader, tuple(notes), ORIGIN_RECORDING,
                  environment, curves, device_analysis(view), layers=layer_heatmap(recording))


def report_dict(report: Report) -> dict[str, Any]:
    """JSON-ready data: dataclasses as objects, tuples as lists, NaN and infinities as null."""
    return dict(_clean(dataclasses.asdict(report)))


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value
