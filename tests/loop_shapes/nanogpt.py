"""nanoGPT's loop shape: no DataLoader (batches from ``get_batch(split)``, the next one fetched while the current
one is in flight), gradient accumulation x4 with ``loss / 4`` before ``scaler.scale(loss).backward()``, a
``GradScaler`` that is off (``scaler.step(optimizer)`` calls ``optimizer.step()``), an evaluation pass at every
``eval_interval`` iterations (iteration 0 included) under ``torch.no_grad()`` and ``model.eval()``, the model
returning ``(logits, loss)``; optionally ``torch.compile`` (the ``aot_eager`` backend: dynamo and AOT autograd
without code generation, which takes minutes on CPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.loop_shapes import Account, Instrument, run_as_script

BLOCK, VOCAB, BATCH = 8, 16, 4
MAX_ITERS, EVAL_INTERVAL, EVAL_ITERS, ACCUMULATION = 9, 4, 2, 4


class TinyGPT(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCAB, 16)
        self.mix = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, idx: torch.Tensor,
                targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = self.head(torch.tanh(self.mix(self.embedding(idx))))
        if targets is None:
            return logits[:, [-1], :], None
        return logits, F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def main(instrument: Instrument | None = None, compile: bool = False) -> Account:  # (nanoGPT's name)
    torch.manual_seed(1337)
    data = {"train": torch.randint(0, VOCAB, (400,)), "val": torch.randint(0, VOCAB, (200,))}

    def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        source = data[split]
        ix = torch.randint(len(source) - BLOCK, (BATCH,))
        x = torch.stack([source[i:i + BLOCK] for i in ix])
        y = torch.stack([source[i + 1:i + 1 + BLOCK] for i in ix])
        return x, y

    model: torch.nn.Module = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=False)  # nanoGPT: enabled only for float16
    if compile:
        model = torch.compile(model, backend="aot_eager")  # type: ignore[assignment]
    if instrument is not None:
        instrument(model=model, optimizer=optimizer)
    account = Account()

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        out = {}
        model.eval()
        for split in ("train", "val"):
            losses = torch.zeros(EVAL_ITERS)
            for k in range(EVAL_ITERS):
                account.step("eval")
                x, y = get_batch(split)
                _logits, loss = model(x, y)
                account.did("forward")
                account.eval_loss(loss)
                losses[k] = loss.item()
            out[split] = float(losses.mean())
        model.train()
        return out

    x, y = get_batch("train")
    iter_num = 0
    while True:
        if iter_num % EVAL_INTERVAL == 0:
            estimate_loss()
        account.step("train")
        for _micro_step in range(ACCUMULATION):
            _logits, loss = model(x, y)
            loss = loss / ACCUMULATION
            x, y = get_batch("train")
            scaler.scale(loss).backward()
            account.did("forward", "backward")
            account.backward_loss(loss)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        account.did("optimizer")
        iter_num += 1
        if iter_num > MAX_ITERS:
            break
    return account


if __name__ == "__main__":
    run_as_script(main)
