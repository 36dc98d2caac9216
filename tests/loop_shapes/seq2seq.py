"""An encoder and a decoder, each with its own optimizer (as in PyTorch's sequence-to-sequence translation tutorial):
per batch both forwards, one loss (``nn.NLLLoss``) and ``backward()``, then ``encoder_optimizer.step()`` and
``decoder_optimizer.step()`` back to back; afterwards a few sentences are evaluated under ``torch.no_grad()``,
the encoder then the decoder, without a DataLoader. One step per batch, holding both optimizer regions; the loss,
all given to ``backward()`` before the encoder's update, is also the encoder optimizer's own (the decoder's has
none). Each evaluated sentence is one eval step with both forwards."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from tests.loop_shapes import OTHER_FORWARD, Account, Instrument, run_as_script

WORDS, HIDDEN, LENGTH = 12, 16, 5


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(WORDS, HIDDEN)
        self.gru = torch.nn.GRU(HIDDEN, HIDDEN, batch_first=True)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        output, hidden = self.gru(self.embedding(tokens))
        return output, hidden


class Decoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(WORDS, HIDDEN)
        self.gru = torch.nn.GRU(HIDDEN, HIDDEN, batch_first=True)
        self.out = torch.nn.Linear(HIDDEN, WORDS)

    def forward(self, encoder_outputs: torch.Tensor, hidden: torch.Tensor,
                target: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        batch = encoder_outputs.size(0)
        inputs = torch.zeros(batch, 1, dtype=torch.long)
        outputs = []
        for i in range(LENGTH):
            output, hidden = self.gru(F.relu(self.embedding(inputs)), hidden)
            output = self.out(output)
            outputs.append(output)
            inputs = target[:, i].unsqueeze(1) if target is not None else output.argmax(-1).detach()
        return F.log_softmax(torch.cat(outputs, dim=1), dim=-1), hidden


def main(instrument: Instrument | None = None) -> Account:
    torch.manual_seed(0)
    pairs = TensorDataset(torch.randint(1, WORDS, (40, LENGTH)), torch.randint(1, WORDS, (40, LENGTH)))
    loader = DataLoader(pairs, sampler=RandomSampler(pairs), batch_size=8)
    encoder, decoder = Encoder(), Decoder()
    encoder_optimizer = torch.optim.Adam(encoder.parameters(), lr=1e-3)
    decoder_optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-3)
    criterion = torch.nn.NLLLoss()
    if instrument is not None:
        instrument(model=encoder, optimizer=encoder_optimizer, dataloader=loader)
        instrument(model=decoder, optimizer=decoder_optimizer)
    account = Account()
    for _epoch in range(2):
        for input_tensor, target_tensor in loader:
            account.step("train")
            account.samples(len(input_tensor))
            encoder_optimizer.zero_grad()
            decoder_optimizer.zero_grad()
            encoder_outputs, encoder_hidden = encoder(input_tensor)
            decoder_outputs, _ = decoder(encoder_outputs, encoder_hidden, target_tensor)
            loss = criterion(decoder_outputs.view(-1, WORDS), target_tensor.view(-1))
            loss.backward()
            encoder_optimizer.step()
            decoder_optimizer.step()
            account.did("dataloader", "forward", "forward", OTHER_FORWARD, "backward", "optimizer", "optimizer")
            account.backward_loss(loss, 0)
    with torch.no_grad():
        for sentence in torch.randint(1, WORDS, (3, 1, LENGTH)):
            account.step("eval")
            encoder_outputs, encoder_hidden = encoder(sentence)
            decoder(encoder_outputs, encoder_hidden)
            account.did("forward", "forward")
    return account


if __name__ == "__main__":
    run_as_script(main)
