"""A real 2-rank DDP job (torchrun, gloo, CPU): both ranks' series and spans arrive with their labels,
and an artificially slowed rank is visible — in its own compute time, and as the other rank's wait
in the all-reduce; the same job unchanged under ``otelprof run``. The communication hook's rules (a hook
of the user's own, registered before or after otelprof's) on a one-process gloo group."""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import otelprof
from otelprof import semconv as sc
from otelprof.integrations import torch as otorch
from otelprof.recording.reader import read_recording
from otelprof.recording.records import Step
from tests.otlp_receiver import OTLPReceiver, attributes
from tests.servers import free_port
from tests.test_launch import otelprof_lines, otelprof_run

SCRIPT = """
import os, time, torch, torch.distributed as dist
import otelprof
from otelprof.integrations import torch as otorch
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
session = otelprof.init(job_name="ddp-test", system_metrics=False, span_first_steps=5, metric_export_interval=1.0)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(TensorDataset(torch.randn(320, 32), torch.randn(320, 4)), batch_size=16)
otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
for x, y in loader:
    out = model(x)
    if rank == 1:
        time.sleep(0.03)  # the straggler: slow compute before the gradient all-reduce
    loss = ((out - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
otelprof.shutdown()
dist.destroy_process_group()
"""


def _compute(step: Step) -> float:
    """Step time not spent waiting for data or for other ranks."""
    waits = sum(a.duration_ns for a in step.annotations if a.name in (sc.REGION_COLLECTIVE, sc.REGION_DATALOADER))
    return (step.duration_ns - waits) / 1e9


def _collective(step: Step) -> float:
    return sum(a.duration_ns for a in step.annotations if a.name == sc.REGION_COLLECTIVE) / 1e9


def test_two_rank_ddp_job(tmp_path: Path) -> None:
    script = tmp_path / "train_ddp.py"
    script.write_text(SCRIPT)
    torchrun = Path(sys.executable).parent / "torchrun"
    with OTLPReceiver() as receiver:
        env = {**os.environ, "OTELPROF_RECORD_DIR": str(tmp_path / "runs"), "OTELPROF_RUN_ID": "ddp-run",
               "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint("http/protobuf"),
               "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
        result = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node=2", str(script)], env=env,
                                capture_output=True, text=True, timeout=240)
        assert result.returncode == 0, result.stderr[-3000:]
        spans = receiver.spans()
        metrics = receiver.metrics()

    recording = read_recording(tmp_path / "runs" / "ddp-run")
    assert [r.rank for r in recording.ranks] == [0, 1]
    for rank in recording.ranks:
        assert rank.manifest["world_size"] == 2 and rank.manifest["resource"][sc.OTELPROF_RANK] == rank.rank
        assert len(rank.steps) == 20
        assert all(sc.REGION_COLLECTIVE in [a.name for a in s.annotations] for s in rank.steps[1:])

    fast, slow = recording.ranks
    steady = slice(2, None)  # skip warm-up
    assert statistics.median(_compute(s) for s in slow.steps[steady]) > \
        statistics.median(_compute(s) for s in fast.steps[steady]) + 0.02
    assert statistics.median(_collective(s) for s in fast.steps[steady]) > \
        statistics.median(_collective(s) for s in slow.steps[steady]) + 0.02

    # Over the wire: both ranks' step spans and step-duration series, with their rank labels.
    ranks_with_spans = {s.resource_attributes[sc.OTELPROF_RANK] for s in spans if s.name == sc.SPAN_STEP}
    assert ranks_with_spans == {0, 1}
    assert {s.resource_attributes[sc.SERVICE_NAME] for s in spans} == {"ddp-test"}
    point_ranks = set()
    for received in metrics:
        if received.name == sc.STEP_DURATION.name:
            for point in received.metric.histogram.data_points:
                labels = attributes(point.attributes)
                assert labels[sc.LABEL_JOB] == "ddp-test" and labels[sc.LABEL_LOCAL_RANK] == labels[sc.LABEL_RANK]
                point_ranks.add(labels[sc.LABEL_RANK])
    assert point_ranks == {"0", "1"}


RUN_SCRIPT = """
import json, os, sys, time, torch, torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(640, 32), torch.randn(640, 4))
loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
losses = []
for x, y in loader:
    out = model(x)
    if rank == 1:
        time.sleep(0.03)  # the straggler
    loss = ((out - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
with open(f"losses-{rank}.json", "w") as f:
    json.dump(losses, f)
dist.destroy_process_group()
"""


def test_ddp_under_otelprof_run(tmp_path: Path) -> None:
    """``otelprof run -- torchrun ...`` on an unchanged DDP script: every step holds its all-reduce as a collective
    region, so the fast rank's wait for the straggler is collective time; both ranks share one run (static
    rendezvous: torchrun gives no run id), and only rank 0 says where it goes."""
    script = tmp_path / "train_ddp.py"
    script.write_text(RUN_SCRIPT)
    torchrun = Path(sys.executable).parent / "torchrun"
    result = otelprof_run(tmp_path, str(torchrun), "--nnodes=1", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                          f"--master_port={free_port()}", str(script), env={"OTELPROF_RUN_ID": ""})
    [run] = list((tmp_path / "runs").iterdir())
    lines = otelprof_lines(result.stderr)
    assert lines == [f"otelprof: recording run {run.name} to runs/{run.name}",
                     f"otelprof: run {run.name} recorded; report: otelprof report runs/{run.name}"]
    recording = read_recording(run)
    assert [r.rank for r in recording.ranks] == [0, 1]
    for rank in recording.ranks:
        losses = json.loads((tmp_path / f"losses-{rank.rank}.json").read_text())
        assert [(s.phase, s.number) for s in rank.steps] == [("train", i) for i in range(len(losses))]
        assert len(losses) == 20
        for step, loss in zip(rank.steps, losses):
            names = [a.name for a in step.annotations]
            assert sorted(names) == sorted([sc.REGION_DATALOADER, sc.REGION_FORWARD, sc.REGION_BACKWARD,
                                            sc.REGION_COLLECTIVE, sc.REGION_OPTIMIZER])
            assert step.scalars["loss"] == pytest.approx(loss) and step.scalars["samples"] == 16
    fast, slow = recording.ranks
    steady = slice(2, None)
    assert statistics.median(_collective(s) for s in fast.steps[steady]) > \
        statistics.median(_collective(s) for s in slow.steps[steady]) + 0.02
    assert statistics.median(_compute(s) for s in slow.steps[steady]) > \
        statistics.median(_compute(s) for s in fast.steps[steady]) + 0.02


# ---------------------------------------------------------------------- the communication hook's rules
@pytest.fixture
def one_process_group(tmp_path: Path) -> Iterator[Path]:
    """A gloo group of one process, a session recording into ``tmp_path``; yields the recording."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    assert isinstance(session, otelprof.Session) and session.run_dir is not None
    try:
        yield session.run_dir
    finally:
        otorch.uninstrument()
        otelprof.shutdown()
        dist.destroy_process_group()


class Counting:
    """A user's communication hook: DDP's all-reduce, counted."""

    def __init__(self) -> None:
        self.calls = 0

    def hook(self, state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects the annotations as strings
        self.calls += 1
        return default_hooks.allreduce_hook(state, bucket)


def _ddp_steps(model: torch.nn.Module, steps: int = 4) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        loss = model(torch.randn(8, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _collectives(run_dir: Path) -> list[int]:
    otelprof.shutdown()
    return [[a.name for a in s.annotations].count(sc.REGION_COLLECTIVE) for s in read_recording(run_dir).ranks[0].steps]


def test_a_hook_registered_after_otelprofs_runs_inside_it_timed(one_process_group: Path) -> None:
    otorch.auto_instrument()  # otelprof run's global hooks: each DDP model built gets otelprof's hook
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    user = Counting()
    model.register_comm_hook(None, user.hook)  # would raise "can only be registered once" if not handed over
    _ddp_steps(model)
    assert user.calls == 4  # theirs runs (one bucket per backward) ...
    assert model._get_ddp_logging_data().get("comm_hook") == Counting.hook.__qualname__
    with pytest.raises(RuntimeError):  # ... and a second registration fails as DDP's own would
        model.register_comm_hook(None, user.hook)
    with pytest.raises(ValueError):  # DDP's checks of the hook run as before
        model2 = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))

        def annotated(state: object, bucket: int) -> torch.futures.Future[torch.Tensor]:
            raise AssertionError("never called")

        model2.register_comm_hook(None, annotated)
    assert _collectives(one_process_group) == [1] * 4  # ... timed as the collective region


def test_a_builtin_hook_registered_after_otelprofs_is_its_python_twin(one_process_group: Path) -> None:
    otorch.auto_instrument()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    _ddp_steps(model)
    assert _collectives(one_process_group) == [1] * 4


def test_a_hook_registered_before_is_left_alone(one_process_group: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    user = Counting()
    model.register_comm_hook(None, user.hook)
    with caplog.at_level(logging.INFO, logger="otelprof"):
        otorch.instrument(model=model)
    losses = _ddp_steps(model)
    assert user.calls == 4 and len(losses) == 4
    assert "already has a communication hook" in caplog.text and "WARNING" not in caplog.text
    otorch.uninstrument()  # ends the last step (no optimizer hooked: each forward begins one)
    assert _collectives(one_process_group) == [0] * 4  # theirs wins: no collective regions


def test_models_built_before_or_after_the_global_hooks(one_process_group: Path) -> None:
    ddp = torch.nn.parallel.DistributedDataParallel
    original = ddp.__init__
    before = ddp(torch.nn.Linear(8, 2))
    otorch.auto_instrument()
    assert ddp.__init__ is not original
    _ddp_steps(before, 2)  # built before: no hook (instrument(model=...) would add it)
    after = ddp(torch.nn.Linear(8, 2))
    _ddp_steps(after, 2)
    otorch.uninstrument()
    assert ddp.__init__ is original
    assert _collectives(one_process_group) == [0, 0, 1, 1]


def test_collectives_off_leaves_ddp_its_own_reduction(tmp_path: Path) -> None:
    """``OTELPROF_DDP_COLLECTIVES=false``: no communication hook on any DDP model (DDP's C++ all-reduce runs), the
    steps and losses are recorded as before, without collective regions."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, ddp_collectives=False)
    assert isinstance(session, otelprof.Session) and session.run_dir is not None
    try:
        otorch.auto_instrument()
        built_after = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
        otorch.instrument(model=built_after)
        losses = _ddp_steps(built_after)
        assert not built_after._comm_hooks and "comm_hook" not in built_after._get_ddp_logging_data()
        otorch.uninstrument()
        otelprof.shutdown()
        [rank] = read_recording(session.run_dir).ranks
        assert [s.scalars["loss"] for s in rank.steps] == pytest.approx(losses)
        assert [[a.name for a in s.annotations].count(sc.REGION_COLLECTIVE) for s in rank.steps] == [0] * 4
    finally:
        otorch.uninstrument()
        otelprof.shutdown()
        dist.destroy_process_group()
