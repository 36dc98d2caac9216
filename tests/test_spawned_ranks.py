"""``otelprof run`` on DDP scripts that start their ranks themselves — ``torch.multiprocessing.spawn`` or
``multiprocessing.Process(target=...)`` (spawn, forkserver), each child calling ``init_process_group(backend,
rank=rank, world_size=world_size)`` as PyTorch's DDP examples do: every child records as its rank in one run, with
its steps, losses and all-reduce regions, and serves ``/metrics`` on the port of its local rank; the parent, which
only starts them, leaves nothing; helpers (the ranks' data-loader workers, a pool's workers) record nothing and import
nothing of otelprof."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import pytest

import otelprof
from otelprof import environment_variables as ev
from otelprof import semconv as sc
from otelprof.cli import spawned_ranks
from otelprof.recording.reader import read_recording
from tests.servers import free_port
from tests.test_launch import _bootstrap, otelprof_lines, otelprof_run

pytestmark = pytest.mark.serial  # gloo rendezvous on fixed ports, timing-sensitive: alone, after the parallel part

SAMPLES, BATCH, ACCUMULATE, WORLD = 96, 4, 2, 2
STEPS = SAMPLES // WORLD // BATCH // ACCUMULATE
"""Optimizer updates per rank: its half of the data in batches of 4, two micro-batches per update."""

SCRIPT = """
import json, os, sys, urllib.request
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

SAMPLES, BATCH, ACCUMULATE = CONSTANTS


def worker_init(worker_id):  # a rank's data-loader worker (spawned): a helper, with nothing of otelprof
    with open(f"worker-{os.getppid()}.json", "w") as f:
        json.dump({"otelprof": "otelprof" in sys.modules, "spawner": os.environ.get("OTELPROF_RUN_SPAWNER")}, f)


def main(index, shape, world_size, out, metrics_port):
    torch.set_num_threads(1)
    rank = world_size - 1 - index if shape == "mp.spawn" else index  # mp.spawn: the index is not the rank
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(SAMPLES, 8), torch.randn(SAMPLES, 2))
    workers = dict(num_workers=1, multiprocessing_context="spawn", persistent_workers=True,
                   worker_init_fn=worker_init) if shape == "mp.spawn" else {}
    loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data), **workers)
    losses, loss_sum = [], 0.0
    for i, (x, y) in enumerate(loader):
        loss = ((model(x) - y) ** 2).mean()
        (loss / ACCUMULATE).backward()
        loss_sum += loss.item() / ACCUMULATE
        if (i + 1) % ACCUMULATE == 0:
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss_sum)
            loss_sum = 0.0
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port + index}/metrics", timeout=30).read()
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump({"losses": losses, "pid": os.getpid(), "index": index, "metrics": metrics.decode()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    shape, master_port, metrics_port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", master_port
    with open("parent.json", "w") as f:
        json.dump({"pid": os.getpid()}, f)
    args = (shape, 2, os.getcwd(), metrics_port)
    if shape == "mp.spawn":
        mp.spawn(main, args=args, nprocs=2)
    else:
        context = mp.get_context(shape)
        processes = [context.Process(target=main, args=(rank, *args)) for rank in range(2)]
        for process in processes:
            process.start()
        for process in processes:
            process.join()
        sys.exit(max(process.exitcode for process in processes))
""".replace("CONSTANTS", f"{SAMPLES}, {BATCH}, {ACCUMULATE}")

POOL_SCRIPT = """
import json, os, sys, multiprocessing
import torch


def work(x):
    import torch.distributed as dist
    return {"value": x * 2, "group": dist.is_initialized(), "otelprof": "otelprof" in sys.modules}


if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map(work, range(4))
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(3):  # the parent trains: it is the run's rank 0
        loss = ((model(torch.randn(4, 8)) - torch.randn(4, 2)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    with open("parent.json", "w") as f:
        json.dump({"pid": os.getpid(), "results": results, "losses": losses}, f)
"""




def _run(tmp_path: Path, script: str, *args: str, env: dict[str, str] | None = None) -> tuple[Path, str]:
    """``otelprof run -- python script args`` with its own temporary directory; the run and stderr."""
    path = tmp_path / "train.py"
    path.write_text(script)
    # short: the forkserver's socket lives there, and a Unix socket's path is at most 107 bytes (a test worker's
    # own temporary directory is deeper)
    temporary = Path(tempfile.mkdtemp(prefix="ranks-", dir="/tmp" if os.path.isdir("/tmp") else None))
    try:
        result = otelprof_run(tmp_path, sys.executable, str(path), *args,
                              env={"OTELPROF_RUN_ID": "", "TMPDIR": str(temporary), **(env or {})})
        left = list(temporary.glob("otelprof-*"))
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    [run] = list((tmp_path / "runs").iterdir())
    assert otelprof_lines(result.stderr) == [
        f"otelprof: recording run {run.name} to runs/{run.name}",
        f"otelprof: run {run.name} recorded; report: otelprof report runs/{run.name}"]
    assert [line for line in result.stderr.splitlines() if "otelprof" in line.lower() or "Traceback" in line] == \
        otelprof_lines(result.stderr)
    assert left == []  # the handover left nothing behind
    return run, result.stderr


@pytest.mark.parametrize("shape", ["mp.spawn", "spawn", "forkserver"])
def test_ranks_started_with_multiprocessing(tmp_path: Path, shape: str) -> None:
    metrics_port = free_port(2)  # the ranks' /metrics: base + local rank
    run, _ = _run(tmp_path, SCRIPT, shape, str(free_port()), str(metrics_port),
                  env={"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": str(metrics_port)})
    parent = json.loads((tmp_path / "parent.json").read_text())["pid"]
    assert sorted(p.name for p in run.iterdir()) == ["rank-0", "rank-1"]
    recording = read_recording(run)
    assert [r.rank for r in recording.ranks] == [0, 1]
    assert {r.manifest["run_id"] for r in recording.ranks} == {run.name}
    for rank in recording.ranks:
        wrote = json.loads((tmp_path / f"rank-{rank.rank}.json").read_text())
        manifest = rank.manifest
        pid = manifest["resource"][sc.PROCESS_PID]
        assert pid == wrote["pid"] != parent  # the child's recording; none of the parent's
        assert manifest["status"] == "finished" and manifest["world_size"] == WORLD
        assert manifest["local_rank"] == wrote["index"]  # mp.spawn: its process index; else the rank
        assert manifest["resource"][sc.SERVICE_NAME] == "train"
        if shape == "mp.spawn":
            worker = json.loads((tmp_path / f"worker-{pid}.json").read_text())
            assert worker == {"otelprof": False, "spawner": None}
        assert len(wrote["losses"]) == STEPS
        assert [(s.phase, s.number) for s in rank.steps] == [("train", i) for i in range(STEPS)]
        for step, loss in zip(rank.steps, wrote["losses"]):
            assert step.scalars["loss"] == pytest.approx(loss) and step.scalars["samples"] == BATCH * ACCUMULATE
            names = sorted(a.name for a in step.annotations)
            assert names == sorted([sc.REGION_DATALOADER, sc.REGION_FORWARD, sc.REGION_BACKWARD,
                                    sc.REGION_COLLECTIVE] * ACCUMULATE + [sc.REGION_OPTIMIZER])
        # /metrics on base port + local rank, served by this rank (the parent let go of local rank 0's port)
        metrics = wrote["metrics"]
        assert f'process_pid="{pid}"' in metrics and f'otelprof_rank="{rank.rank}"' in metrics
        assert f'otelprof_local_rank="{wrote["index"]}"' in metrics and f'otelprof_run_id="{run.name}"' in metrics


def test_pool_workers_stay_helpers(tmp_path: Path) -> None:
    """A pool's spawned workers import torch.distributed and never call init_process_group: they record nothing and
    import nothing of otelprof; the parent, which trains, is the run's only rank."""
    run, _ = _run(tmp_path, POOL_SCRIPT)
    wrote = json.loads((tmp_path / "parent.json").read_text())
    assert wrote["results"] == [{"value": 2 * i, "group": False, "otelprof": False} for i in range(4)]
    assert [p.name for p in run.iterdir()] == ["rank-0"]
    recording = read_recording(run)
    [rank] = recording.ranks
    assert rank.rank == 0 and rank.manifest["resource"][sc.PROCESS_PID] == wrote["pid"]
    assert [s.scalars["loss"] for s in rank.steps] == pytest.approx(wrote["losses"])


# ---------------------------------------------------------------------- which processes may become ranks
@pytest.mark.parametrize(("role", "run", "spawner", "armed"), [
    ("helper", "started", "{}", True),  # a multiprocessing child of a spawner
    ("helper", "started", "", False),  # of a rank of torchrun (no spawner): a helper
    ("helper", "1", "{}", False),  # of a launcher
    ("training", "started", "{}", False),  # a compile worker, a subprocess of the program
])
def test_which_children_may_become_ranks(role: str, run: str, spawner: str, armed: bool) -> None:
    env = {"OTELPROF_RUN": run, **({ev.OTELPROF_RUN_SPAWNER: spawner} if spawner else {})}
    assert _bootstrap()._armed(role, env) is armed


@pytest.mark.parametrize("env", [{ev.RANK: "0", ev.WORLD_SIZE: "2"}, {ev.WORLD_SIZE: "1"}, {}])
def test_only_a_process_without_a_rank_offers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              env: dict[str, str]) -> None:
    for name in (ev.RANK, ev.WORLD_SIZE, ev.OTELPROF_RUN_SPAWNER):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    import multiprocessing.spawn as mp_spawn

    monkeypatch.setattr(mp_spawn, "get_preparation_data", mp_spawn.get_preparation_data)
    monkeypatch.setattr(spawned_ranks, "_watch", [])
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    try:
        spawned_ranks.offer(session)
        offered = spawned_ranks.Spawner.decode(os.environ.get(ev.OTELPROF_RUN_SPAWNER, ""))
        if env:
            assert offered is None
        else:
            assert offered is not None and offered.pid == os.getpid() and offered.run_id == session.config.run_id
            assert offered.record_dir == str(tmp_path.resolve())
    finally:
        otelprof.shutdown()


@pytest.mark.parametrize("taken_over", [False, True])
def test_a_discarded_session_leaves_nothing_of_its_own(tmp_path: Path, taken_over: bool) -> None:
    """The spawner's session, discarded: its rank directory goes (unless another process's manifest is there now:
    a rank that stopped waiting for it), its /metrics port is free at once, and it records nothing more."""
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, metrics_exporters=("prometheus",),
                            prometheus_port=0)
    assert isinstance(session, otelprof.Session) and session.run_dir is not None and session.metrics_address
    run_dir = session.run_dir
    if taken_over:
        manifest = json.loads((run_dir / "manifest.json").read_text())
        manifest["resource"][sc.PROCESS_PID] = os.getpid() + 1
        (run_dir / "manifest.json").write_text(json.dumps(manifest))
    session.discard()
    assert otelprof.get_session() is None and session.closed
    with otelprof.step():  # no session: a no-op
        pass
    assert run_dir.is_dir() is taken_over
    with socket.socket() as s:
        s.bind(session.metrics_address)
