"""A real 2-rank DDP job (torchrun, gloo, CPU): both ranks' series and spans arrive with their labels,
and an artificially slowed rank is visible — in its own compute time, and as the other rank's wait
in the all-reduce."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

from otelprof import semconv as sc
from otelprof.recording.reader import Step, read_recording
from tests.otlp_receiver import OTLPReceiver, attributes

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
