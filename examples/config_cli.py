"""A one-file project driven by a YAML config: the ``main.py`` that many Lightning repositories are.

    python examples/config_cli.py fit --config examples/config_cli.yaml
    python examples/config_cli.py fit --config examples/config_cli.yaml --trainer.max_epochs=5 --model.hidden=64
    python examples/config_cli.py fit --config examples/config_cli.yaml --trainer.strategy=ddp --trainer.devices=2
    python examples/config_cli.py fit --help                      # every model, data and Trainer argument
    python examples/config_cli.py fit --config examples/config_cli.yaml --print_config
    python examples/config_cli.py test --config examples/config_cli.yaml --ckpt_path=<a .ckpt file>

The run folder (``lightning_logs/version_<n>``) gets ``config.yaml``, the full config, which
``--config`` reads back to repeat the run. Needs the ``cli`` extra: ``pip install ".[cli]"``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import DataModule, TrainModule
from trainer.cli import TrainerCLI


class Blobs(DataModule):
    """Points around ``classes`` centres in ``features`` dimensions, split into train/val/test.

    Args:
        samples: How many points to draw in all.
        features: The number of input features.
        classes: The number of centres (and labels).
        batch_size: Samples per batch.
    """

    def __init__(self, samples: int = 512, features: int = 8, classes: int = 3, batch_size: int = 32) -> None:
        super().__init__()
        self.samples, self.features, self.classes, self.batch_size = samples, features, classes, batch_size

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(0)
        centres = torch.randn(self.classes, self.features, generator=g) * 3
        y = torch.randint(0, self.classes, (self.samples,), generator=g)
        x = centres[y] + torch.randn(self.samples, self.features, generator=g)
        n = self.samples // 8
        self.train, self.val, self.test = (TensorDataset(x[a:b], y[a:b]) for a, b in ((2 * n, None), (0, n), (n, 2 * n)))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test, batch_size=self.batch_size)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.test, batch_size=self.batch_size)


class MLP(TrainModule):
    """A two-layer classifier.

    Args:
        features: The number of input features.
        hidden: Units in the hidden layer.
        classes: The number of labels.
        lr: Adam's learning rate (unless --optimizer is given).
    """

    def __init__(self, features: int = 8, hidden: int = 32, classes: int = 3, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(-1) == y).float().mean())

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self(x).argmax(-1) == y).float().mean())

    def predict_step(self, batch, batch_idx):
        return self(batch[0]).argmax(-1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class CLI(TrainerCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # The data decides the shapes; the model follows (one value, set in one place).
        parser.link_arguments("data.features", "model.features")
        parser.link_arguments("data.classes", "model.classes")

    def after_fit(self) -> None:
        if self.trainer.is_global_zero:
            print(f"val_acc={self.trainer.callback_metrics.get('val_acc', float('nan')):.3f}")


if __name__ == "__main__":
    CLI(MLP, Blobs, save_config_kwargs={"overwrite": True})
