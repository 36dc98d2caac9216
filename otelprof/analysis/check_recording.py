"""A recording's ranks as the offline checks read them: the reader's columns into sample and step tables, each
step's outlier cost as the recorder's judge found it, and :func:`rank_data`, one rank's whole view."""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress

from otelprof import semconv as sc
from otelprof.analysis.check_tables import RankData, SampleTable, StepTable
from otelprof.analysis.rank_figures import NodeColumns, prepare_figures
from otelprof.analysis.run import gpu_min
from otelprof.analysis.steps import compiled_steps, profiled_windows
from otelprof.analysis.system import gpu_memory_ratios
from otelprof.mixin.config import MixinConfig
from otelprof.recording.columns import SampleColumns, group_indexes
from otelprof.recording.ranks import RankRecording
from otelprof.shared import collectives
from otelprof.shared.outliers import StepJudge, in_windows


def _sample_table(rank: RankRecording, config: MixinConfig, node: NodeColumns | None = None) -> SampleTable:
    """Node samples from the reader's columns: per-CPU maxima and means, not 64-value tuples. Kept with the
    columns per thresholds (:func:`prepare_rank` makes it while the recording is parsed, with the ``node``
    columns the figures derived)."""
    columns = rank.sample_columns()
    key = (config.cpu_threshold, config.io_threshold, config.gpu_threshold)
    cached: dict[tuple[float, float, float], tuple[int, SampleTable]] = columns.__dict__.setdefault(
        "_check_samples", {})
    found = cached.get(key)
    if found is None or found[0] != len(columns):
        found = cached[key] = (len(columns), _build_sample_table(columns, config, node))
    return found[1]


def _build_sample_table(columns: SampleColumns, config: MixinConfig, derived: NodeColumns | None = None
                        ) -> SampleTable:
    # a node rank: every sample a node sample (a NaN maximum: a process-only sample)
    every = len(columns.cpu_max) == len(columns) and math.isfinite(sum(columns.cpu_max))
    node = [] if every else list(map(operator.eq, columns.cpu_max, columns.cpu_max))
    every = every or (len(node) == len(columns) and False not in node)
    nan = array("d", [math.nan]) * len(columns)

    def kept(values: Sequence[float] | None) -> Sequence[float]:
        values = nan if values is None else values
        return values if every else list(compress(values, node))

    gpus = columns.gpus
    memory = gpu_memory_ratios(columns) if derived is None else derived.memory
    lowest = None
    if gpus and any("u" in g for g in gpus.values()):
        lowest = kept(gpu_min(columns) if derived is None else derived.lowest)
    util = {str(index): kept(g.get("u")) for index, g in gpus.items()}
    ratios = {str(index): kept(memory.get(index)) for index in gpus}
    seconds = list(map((1e9).__rtruediv__, columns.t_ns))  # t / 1e9
    return SampleTable.build(seconds if every else list(compress(seconds, node)), kept(columns.cpu_max),
                             kept(columns.cpu_mean), kept(columns.iow_max),
                             {g: v for g, v in util.items() if any(map(operator.eq, v, v))},
                             {g: v for g, v in ratios.items() if any(map(operator.eq, v, v))}, config,
                             (seconds, columns.rss), kept(columns.mem),
                             kept(columns.container_memory), kept(columns.container_limit), lowest)


@dataclass(frozen=True)
class OutlierSettings:
    """How the recorder flagged outlier steps (``OTELPROF_OUTLIER_*``)."""

    sigma: float
    min_steps: int
    min_ratio: float
    min_excess: float

    @staticmethod
    def of(recorded: Mapping[str, object], config: MixinConfig) -> OutlierSettings:
        """The settings a recording carries in its manifest, else the mixin config's (older recordings)."""
        def get(key: str, default: float) -> float:
            value = recorded.get(key)
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default

        return OutlierSettings(get("outlier_sigma", config.step_outlier_sigma), int(get("outlier_min_steps", 20)),
                               get("outlier_min_ratio", config.step_outlier_min_ratio),
                               get("outlier_min_excess", config.step_outlier_min_excess))


def prepare_rank(rank: RankRecording) -> None:
    """What the checks and the report's sections both compute from a rank's steps, computed once where the rank
    is parsed (``read_recording(prepare=...)``: beside the parsing, in its processes) and kept with its columns:
    the collectives' union per step and the checks' step and sample tables (with the settings of the recording
    and the default mixin config; other settings compute theirs when asked)."""
    config = MixinConfig()
    collectives.of_columns(rank.step_columns)  # prepare_sections, with the node columns the figures derive
    node = prepare_figures(rank)
    _step_table(rank, OutlierSettings.of(rank.manifest.get("config") or {}, config))
    _sample_table(rank, config, node)


def prepare_sections(rank: RankRecording) -> None:
    """What :func:`prepare_rank` computes for the report's sections only (a report without the checks)."""
    collectives.of_columns(rank.step_columns)
    prepare_figures(rank)


def _step_table(rank: RankRecording, outlier: OutlierSettings) -> StepTable:
    """Steps from the reader's columns: a million Step objects with their annotations would cost ~25 s here.
    Kept with the columns per outlier settings (:func:`prepare_rank` makes it while the recording is parsed)."""
    columns = rank.step_columns
    cached: dict[OutlierSettings, tuple[int, StepTable]] = columns.__dict__.setdefault("_check_steps", {})
    found = cached.get(outlier)
    if found is None or found[0] != len(columns):
        found = cached[outlier] = (len(columns), _build_step_table(rank, outlier))
    return found[1]


def _build_step_table(rank: RankRecording, outlier: OutlierSettings) -> StepTable:
    columns = rank.step_columns
    seconds = (1e9).__rtruediv__  # t / 1e9
    start = list(map(seconds, columns.start_ns))
    end = list(map(seconds, map(operator.add, columns.start_ns, columns.duration_ns)))
    return StepTable.build(columns.phase_names, columns.phase, start, end,
                           list(map(seconds, columns.annotation_sums(sc.REGION_DATALOADER))),
                           list(map(seconds, collectives.of_columns(columns)[1])),  # exposed communication
                           outlier_costs(rank, outlier), columns.scalar("loss"), columns.scalar("grad_norm"))


def outlier_costs(rank: RankRecording, outlier: OutlierSettings) -> dict[int, list[float]]:
    """Per phase code, each step's cost as the recorder's outlier judge finds it (:class:`StepJudge`, fed the
    same steps in the same order, per token or sample where recorded; 0.0: no outlier). Steps of a profiling
    window and the few after it are not judged, nor steps during which torch.compile compiled, as in the recorder."""
    columns = rank.step_columns
    units: dict[int, float] = {}
    for name in (sc.SCALAR_SAMPLES, sc.SCALAR_TOKENS):  # tokens win over samples (written last)
        at, values = columns.scalar(name)
        units.update((i, v) for i, v in zip(at, values) if v > 0 and math.isfinite(v))
    slowed = profiled_windows(rank)
    compiled = compiled_steps(columns)
    number, duration = columns.number, columns.duration_ns
    costs: dict[int, list[float]] = {}
    for code, steps in group_indexes(columns.phase).items():
        windows = slowed.get(columns.phase_names[code])
        judged = [i for i in steps if not in_windows(number[i], windows)] if windows else steps
        if compiled is not None:
            judged = [i for i in judged if not compiled[i]]
        judge = StepJudge(outlier.sigma, outlier.min_steps, outlier.min_ratio, outlier.min_excess)
        found = judge.observe_all([duration[i] / 1e9 for i in judged], list(map(units.get, judged)))
        if len(judged) < len(steps):  # 0.0 for the steps otelprof slowed
            by_step = dict(zip(judged, found))
            found = [by_step.get(i, 0.0) for i in steps]
        costs[code] = found
    return costs


def rank_data(rank: RankRecording, config: MixinConfig | None = None) -> RankData:
    """The checks' view of one rank's recording."""
    manifest = rank.manifest
    resource = manifest.get("resource") or {}
    recorded = manifest.get("config") or {}
    life = rank.lifecycle
    config = config or MixinConfig()
    steps = _step_table(rank, OutlierSettings.of(recorded, config))
    samples = _sample_table(rank, config)
    first_start = rank.step_columns.start_ns[0] / 1e9 if len(steps) else None
    last_sample = samples.times[-1] if samples.times else None
    times = [x for x in (life.get("shutdown"), life.get("last_step_end"), last_sample) if x is not None]
    start = float(life.get("process_start") or (first_start if first_start is not None else last_sample or 0.0))
    first_sample = samples.times[0] if samples.times else None
    # A clock stepped back between the process start and its data: the run starts at its first data.
    start = min(x for x in (start, first_start, first_sample) if x is not None)
    return RankData(str(resource.get(sc.SERVICE_NAME, "")), rank.rank,
                    str(resource.get(sc.K8S_NODE_NAME) or resource.get(sc.HOST_NAME, "")), start,
                    max(times) if times else start, sample_table=samples, step_table=steps,
                    first_step=float(began) if isinstance(began := life.get("first_step_start"), int | float)
                    else first_start)
