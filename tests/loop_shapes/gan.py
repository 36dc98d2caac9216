"""Two optimizers (as in PyTorch's DCGAN example): per batch, the discriminator's update (real and fake batches,
two ``backward()`` calls, ``optimizerD.step()``), then the generator's (``optimizerG.step()``); the losses
from a loss module (``nn.BCELoss``). A step is one iteration, as the loop counts them: one per batch, holding both
updates. Its loss is all its ``backward()`` losses; each update's own loss (the discriminator's
``errD_real + errD_fake``, the generator's ``errG``, which the loop prints as Loss_D and Loss_G) is the optimizer's
own, under the number of the optimizer in the order they first step."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.loop_shapes import OTHER_FORWARD, Account, Instrument, run_as_script

NOISE = 4
D, G = 0, 1
"""The optimizers' numbers: the discriminator's steps first."""


def main(instrument: Instrument | None = None) -> Account:
    torch.manual_seed(0)
    net_g = torch.nn.Sequential(torch.nn.Linear(NOISE, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8), torch.nn.Tanh())
    net_d = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, 1),
                                torch.nn.Sigmoid())
    criterion = torch.nn.BCELoss()
    optimizer_d = torch.optim.Adam(net_d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizer_g = torch.optim.Adam(net_g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    loader = DataLoader(TensorDataset(torch.randn(80, 8).tanh()), batch_size=16, shuffle=True)
    if instrument is not None:
        instrument(model=net_d, optimizer=optimizer_d, dataloader=loader)
        instrument(model=net_g, optimizer=optimizer_g)
    account = Account()
    for _epoch in range(2):
        for (real,) in loader:
            batch = real.size(0)
            account.step("train")
            account.samples(batch)
            # (1) the discriminator: maximize log(D(x)) + log(1 - D(G(z)))
            net_d.zero_grad()
            label = torch.full((batch, 1), 1.0)
            output = net_d(real)
            err_d_real = criterion(output, label)
            err_d_real.backward()
            noise = torch.randn(batch, NOISE)
            fake = net_g(noise)
            label.fill_(0.0)
            output = net_d(fake.detach())
            err_d_fake = criterion(output, label)
            err_d_fake.backward()
            optimizer_d.step()
            account.did("dataloader", "forward", OTHER_FORWARD, "backward", "forward", "forward", OTHER_FORWARD,
                        "backward", "optimizer")
            account.backward_loss(err_d_real, D)
            account.backward_loss(err_d_fake, D)
            # (2) the generator: maximize log(D(G(z)))
            net_g.zero_grad()
            label.fill_(1.0)
            output = net_d(fake)
            err_g = criterion(output, label)
            err_g.backward()
            optimizer_g.step()
            account.did("forward", OTHER_FORWARD, "backward", "optimizer")
            account.backward_loss(err_g, G)
    return account


if __name__ == "__main__":
    run_as_script(main)
