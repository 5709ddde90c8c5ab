"""A Lightning project written every way Python allows importing Lightning, and the same project renamed by hand.

The package ``litpkg`` (relative imports) holds the module, the data and a callback; ``train.py`` trains it
from Python, ``cli_main.py`` with ``config.yaml`` through LightningCLI. Each import spelling of issue 57 is
here once: ``import lightning as L`` with ``L.pytorch.callbacks.ModelCheckpoint``, ``import pytorch_lightning as pl``,
``from lightning.pytorch import LightningModule as LM``, a submodule path, an import inside a function, a
``TYPE_CHECKING`` block, ``import lightning.pytorch``, ``from lightning.pytorch import loggers as pl_loggers``,
and ``class_path`` strings in YAML.
"""

from __future__ import annotations

INIT = '''"""A small regression project."""
from .data import RandomData
from .model import LitRegressor
'''

DATA = '''import torch
from torch.utils.data import DataLoader, TensorDataset

import {pl_import} as pl


class RandomData(pl.{datamodule}):
    def __init__(self, n: int = 64, batch_size: int = 8):
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.hparams.n, 4, generator=g)
        y = x.sum(1, keepdim=True) + 0.1 * torch.randn(self.hparams.n, 1, generator=g)
        self.train_set, self.val_set = TensorDataset(x, y), TensorDataset(x[:16], y[:16])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)
'''

MODEL = '''from __future__ import annotations

from typing import TYPE_CHECKING

import torch

{lm_import}  # the base class, under a short name

if TYPE_CHECKING:
    {trainer_import}


class LitRegressor(LM):
    def __init__(self, hidden: int = 8, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def on_train_end(self):
        {rank_zero_import}

        @rank_zero_only
        def say():
            print("trained", self.global_step, "steps")

        say()

    def fitted_by(self) -> Trainer:
        return self.trainer
'''

RECORDER = '''{callback_import}


class Recorder(BaseCallback):
    """What the run did, epoch by epoch."""

    def __init__(self):
        self.events = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.events.append([trainer.current_epoch, trainer.global_step, float(trainer.callback_metrics["val_loss"])])
'''

TRAIN = '''import json

import torch

{header}
from litpkg import LitRegressor, RandomData
from litpkg.recorder import Recorder


def main():
    L.seed_everything(7)
    recorder = Recorder()
    callbacks = [
        recorder,
        EarlyStopping(monitor="val_loss", patience=10),
        {checkpoint}(dirpath="ckpts", monitor="val_loss", save_top_k=2),
    ]
    trainer = {trainer}(
        max_epochs=3, logger=pl_loggers.CSVLogger("logs"), callbacks=callbacks,
        enable_progress_bar=False, enable_model_summary=False,
    )
    assert not isinstance(trainer.logger, TensorBoardLogger)
    model = LitRegressor()
    trainer.fit(model, datamodule=RandomData())
    torch.save(model.state_dict(), "weights.pt")
    metrics = {{k: float(v) for k, v in trainer.callback_metrics.items()}}
    best = callbacks[2].best_model_score
    with open("out.json", "w") as f:
        json.dump({{"events": recorder.events, "metrics": metrics, "best": float(best)}}, f, sort_keys=True)


if __name__ == "__main__":
    main()
'''

CLI = '''import torch

{cli_import}

from litpkg import LitRegressor, RandomData

if __name__ == "__main__":
    cli = LightningCLI(LitRegressor, RandomData, save_config_kwargs={{"overwrite": True}})
    torch.save(cli.model.state_dict(), "cli_weights.pt")
'''

CONFIG = '''# trained by cli_main.py
seed_everything: 3
trainer:
  max_epochs: 2
  enable_progress_bar: false
  enable_model_summary: false
  logger:
    class_path: {csv}
    init_args:
      save_dir: cli_logs
  callbacks:
    - class_path: {early}   # stops on a plateau
      init_args:
        monitor: val_loss
        patience: 5
    - {{class_path: "{checkpoint}", init_args: {{dirpath: cli_ckpts, monitor: val_loss}}}}
model:
  hidden: 6
'''

LIGHTNING_NAMES = {
    "pl_import": "pytorch_lightning", "datamodule": "LightningDataModule",
    "lm_import": "from lightning.pytorch import LightningModule as LM",
    "trainer_import": "from lightning.pytorch import Trainer",
    "rank_zero_import": "from lightning.pytorch.utilities import rank_zero_only",
    "callback_import": "from lightning.pytorch.callbacks.callback import Callback as BaseCallback",
    "header": "import lightning as L\nimport lightning.pytorch\nfrom lightning.pytorch import loggers as pl_loggers\n"
              "from lightning.pytorch.callbacks.early_stopping import EarlyStopping\n"
              "from lightning.pytorch.loggers.tensorboard import TensorBoardLogger",
    "checkpoint": "L.pytorch.callbacks.ModelCheckpoint", "trainer": "lightning.pytorch.Trainer",
    "cli_import": "from lightning.pytorch.cli import LightningCLI",
    "csv": "lightning.pytorch.loggers.CSVLogger", "early": "pytorch_lightning.callbacks.early_stopping.EarlyStopping",
    "config_checkpoint": "lightning.pytorch.callbacks.ModelCheckpoint",
}

# What a user renaming by hand, with docs/migrating-from-lightning.md's table, writes.
BY_HAND_NAMES = {
    "pl_import": "trainer", "datamodule": "DataModule",
    "lm_import": "from trainer import TrainModule as LM",
    "trainer_import": "from trainer import Trainer",
    "rank_zero_import": "from trainer import rank_zero_only",
    "callback_import": "from callbacks import Callback as BaseCallback",
    "header": "import trainer as L\nimport loggers as pl_loggers\nfrom callbacks import EarlyStopping, ModelCheckpoint\n"
              "from loggers import TensorBoardLogger",
    "checkpoint": "ModelCheckpoint", "trainer": "L.Trainer",
    "cli_import": "from trainer.cli import LightningCLI",
    "csv": "loggers.CSVLogger", "early": "callbacks.EarlyStopping", "config_checkpoint": "callbacks.ModelCheckpoint",
}


def project(names: dict[str, str]) -> dict[str, str]:
    """The project's files (relative path -> text), with ``names`` filling in the import spellings."""
    config = CONFIG.format(csv=names["csv"], early=names["early"], checkpoint=names["config_checkpoint"])
    return {
        "litpkg/__init__.py": INIT,
        "litpkg/data.py": DATA.format(**names),
        "litpkg/model.py": MODEL.format(**names),
        "litpkg/recorder.py": RECORDER.format(**names),
        "train.py": TRAIN.format(**names),
        "cli_main.py": CLI.format(**names),
        "config.yaml": config,
    }


def write(folder, files: dict[str, str]) -> None:
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
