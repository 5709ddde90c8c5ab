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

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(-1) == y).float().mean())

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.cross_entropy(self(x), y))

    def predict_step(self, batch, batch_idx):
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x).argmax(-1)

    def configure_optimizers(self):
        if self.optimizer_name == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.lr)
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def quiet(**kwargs) -> dict:
    """Trainer options for tests that don't look at logs: no bar, no TensorBoard, no files."""
    base = dict(enable_progress_bar=False, log_dir=None, enable_checkpointing=False)
    base.update(kwargs)
    return base
