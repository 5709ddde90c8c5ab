"""A small GAN that learns a ring of 8 Gaussians: two optimizers, stepped by hand.

What it shows: manual optimization (``automatic_optimization = False``) as a Lightning user
writes it, with ``self.optimizers()``, ``self.toggle_optimizer``, ``self.manual_backward`` and
each optimizer's ``step()``, under ``single`` or ``ddp`` without a change to the model. The
data is made by the code: points around a ring of 8 modes, each paired with the latent vector
the generator gets for it, so every run (and every DDP rank) draws the same latents.

Run it (from the repository root):

    python examples/gan.py                                 # about a minute on 2 CPU cores
    python examples/gan.py --strategy ddp --devices 2      # two processes (gloo on a CPU)
    tensorboard --logdir lightning_logs                           # d_loss, g_loss, val_mode_dist

At the end it prints how many of the 8 modes the generator covers and how far its samples
land from the nearest mode (in units of the modes' spread), from the model reloaded out of the
checkpoint.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from _cli import trainer_options, trainer_parser  # examples/_cli.py, next to this file
from trainer import Trainer, TrainModule, seed_everything

MODES, RADIUS, SPREAD = 8, 2.0, 0.05


def mode_centres() -> torch.Tensor:
    angles = torch.arange(MODES) * (2 * math.pi / MODES)
    return RADIUS * torch.stack([angles.cos(), angles.sin()], dim=1)


def ring_data(n: int, latent_dim: int, seed: int) -> TensorDataset:
    """``n`` (point, latent) pairs: points around the ring's modes, latents from N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    centres = mode_centres()[torch.randint(0, MODES, (n,), generator=g)]
    points = centres + SPREAD * torch.randn(n, 2, generator=g)
    return TensorDataset(points, torch.randn(n, latent_dim, generator=g))


def mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, n_out))


class RingGAN(TrainModule):
    def __init__(self, latent_dim: int = 8, hidden: int = 64, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False  # training_step steps both optimizers itself
        self.generator = mlp(latent_dim, hidden, 2)
        self.discriminator = mlp(2, hidden, 1)
        self.lr = lr

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.generator(z)

    def training_step(self, batch, batch_idx):
        real, z = batch
        opt_g, opt_d = self.optimizers()

        # The discriminator: real points score high, generated ones low. Its backward reaches
        # only its own parameters (the generated points are detached).
        fake = self(z).detach()
        d_loss = F.softplus(-self.discriminator(real)).mean() + F.softplus(self.discriminator(fake)).mean()
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()

        # The generator: fool the discriminator. toggle_optimizer keeps the discriminator's
        # parameters out of this backward.
        self.toggle_optimizer(opt_g)
        g_loss = F.softplus(-self.discriminator(self(z))).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)

        self.log_dict({"d_loss": d_loss, "g_loss": g_loss}, prog_bar=True)
        return g_loss  # for the bar and the NaN check; nothing runs backward on it

    def validation_step(self, batch, batch_idx):
        _, z = batch
        self.log("val_mode_dist", nearest_mode_distance(self(z)).mean() / SPREAD)

    def configure_optimizers(self):
        betas = (0.5, 0.999)  # the usual GAN setting: less momentum than Adam's default
        return [
            torch.optim.Adam(self.generator.parameters(), lr=self.lr, betas=betas),
            torch.optim.Adam(self.discriminator.parameters(), lr=self.lr, betas=betas),
        ]


def nearest_mode_distance(points: torch.Tensor) -> torch.Tensor:
    return torch.cdist(points.float(), mode_centres().to(points.device)).min(dim=1).values


@torch.no_grad()
def coverage(model: RingGAN, n: int = 2000, seed: int = 0) -> tuple[int, float]:
    """(modes that got at least 2% of ``n`` samples within 4 spreads, median distance in spreads)."""
    model.eval()
    z = torch.randn(n, model.hparams["latent_dim"], generator=torch.Generator().manual_seed(seed))
    points = model(z)
    dist = torch.cdist(points, mode_centres())
    nearest = dist.argmin(dim=1)[dist.min(dim=1).values < 4 * SPREAD]
    counts = torch.bincount(nearest, minlength=MODES)
    return int((counts >= 0.02 * n).sum()), float(dist.min(dim=1).values.median() / SPREAD)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = trainer_parser(
        __doc__,
        examples=[
            "python examples/gan.py --max-steps 300                 # a quick look",
            "python examples/gan.py --strategy ddp --devices 2      # two processes (gloo on a CPU)",
        ],
        strategy="auto", strategy_help="auto (DDP over the GPUs when there are 2 or more, else one device), single or ddp",
        devices_default="auto", devices_help="'auto', a count such as 2, or GPU indices such as 0,1 (on a CPU: processes under ddp)",
        max_epochs=20, batch_size=128, batch_size_help="points per step (per process under ddp)",
    )
    p.add_argument("--samples", type=int, default=16384, help="training points around the ring")
    p.add_argument("--latent-dim", type=int, default=8, help="size of the generator's input noise")
    p.add_argument("--hidden", type=int, default=64, help="width of both networks' two hidden layers")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate, for both networks")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    seed_everything(args.seed)  # the initial weights; Trainer(seed=...) covers the run
    train = DataLoader(ring_data(args.samples, args.latent_dim, seed=args.seed), batch_size=args.batch_size, shuffle=True)
    val = DataLoader(ring_data(1024, args.latent_dim, seed=args.seed + 1), batch_size=256)
    model = RingGAN(latent_dim=args.latent_dim, hidden=args.hidden, lr=args.lr)
    trainer = Trainer(**trainer_options(args, log_every_n_steps=10))
    trainer.fit(model, train, val)

    path = trainer.checkpoint_callback.last_model_path
    reloaded = RingGAN.load_from_checkpoint(path)  # both networks, built from the saved hparams
    modes, median = coverage(reloaded)
    print(
        f"\nafter {trainer.global_step} optimizer steps ({trainer.state.batches_stepped} batches, each a discriminator "
        f"and a generator step): the generator covers "
        f"{modes} of {MODES} modes; its samples' median distance to the nearest mode is {median:.1f} spreads"
    )
    print(f"checkpoint: {path}\nTensorBoard logs: {trainer.run_dir}  (tensorboard --logdir {args.log_dir})")


if __name__ == "__main__":  # DDP workers re-import this file; only the parent runs main()
    main()
