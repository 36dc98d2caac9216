"""Training loops written the way the public examples of each framework write them, on tiny CPU models
built from code (no download): a Hugging Face ``Trainer``, a Lightning ``Trainer``, an ``accelerate`` loop
with gradient accumulation. Each returns what the loop itself counted and logged.

Imported by the tests (the explicit callback / API, in the test process), and run as a script under
``otelprof run`` (the zero-code path): ``python tests/trainer_loops.py LOOP MODE`` prints that as JSON on
its last line. MODE ``plain`` has no otelprof code at all; ``callback`` passes otelprof's callback to
the trainer (``explicit`` calls ``otelprof.torch.instrument()`` for the accelerate loop).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)

HF_TRAIN, HF_EVAL, HF_BATCH, HF_ACCUMULATION = 48, 24, 8, 2
"""3 optimizer steps of 2 micro-batches of 8; 3 evaluation batches."""
PL_TRAIN, PL_EVAL, PL_BATCH, PL_ACCUMULATION, PL_SANITY = 128, 64, 16, 2, 2
"""4 optimizer steps of 2 batches of 16; 4 validation batches after 2 sanity-check batches."""
ACC_SAMPLES, ACC_BATCH, ACC_ACCUMULATION = 64, 8, 2
"""4 optimizer steps of 2 micro-batches of 8."""


def _labelled(n: int, features: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, features, generator=generator), torch.randint(0, 2, (n,), generator=generator))


# ---------------------------------------------------------------------- Hugging Face Trainer
class Sentences(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """``n`` token sequences of 12 with a label from their first token (for the sequence classifiers)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 50, (n, 12), generator=generator)
        self.labels = (self.ids[:, 0] > 25).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(12, dtype=torch.long), "labels": self.labels[i]}


def hf_trainer(out_dir: str, callbacks: list[Any]) -> dict[str, Any]:
    """A sequence classifier fine-tuned as the ``transformers`` text-classification example does, evaluated
    after the epoch and once more at the end."""
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=2))
    args = TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=HF_BATCH, per_device_eval_batch_size=HF_BATCH,
        gradient_accumulation_steps=HF_ACCUMULATION, num_train_epochs=1, learning_rate=1e-3,
        lr_scheduler_type="constant", logging_steps=1, eval_strategy="epoch", save_strategy="no", report_to=[],
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=Sentences(HF_TRAIN, 0),
                      eval_dataset=Sentences(HF_EVAL, 1), callbacks=callbacks)
    trainer.train()
    final = trainer.evaluate()
    return {"global_step": trainer.state.global_step, "log_history": trainer.state.log_history,
            "final_eval_loss": final["eval_loss"],
            "callbacks": sorted(type(c).__module__ + "." + type(c).__name__
                                for c in trainer.callback_handler.callbacks)}


# ---------------------------------------------------------------------- Lightning Trainer
def lightning_trainer(out_dir: str, callbacks: list[Any], package: str = "lightning.pytorch") -> dict[str, Any]:
    """A classifier trained as the Lightning examples do, with gradient accumulation and validation
    (``package``: ``pytorch_lightning`` for the standalone package)."""
    import importlib

    pl: Any = importlib.import_module(package)

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
            self.losses: list[float] = []
            self.val_losses: list[float] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)  # type: ignore[no-any-return]

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self(x), y)
            self.losses.append(float(loss.detach()))
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self(x), y)
            if not self.trainer.sanity_checking:
                self.val_losses.append(float(loss))
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    module = Classifier()
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=out_dir,
                         accumulate_grad_batches=PL_ACCUMULATION, num_sanity_val_steps=PL_SANITY,
                         callbacks=callbacks)
    trainer.fit(module, DataLoader(_labelled(PL_TRAIN, 8, 1), batch_size=PL_BATCH),
                DataLoader(_labelled(PL_EVAL, 8, 2), batch_size=PL_BATCH))
    return {"global_step": trainer.global_step, "losses": module.losses, "val_losses": module.val_losses,
            "callbacks": sorted(type(c).__module__ + "." + type(c).__name__ for c in trainer.callbacks)}


# ---------------------------------------------------------------------- accelerate
def accelerate_loop(explicit: bool) -> dict[str, Any]:
    """The loop of accelerate's gradient-accumulation example: ``prepare``, ``accumulate``, ``backward``."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACC_ACCUMULATION)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(_labelled(ACC_SAMPLES, 8, 3), batch_size=ACC_BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    native = None
    if explicit:
        from otelprof.integrations import torch as otorch

        inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    losses: list[float] = []
    updates = 0
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            losses.append(float(loss.detach()))
            if accelerator.sync_gradients:
                updates += 1
            optimizer.step()
            optimizer.zero_grad()
    if explicit:
        native = inst.native is not None and inst.native.enabled and inst.native.number > 0
    return {"losses": losses, "updates": updates, "native_held_steps": native}


def main(argv: list[str]) -> None:
    loop, mode = argv[1], argv[2]
    out_dir = str(Path(argv[3]) if len(argv) > 3 else Path.cwd() / "trainer-out")
    if loop == "accelerate":
        result = accelerate_loop(explicit=mode == "explicit")
    elif loop == "hf":
        callbacks: list[Any] = []
        if mode == "callback":
            from otelprof.integrations.transformers import OtelprofCallback

            callbacks = [OtelprofCallback()]
        result = hf_trainer(out_dir, callbacks)
    else:
        callbacks = []
        if mode == "callback":
            from otelprof.integrations.lightning import OtelprofCallback as LightningCallback

            callbacks = [LightningCallback()]
        result = lightning_trainer(out_dir, callbacks)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv)
