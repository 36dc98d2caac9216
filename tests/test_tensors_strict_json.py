"""Every line of tensors.jsonl is strict JSON, also when weights are NaN or infinite: non-finite values are
the strings "NaN" / "Infinity" / "-Infinity", read back as floats. A real torch loop under `otelprof run`."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from otelprof.recording.tensors import TENSORS, read_trial
from tests.test_tensors import _env

LOOP = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
with torch.no_grad():
    model[0].weight[0, 0] = float("nan")
    model[0].weight[1, 1] = float("inf")
    model[1].bias.fill_(float("-inf"))
opt = torch.optim.SGD(model.parameters(), lr=0.0)
for _ in range(12):
    opt.zero_grad()
    loss = model(torch.randn(8, 4)).sum()
    loss.backward()
    opt.step()
"""


def _strict(line: str) -> object:
    def refuse(token: str) -> object:
        raise ValueError(f"non-strict JSON token {token}")

    return json.loads(line, parse_constant=refuse)


def test_nan_and_infinite_weights_give_strict_json_read_back_as_floats(tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    env = _env(tmp_path, OTELPROF_RUN_ID="nan", OTELPROF_COLLECTIONS="weights,biases,gradients")
    result = subprocess.run([sys.executable, "-m", "otelprof", "run", "-q", "--", sys.executable, str(script)],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rank = tmp_path / "runs" / "nan" / "rank-0"
    lines = (rank / TENSORS).read_text().splitlines()
    assert len(lines) > 1
    for line in lines:
        _strict(line)
    assert '"NaN"' in "".join(lines)
    trial = read_trial(rank)
    assert trial.skipped_lines == 0
    weight = trial.reduction("0.weight", 0, "mean")
    assert math.isnan(weight)
    assert trial.reduction("1.bias", 0, "mean") == -math.inf


def test_old_lines_with_bare_tokens_are_still_read(tmp_path: Path) -> None:
    (tmp_path / TENSORS).write_text('{"k":"t","n":0,"name":"w","kind":"weights","c":["weights"],"shape":[2],'
                                    '"r":{"mean":NaN,"max":Infinity}}\n'
                                    '{"k":"t","n":1,"name":"w","kind":"weights","c":["weights"],"shape":[2],'
                                    '"r":{"mean":"NaN","max":"-Infinity"}}\n')
    trial = read_trial(tmp_path)
    assert math.isnan(trial.reduction("w", 0, "mean")) and trial.reduction("w", 0, "max") == math.inf
    assert math.isnan(trial.reduction("w", 1, "mean")) and trial.reduction("w", 1, "max") == -math.inf
