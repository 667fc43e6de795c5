"""A GAN trained as the PyTorch DCGAN tutorial trains one, on synthetic data: a generator
``netG`` and a discriminator ``netD``, each with its own Adam. Each iteration steps the
discriminator (on real data and on a detached fake), then the generator (through the
discriminator, whose gradients it also fills). With ``--critic N`` the discriminator
steps N times for each generator step, as a WGAN's critic does. With ``--container`` both
networks are attributes of one ``nn.Module`` that is never called itself, as many GAN
programs hold them (the loop calls ``gan.netG`` and ``gan.netD``). Nothing in it knows
candle_trace: `candle-trace run -- python gan.py` traces it as it is.

With GAN_GRAD_NORMS=FILE set, each iteration appends ``{"update": n, "norms":
{parameter: |grad|}}`` to FILE once the generator has stepped, named as the trace names
them (``netG.0.weight``).

    python gan.py [--updates N] [--critic N] [--generator-first] [--container]
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Dict, Optional

import torch
from torch import nn
from torch.nn import functional as F

LATENT, DATA, HIDDEN, BATCH = 8, 16, 32, 16


class GAN(nn.Module):
    """The two networks in one module, which has no forward: the loop calls each."""

    def __init__(self, netG: nn.Module, netD: nn.Module) -> None:
        super().__init__()
        self.netG, self.netD = netG, netD


def main() -> None:
    global netG, netD, gan
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=5)
    ap.add_argument("--critic", type=int, default=1)
    ap.add_argument("--generator-first", action="store_true",
                    help="create the generator's optimizer first")
    ap.add_argument("--container", action="store_true",
                    help="hold both networks in one nn.Module that is never called")
    args = ap.parse_args()
    torch.manual_seed(0)
    netG = nn.Sequential(nn.Linear(LATENT, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, DATA))
    netD = nn.Sequential(nn.Linear(DATA, HIDDEN), nn.LeakyReLU(0.2), nn.Linear(HIDDEN, 1))
    if args.container:  # the loop still calls netG and netD: the module's own attributes
        gan = GAN(netG, netD)
    if args.generator_first:
        optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
        optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    else:
        optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
        optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    real_label, fake_label = torch.ones(BATCH, 1), torch.zeros(BATCH, 1)
    norms_path: Optional[str] = os.environ.get("GAN_GRAD_NORMS")
    for update in range(1, args.updates + 1):
        for _ in range(args.critic):
            real = torch.randn(BATCH, DATA) * 0.5 + 1.0
            fake = netG(torch.randn(BATCH, LATENT))
            optD.zero_grad()
            loss_d = F.binary_cross_entropy_with_logits(netD(real), real_label) + \
                F.binary_cross_entropy_with_logits(netD(fake.detach()), fake_label)
            loss_d.backward()
            optD.step()
        optG.zero_grad()
        loss_g = F.binary_cross_entropy_with_logits(netD(fake), real_label)
        loss_g.backward()
        optG.step()
        if norms_path:
            norms: Dict[str, Optional[float]] = {
                f"{name}.{n}": None if p.grad is None else float(p.grad.norm())
                for name, net in (("netG", netG), ("netD", netD))
                for n, p in net.named_parameters()}
            with open(norms_path, "a") as f:
                f.write(json.dumps({"update": update, "norms": norms}) + "\n")
        print(f"update {update}: loss_d {loss_d.item():.4f} loss_g {loss_g.item():.4f}")


if __name__ == "__main__":
    main()
