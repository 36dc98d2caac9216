"""Sparse and complex tensors in collections: a sparse embedding trained by SparseAdam and a complex parameter
train to the end under ``otelprof run`` with gradients and weights collected; a sparse tensor is reduced over
its stored values (its L2 norm is the dense tensor's), a complex one by magnitude, with nothing on stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from otelprof.recording.tensors import read_trial
from tests.test_tensors import _env

SPARSE = """
import json, torch
torch.manual_seed(0)
emb = torch.nn.Embedding(50, 6, sparse=True)
head = torch.nn.Linear(6, 1)
opts = [torch.optim.SparseAdam(list(emb.parameters()), lr=0.01), torch.optim.SGD(head.parameters(), lr=0.01)]
model = torch.nn.Sequential(emb, head)
seen = {}
for step in range(12):
    for opt in opts:
        opt.zero_grad()
    loss = model(torch.randint(0, 50, (16,))).pow(2).mean()
    loss.backward()
    seen[step] = {"grad_l2": float(emb.weight.grad.to_dense().norm()), "weight_l2": float(emb.weight.norm())}
    for opt in opts:
        opt.step()
print(json.dumps(seen))
"""

COMPLEX = """
import json, torch
torch.manual_seed(0)
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.cfloat))
    def forward(self, x):
        return (x.to(torch.cfloat) @ self.w).abs().sum()
model = Model()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
seen = {}
for step in range(12):
    opt.zero_grad()
    loss = model(torch.randn(8, 4))
    loss.backward()
    seen[step] = {"grad_l2": float(torch.linalg.vector_norm(model.w.grad)),
                  "weight_l2": float(torch.linalg.vector_norm(model.w))}
    opt.step()
print(json.dumps(seen))
"""


def _run(tmp_path: Path, name: str, loop: str) -> tuple[Path, dict[str, Any], str]:
    script = tmp_path / f"{name}.py"
    script.write_text(loop)
    env = _env(tmp_path, OTELPROF_RUN_ID=name, OTELPROF_COLLECTIONS="weights,gradients")
    result = subprocess.run([sys.executable, "-W", "error::UserWarning", "-m", "otelprof", "run", "-q", "--",
                             sys.executable, str(script)],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path / "runs" / name / "rank-0", json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


@pytest.mark.parametrize(("name", "loop", "grad", "weight"),
                         [("sparse", SPARSE, "gradients/0.weight", "0.weight"),
                          ("complex", COMPLEX, "gradients/w", "w")])
def test_sparse_and_complex_tensors_are_reduced_right_and_quietly(tmp_path: Path, name: str, loop: str,
                                                                   grad: str, weight: str) -> None:
    rank, seen, stderr = _run(tmp_path, name, loop)
    assert "otelprof:" not in stderr and "Casting complex" not in stderr and "Traceback" not in stderr, stderr
    trial = read_trial(rank)
    steps = trial.steps(grad)
    assert steps[:3] == [0, 5, 10], trial.tensor_names()
    for step in steps:
        assert trial.reduction(grad, step, "l2") == pytest.approx(seen[str(step)]["grad_l2"], rel=1e-4)
    assert trial.reduction(weight, 0, "l2") is not None
