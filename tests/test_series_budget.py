"""The series budget (docs/scale.md): what one rank and one node export with default settings, on an
8-GPU node with 96 and 192 logical CPUs (fake NVML, a fixture /proc/stat and cgroup tree), held here so a
change that grows them fails until the budget is revisited."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

import otelprof
from otelprof import semconv as sc
from otelprof import torch as otorch
from otelprof.config import Config
from otelprof.runtime.collectors.cgroup import CgroupReader
from otelprof.runtime.collectors.sampler import Sampler
from otelprof.runtime.export.prometheus import render
from otelprof.runtime.metrics import MetricRegistry
from tests.fake_nvml import FIXTURES, FakeNvml

# The published budget (docs/scale.md). A rank: its steps, phases, regions, scalars and process; a node: the
# node-wide series its sampling rank adds (host, container, 8 GPUs).
RANK_BUDGET = 450
NODE_EXTRA_BUDGET = 650
GPUS = 8
BUSIEST = f'{sc.prometheus_label(sc.LABEL_CPU)}="{sc.CPU_BUSIEST}"'
USER = f'{sc.prometheus_label(sc.LABEL_CPU_MODE)}="user"'


def _series(text: str) -> list[str]:
    """Series identities (name and labels) of an exposition, ``target_info`` aside."""
    return [line.rsplit(" ", 1)[0] for line in text.splitlines()
            if line and not line.startswith(("#", "target_info"))]


def _fake_proc(root: Path, cpus: int, tick: int) -> None:
    """/proc with the real one's entries (this process's, not the others') but ``stat``: ``cpus`` logical CPUs,
    CPU 5 the busiest."""
    root.mkdir(exist_ok=True)
    for name in os.listdir("/proc"):
        if name != "stat" and (not name.isdigit() or name == str(os.getpid())) and not os.path.lexists(root / name):
            (root / name).symlink_to(Path("/proc") / name)
    lines = [f"cpu  {100 * cpus * tick} 0 0 {100 * cpus * tick} 0 0 0 0 0 0"]
    for cpu in range(cpus):
        busy = 90 if cpu == 5 else 20 + cpu % 30
        # user nice system idle iowait irq softirq steal guest guest_nice (jiffies)
        lines.append(f"cpu{cpu} {busy * tick} 0 {5 * tick} {(95 - busy) * tick} {tick} 0 0 0 0 0")
    (root / "stat").write_text("\n".join(lines) + "\nintr 0\nctxt 0\nbtime 0\nprocesses 1\n")


def _eight_gpus() -> FakeNvml:
    fake = FakeNvml()
    data = fake.data
    devices = []
    for i in range(GPUS):
        device = copy.deepcopy(data["devices"][i % 2])
        device["uuid"] = f"GPU-{i:08d}-0000-4000-8000-{i:012d}"
        devices.append(device)
    data["devices"] = devices
    data["process_memory"] = {str(i): 30 * 1024**3 for i in range(GPUS)}
    data["ticks"] = [{str(i): tick[str(i % 2)] for i in range(GPUS)} for tick in data["ticks"]]
    return fake


def _node_series(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpus: int, **overrides: Any) -> list[str]:
    """The series one sampling rank's node-wide sampler exports after a few samples."""
    proc = tmp_path / f"proc{cpus}"
    _fake_proc(proc, cpus, 1)
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(proc))
    config = Config.from_env({}, **overrides)
    registry = MetricRegistry({"job_name": "t", "rank": "0", "local_rank": "0", "node": "n"})
    cgroup = CgroupReader(FIXTURES / "cgroup" / "v2_quota", proc_cgroup="0::/\n")
    fake = _eight_gpus()
    sampler = Sampler(config, registry, None, nvml_factory=lambda: fake, cgroup=cgroup)
    for tick in range(2, 6):
        _fake_proc(proc, cpus, tick)
        fake.tick = tick
        sampler.sample()
    sampler.stop()
    return _series(render(registry.collect(), {}))


def _rank_series(tmp_path: Path) -> list[str]:
    """A non-sampling rank (local rank 1) training a small model with train and eval phases."""
    session = otelprof.init(record_dir=str(tmp_path / "runs"), local_rank=1, gpu_metrics=False)
    assert isinstance(session, otelprof.Session)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    for _ in range(3):
        model.train()
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, _y in loader:
                model(x)
    return _series(render(session.registry.collect(), {}))


def test_a_rank_stays_within_its_budget_and_exports_no_node_series(tmp_path: Path) -> None:
    series = _rank_series(tmp_path)
    names = {line.split("{")[0] for line in series}
    assert any(name.startswith("otelprof_step") for name in names), names  # it did measure steps
    assert not any(name.startswith(("system_", "otelprof_gpu_", "hw_")) for name in names), names
    assert 0 < len(series) <= RANK_BUDGET, len(series)


@pytest.mark.parametrize("cpus", [96, 192])
def test_a_node_stays_within_its_budget_whatever_its_cpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          cpus: int) -> None:
    series = _node_series(tmp_path, monkeypatch, cpus)
    cpu_rows = [line for line in series if line.startswith("system_cpu_utilization")]
    # past OTELPROF_PER_CPU_MAX (64) only the busiest CPU's modes: CPU 5 runs 90 % user in the fixture
    assert len(cpu_rows) == len(sc.CPU_MODES), cpu_rows
    assert all(BUSIEST in line for line in cpu_rows)
    gpus = {line.split('gpu="')[1].split('"')[0] for line in series if 'gpu="' in line}
    assert gpus == {str(i) for i in range(GPUS)}
    assert len(series) <= NODE_EXTRA_BUDGET, len(series)
    # the coincidence counters the CPU-bottleneck checks judge still see every CPU: CPU 5 is above 80 %
    high = [line for line in series if line.startswith(f"{sc.SAMPLER_HIGH_CPU.prometheus_name}_total")]
    assert high


def test_per_cpu_series_on_request_and_the_busiest_row_is_the_busiest_cpu(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    series = _node_series(tmp_path, monkeypatch, 96, per_cpu_max=128)
    cpu_rows = [line for line in series if line.startswith("system_cpu_utilization")]
    assert len(cpu_rows) == 96 * len(sc.CPU_MODES)
    summary = Config.from_env({"OTELPROF_PER_CPU_MAX": "0"})
    assert summary.per_cpu_max == 0
    text = render(_registry_after(tmp_path, monkeypatch, summary).collect(), {})
    user = [line for line in text.splitlines() if line.startswith("system_cpu_utilization") and USER in line]
    assert len(user) == 1 and BUSIEST in user[0]
    # CPU 5 a tick: 90 user, 5 system, 5 idle, 1 iowait jiffies
    assert float(user[0].rsplit(" ", 1)[1]) == pytest.approx(90 / 101)


def _registry_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: Config) -> MetricRegistry:
    proc = tmp_path / "proc8"
    _fake_proc(proc, 8, 1)
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(proc))
    registry = MetricRegistry({"job_name": "t", "rank": "0", "local_rank": "0", "node": "n"})
    sampler = Sampler(config, registry, None, nvml_factory=None, cgroup=CgroupReader(tmp_path / "none"))
    sampler.sample()
    _fake_proc(proc, 8, 2)
    sampler.sample()
    return registry
