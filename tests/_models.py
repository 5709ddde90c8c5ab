"""Small models and data shared by the tests. Module-level, so DDP workers can unpickle them."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import TrainModule


def dataset(n: int = 128, features: int = 8, classes: int = 2, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g))


def loader(n: int = 128, batch_size: int = 16, shuffle: bool = False, **kwargs) -> DataLoader:
    return DataLoader(dataset(n), batch_size=batch_size, shuffle=shuffle, **kwargs)


class Classifier(TrainModule):
    """An MLP classifier; ``dropout`` > 0 makes the run depend on the RNG."""

    def __init__(self, features: int = 8, hidden: int = 16, classes: int = 2, dropout: float = 0.0, lr: float = 0.1, optimizer: str = "sgd") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, classes))
        self.lr, self.optimizer_name = lr, optimizer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx, dataloader_idx=0):  # the index comes with several loaders
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(-1) == y).float().mean())

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.log("test_loss", nn.functional.cross_entropy(self(x), y))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x).argmax(-1)

    def configure_optimizers(self):
        if self.optimizer_name == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.lr)
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def quiet(**kwargs) -> dict:
    """Trainer options for tests that don't look at logs: no bar, no TensorBoard, no files (no
    default ModelCheckpoint: one given in ``callbacks`` is the test's, and Lightning refuses it
    beside ``enable_checkpointing=False``)."""
    from callbacks import ModelCheckpoint

    given = kwargs.get("callbacks") or []
    given = given if isinstance(given, (list, tuple)) else [given]
    base: dict = dict(enable_progress_bar=False, log_dir=None)
    if not any(isinstance(cb, ModelCheckpoint) for cb in given):
        base["enable_checkpointing"] = False
    base.update(kwargs)
    return base


def gan_loader(n: int = 64, batch_size: int = 8, seed: int = 2) -> DataLoader:
    """(real sample, latent) pairs: the latents are data, so every run and rank draws the same."""
    g = torch.Generator().manual_seed(seed)
    real = torch.randn(n, 3, generator=g) * 0.5 + 1.0
    return DataLoader(TensorDataset(real, torch.randn(n, 4, generator=g)), batch_size=batch_size)


class TinyGAN(TrainModule):
    """A generator and a discriminator stepped by hand, as a GAN is: the discriminator's backward
    reaches only its own parameters; the generator's goes through the discriminator."""

    def __init__(self, lr: float = 0.05, clip: float | None = None, step_every: int = 1) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Linear(4, 3)
        self.discriminator = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        self.lr, self.clip, self.step_every = lr, clip, step_every

    def training_step(self, batch, batch_idx):
        real, z = batch
        opt_g, opt_d = self.optimizers()
        if batch_idx % self.step_every:
            return None  # no optimizer steps on this batch
        fake = self.generator(z)
        d_loss = (nn.functional.softplus(-self.discriminator(real)).mean()
                  + nn.functional.softplus(self.discriminator(fake.detach())).mean())
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        if self.clip is not None:
            self.clip_gradients(opt_d, gradient_clip_val=self.clip)
        opt_d.step()
        g_loss = nn.functional.softplus(-self.discriminator(self.generator(z))).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss})
        return g_loss

    def configure_optimizers(self):
        return [torch.optim.SGD(self.generator.parameters(), lr=self.lr),
                torch.optim.Adam(self.discriminator.parameters(), lr=self.lr)]
