"""Small real training loops with one injected pathology each, for the tensor-rule verdict tests.

``python tensor_job.py SCENARIO [STEPS]``, run under ``otelprof run`` with ``OTELPROF_COLLECTIONS`` set (the
no-code path), or ``SCENARIO=code`` style scenarios that call ``instrument(collections=...)`` themselves.
Each loop trains on CPU for a few seconds; evaluation passes every ``EVAL_EVERY`` steps. For the live suite,
``TENSOR_JOB_STEP_SLEEP`` (seconds) stretches each step so Prometheus scrapes the run as it goes, and
``TENSOR_JOB_STOP_FILE`` keeps the process (and its /metrics) alive after training until that file exists.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

EVAL_EVERY = 10
IN, CLASSES = 16, 4


def mlp(depth: int, act: type[nn.Module], width: int = 32) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(IN, width), act()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), act()]
    layers.append(nn.Linear(width, CLASSES))
    return nn.Sequential(*layers)


def batch(n: int = 64, imbalanced: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable task: the class is given by the signs of the first two inputs."""
    x = torch.randn(n, IN)
    if imbalanced:  # almost every sample in the quadrant of class 0
        x[:, :2] = -x[:, :2].abs()
        x[: n // 32, :2] = x[: n // 32, :2].abs()
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    return x, y


def main(scenario: str, steps: int) -> None:
    torch.manual_seed(0)
    lr = 0.2
    model: nn.Module
    if scenario == "vanishing":
        model = mlp(12, nn.Sigmoid)
    elif scenario == "saturated":
        model = mlp(2, nn.Sigmoid)
        with torch.no_grad():
            for layer in model:
                if isinstance(layer, nn.Linear):
                    layer.weight.normal_(0.0, 4.0)
    elif scenario == "dead_relu":
        model = mlp(2, nn.ReLU)
        with torch.no_grad():
            model[2].bias.fill_(-100.0)  # the second Linear: ReLU "3" never fires
    elif scenario == "exploding":
        model, lr = mlp(2, nn.ReLU), 50.0
    elif scenario == "zero_init":
        model = mlp(2, nn.ReLU)
        with torch.no_grad():
            model[2].weight.zero_()
            model[2].bias.zero_()
    elif scenario == "overtraining":
        model, lr = mlp(2, nn.ReLU, width=256), 0.2
    else:  # healthy, imbalanced, overtraining's data is separate
        model = mlp(2, nn.ReLU)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9 if scenario == "overtraining" else 0.0)
    if scenario == "code":  # collections chosen in code, not by the environment
        import otelprof
        import otelprof.torch

        otelprof.init()
        otelprof.torch.instrument(model, optimizer, collections=["gradients", "weights"])
    fixed = batch(32)
    fixed = (fixed[0], torch.randint(0, CLASSES, (32,), generator=torch.Generator().manual_seed(1)))
    losses = []
    seen: dict[int, dict[str, float]] = {}
    pause = float(os.environ.get("TENSOR_JOB_STEP_SLEEP", "0"))
    for step in range(steps):
        model.train()
        x, y = fixed if scenario == "overtraining" else batch(imbalanced=scenario == "imbalanced")
        if scenario in ("imbalanced", "healthy"):
            import otelprof.torch

            otelprof.torch.record_labels(y)
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        if scenario == "code":  # what the loop itself sees at each step, to compare with the recording
            seen[step] = {"grad_abs_mean": model[0].weight.grad.abs().mean().item(),
                          "weight_l2": model[0].weight.norm().item(), "weight_max": model[0].weight.max().item()}
        optimizer.step()
        losses.append(loss.item())
        if pause:
            time.sleep(pause)
        if (step + 1) % EVAL_EVERY == 0:
            model.eval()
            with torch.no_grad():
                for _ in range(2):
                    ex, ey = batch(32, imbalanced=scenario == "imbalanced")
                    if scenario == "overtraining":
                        ey = torch.randint(0, CLASSES, (32,))
                    loss_fn(model(ex), ey)
    print(json.dumps({"first_loss": losses[0], "last_loss": losses[-1], "seen": seen}), flush=True)
    stop = os.environ.get("TENSOR_JOB_STOP_FILE")
    deadline = time.monotonic() + 300
    while stop and not Path(stop).exists() and time.monotonic() < deadline:
        time.sleep(0.2)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 60)
