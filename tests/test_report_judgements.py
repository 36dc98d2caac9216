"""The judgements the report shows are made by the analysis, not while rendering: each flag or pick of the result
dataclasses against figures the test's own recording fixes (see test_report_fixtures for ``small_run``)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from otelprof import semconv as sc
from otelprof.analysis import dataloader as dl
from otelprof.analysis import framework as fw
from otelprof.analysis import gpu as gpumod
from otelprof.analysis import loadbalance as lb
from otelprof.analysis import summary as summod
from otelprof.analysis.report import Report, build_report, load
from otelprof.analysis.stats import BoxPlot
from otelprof.mixin import MixinConfig
from otelprof.recording import schema
from tests.test_report_fixtures import T0, manifest, ns, small_run, small_samples, small_steps, step_line, write_rank

approx = pytest.approx


def report_of(run: Path, config: MixinConfig | None = None) -> Report:
    return build_report(load(run), config, checks=False)


def one_rank(tmp_path: Path, steps: list[dict[str, Any]], samples: list[dict[str, Any]] = (),  # type: ignore[assignment]
             profiles: list[dict[str, Any]] = (), process_start: float = T0,  # type: ignore[assignment]
             name: str = "run") -> Path:
    """A finished rank 0 whose lifecycle spans the process start to 1 s after its last step."""
    run = tmp_path / name
    first = steps[0]["t"] / 1e9
    last = max(s["t"] + s["d"] for s in steps) / 1e9
    life = {"process_start": process_start, "first_step_start": first, "last_step_end": last, "shutdown": last + 1}
    write_rank(run, 0, manifest(lifecycle=life, run_id=name), steps, samples, profiles=profiles)
    return run


def test_slow_start_needs_both_a_large_share_of_the_job_and_a_minute(tmp_path: Path) -> None:
    quick = report_of(small_run(tmp_path)).summary  # 10 s before the first step: 55 % of the job, under a minute
    assert quick.initialization_share > summod.INIT_WARN and not quick.slow_start
    # 100 s before the first step of a 2.5 s loop
    late = report_of(one_rank(tmp_path, small_steps(T0 + 90), name="late")).summary
    assert late.initialization == approx(100.0) and late.initialization_share > summod.INIT_WARN
    assert late.slow_start
    # the same wait before a long loop is a small share of the job
    long_steps = [step_line("train", n, T0 + 100 + 2.0 * n, 2.0) for n in range(400)]
    long = report_of(one_rank(tmp_path, long_steps, name="long")).summary
    assert long.initialization == approx(100.0) and long.initialization_share < summod.INIT_WARN
    assert not long.slow_start


def test_time_between_steps_is_judged_against_its_threshold(tmp_path: Path) -> None:
    assert not report_of(small_run(tmp_path)).framework.between_steps_high  # a 0.1 s gap in a 3.25 s loop
    gaps = [step_line("train", n, T0 + 10 + 1.0 * n, 0.5) for n in range(10)]  # 0.5 s steps, 0.5 s apart
    f = report_of(one_rank(tmp_path, gaps, name="gaps")).framework
    assert f.between_steps_share == approx(4.5 / 9.5) and f.between_steps_high
    assert fw.BETWEEN_STEPS_WARN < 4.5 / 9.5


def test_an_unusual_forward_backward_ratio_names_the_heavier_pass(tmp_path: Path) -> None:
    usual = report_of(small_run(tmp_path)).framework  # forward 0.7 s, backward 0.8 s
    assert usual.heavier_pass == "" and usual.heavier_pass_share == approx(0.8 / 1.5)
    steps = [step_line("train", n, T0 + 10 + 0.1 * n, 0.1, [("forward", 0.0, 0.01, 0), ("backward", 0.01, 0.08, 0)])
             for n in range(10)]
    f = report_of(one_rank(tmp_path, steps, name="heavy")).framework
    assert (f.heavier_pass, f.heavier_pass_share) == ("backward", approx(0.08 / 0.09))
    steps = [step_line("train", n, T0 + 10 + 0.1 * n, 0.1, [("forward", 0.0, 0.05, 0)]) for n in range(10)]
    forward_only = report_of(one_rank(tmp_path, steps, name="forward-only")).framework
    assert forward_only.heavier_pass == "" and math.isnan(forward_only.heavier_pass_share)  # no backward to weigh


def test_nested_is_set_when_a_region_holds_another(tmp_path: Path) -> None:
    assert not report_of(small_run(tmp_path)).framework.nested
    steps = [step_line("train", n, T0 + 10 + 0.1 * n, 0.1, [("forward", 0.0, 0.06, 0), ("attention", 0.01, 0.02, 1)])
             for n in range(10)]
    f = report_of(one_rank(tmp_path, steps, name="nested")).framework
    forward = next(r for r in f.regions if r.name == "forward")
    assert forward.self_time == approx(0.4) and f.nested


def test_uncovered_step_time_is_flagged_per_phase(tmp_path: Path) -> None:
    f = report_of(small_run(tmp_path)).framework
    train, evaluation = f.breakdown("train"), f.breakdown("eval")
    assert train is not None and evaluation is not None
    # train: 2.9 s of steps, 2.68 s in regions; eval: 0.25 s of steps, 0.15 s in regions
    assert train.part(fw.UNCOVERED) == approx(0.22) and not train.uncovered_high
    assert evaluation.part(fw.UNCOVERED) == approx(0.1) and evaluation.uncovered_high


def test_operator_time_past_the_named_ones_adds_up_to_other(tmp_path: Path) -> None:
    assert report_of(small_run(tmp_path)).framework.cpu_operators_other == approx(0.0)  # 2 operators, both named
    ops = [{"name": f"aten::op{i}", "calls": 1, "self_s": 0.01 * (i + 1), "total_s": 0.01 * (i + 1)}
           for i in range(fw.TOP_OPERATORS + 3)]
    profile = {"start_step": 1, "num_steps": 2, "t": ns(T0 + 10.1), "d": ns(0.2), "cpu_ops": ops,
               "gpu_ops": ops[:2]}
    steps = [step_line("train", n, T0 + 10 + 0.1 * n, 0.1) for n in range(10)]
    f = report_of(one_rank(tmp_path, steps, profiles=[profile], name="ops")).framework
    assert f.cpu_operators_other == approx(0.01 + 0.02 + 0.03)  # the three smallest
    assert f.gpu_operators_other == approx(0.0)


def memory_samples(n: int = 30) -> list[dict[str, Any]]:
    """GPU 0 steady at 2 of 8 GB; GPU 1 climbing from 0.5 to 7.75 of 8 GB, 0.25 GB per sample."""
    out = []
    for i in range(n):
        sample = small_samples(T0 + 0.5 * i)[0]
        sample["gpu"] = {"0": {"u": 0.5, "mu": 2e9, "mt": 8e9}, "1": {"u": 0.5, "mu": 0.5e9 + 0.25e9 * i, "mt": 8e9}}
        out.append(sample)
    return out


def test_gpu_memory_flags(tmp_path: Path) -> None:
    run = one_rank(tmp_path, small_steps(), memory_samples())
    steady, climbing = report_of(run).gpus.gpus
    assert steady.memory.p95 == approx(0.25) and steady.memory_flags == gpumod.MemoryFlags(True, False, False, False)
    # 0.0625 .. 0.96875 of the device: swings, grows by (mean of the last 3 - the first 3) = 27 * 0.25 / 8
    assert climbing.memory_growth == approx(27 * 0.25 / 8) and climbing.memory.max == approx(7.75 / 8)
    assert climbing.memory_flags == gpumod.MemoryFlags(low=False, swinging=True, growing=True, full=True)
    # growth and capacity are the GPUMemoryIncrease and near-capacity thresholds of the config
    lenient = MixinConfig(gpu_memory_increase=0.9, gpu_memory_capacity_threshold=0.99)
    _, judged = report_of(run, lenient).gpus.gpus
    assert judged.memory_flags == gpumod.MemoryFlags(low=False, swinging=True, growing=False, full=False)


def test_the_batch_chart_boxes_come_with_the_batch_analysis(tmp_path: Path) -> None:
    report = report_of(small_run(tmp_path))
    [(node, box)] = report.batch.node_cpu
    assert node == "n1" and box == BoxPlot.of(report.system.nodes[0].cpu.mean)
    assert (box.count, box.min, box.median, box.max) == (10, approx(0.1), approx(0.55), approx(1.0))  # 0.1 .. 1.0


def gpu_samples(utilizations: list[list[float]]) -> list[dict[str, Any]]:
    """Per sample, one utilization per GPU (memory steady)."""
    out = []
    for i, row in enumerate(utilizations):
        sample = small_samples(T0 + 0.5 * i)[0]
        sample["gpu"] = {str(g): {"u": u, "mu": 1e9, "mt": 8e9} for g, u in enumerate(row)}
        out.append(sample)
    return out


def test_load_balance_lists_the_farthest_pairs_and_judges_the_spread(tmp_path: Path) -> None:
    alike = report_of(one_rank(tmp_path, small_steps(), gpu_samples([[0.5, 0.5]] * 10), name="alike")).load
    assert alike.far_pairs == 0 and alike.spread == approx(0.0) and not alike.uneven
    assert [d.distance for d in alike.farthest] == [0.0]
    # six GPUs, GPU g always at 0.1 * g + 0.3: every pair disjoint (distance sqrt(ln 2)), spread 0.5
    six = report_of(one_rank(tmp_path, small_steps(), gpu_samples([[0.1 * g + 0.3 for g in range(6)]] * 10),
                             name="six")).load
    assert six.far_pairs == 15 and six.spread == approx(0.5) and six.uneven
    assert len(six.farthest) == lb.MAX_FARTHEST and all(d.distance == approx(math.sqrt(math.log(2)))
                                                        for d in six.farthest)
    # the spread alone, and pairs farthest first (a pair without a distance left out)
    spread_only = dataclasses.replace(alike, spread=alike.threshold + 0.01)
    assert spread_only.far_pairs == 0 and spread_only.uneven
    far_first = dataclasses.replace(alike, distances=(lb.GpuDistance("a", "b", 0.1), lb.GpuDistance("a", "c", math.nan),
                                                      lb.GpuDistance("b", "c", 0.7)))
    assert [d.distance for d in far_first.farthest] == [0.7, 0.1] and far_first.far_pairs == 1


def test_the_loader_waiting_most_is_named_above_its_threshold(tmp_path: Path) -> None:
    stalled = report_of(small_run(tmp_path)).dataloader  # train waits 1.28 s of 2.9 s
    assert stalled.most_waiting is not None
    assert (stalled.most_waiting.rank, stalled.most_waiting.phase) == (0, "train")
    assert stalled.most_waiting.wait_share == approx(1.28 / 2.9) and dl.WAIT_SHARE_WARN < 1.28 / 2.9
    fed = report_of(small_run(tmp_path, "fed", stall=0.02)).dataloader  # train 0.4 s of 2.9 s, eval 0.05 of 0.25
    assert max(x.wait_share for x in fed.phases) == approx(0.2) and fed.most_waiting is None


def metrics_line(workers: int, cpus: float) -> str:
    """A metrics.jsonl snapshot (OTLP JSON) with the loader's worker count and the CPUs available."""
    def gauge(name: str, point: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "gauge": {"dataPoints": [{"timeUnixNano": str(ns(T0 + 12)), **point}]}}

    return json.dumps({"resourceMetrics": [{"resource": {}, "scopeMetrics": [{"metrics": [
        gauge(sc.DATALOADER_WORKERS.name, {"asInt": str(workers)}),
        gauge(sc.CPU_AVAILABLE.name, {"asDouble": cpus})]}]}]})


@pytest.mark.parametrize(("workers", "cpus", "few", "many"), [(1, 8.0, True, False), (4, 4.0, False, False),
                                                              (20, 4.0, False, True), (6, 8.0, False, False)])
def test_loader_workers_are_judged_against_the_cpus(tmp_path: Path, workers: int, cpus: float, few: bool,
                                                    many: bool) -> None:
    run = small_run(tmp_path)
    with open(run / schema.rank_dir_name(0) / schema.METRICS, "a", encoding="utf-8") as handle:
        handle.write(metrics_line(workers, cpus) + "\n")
    [loader] = report_of(run).dataloader.loaders
    assert (loader.workers, loader.cpus_available) == (workers, cpus)
    assert (loader.too_few_workers, loader.too_many_workers) == (few, many)
    # 70 % .. 200 % of the CPUs by default: 1 < 5.6, 20 > 8, 6 in 5.6 .. 16
    assert few == (workers < MixinConfig().dataloader_min_threshold * cpus)
    assert many == (workers > MixinConfig().dataloader_max_threshold * cpus)


def test_the_device_section_picks_come_with_the_device_analysis(tmp_path: Path) -> None:
    run = tmp_path / "two"
    exposed = {0: 0.004, 1: 0.012}  # seconds over a 2-step window
    peaks = {0: 1e12, 1: 4e11}  # the same FLOPs per step: rank 1's smaller peak gives it the higher MFU
    for rank in (0, 1):
        steps = small_steps()
        last = steps[-1]["t"] / 1e9 + steps[-1]["d"] / 1e9
        life = {"process_start": T0, "first_step_start": T0 + 10, "last_step_end": last, "shutdown": last + 1}
        profile = {"start_step": 3, "num_steps": 2, "t": ns(T0 + 10.3), "d": ns(0.2),
                   "flops": {"per_step": 2e10, "peak": peaks[rank], "utilization": 0.0, "device": "cuda",
                             "dtype": "bf16", "gpu_model": "NVIDIA A100"},
                   "operators": {"overlap": {"communication_s": 0.02, "overlapped_s": 0.02 - exposed[rank],
                                             "exposed_s": exposed[rank], "compute_s": 0.05,
                                             "overlap_ratio": 1 - exposed[rank] / 0.02}}}
        write_rank(run, rank, manifest(rank, world=2, lifecycle=life), steps, profiles=[profile])
    d = report_of(run).device
    utilization = {x.rank: x.utilization or 0.0 for x in d.flops}
    assert d.best_flops is not None and d.best_flops.rank == 1 and utilization[1] > utilization[0] > 0
    assert d.most_exposed is not None and d.most_exposed.rank == 1
    assert d.most_exposed.exposed == approx(exposed[1] / 2)
    cpu_only = dataclasses.replace(d, flops=tuple(dataclasses.replace(x, utilization=None) for x in d.flops),
                                   overlap=())
    assert cpu_only.best_flops is None and cpu_only.most_exposed is None
