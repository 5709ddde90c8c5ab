"""A Lightning script that logs to TensorBoard and CSV, monitors the learning rate and stops early
at a threshold runs here with only its imports renamed."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

LIGHTNING_SCRIPT = '''
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger


class LitClassifier(LightningModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.lr = lr
        self.layer = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.layer(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return DataLoader(TensorDataset(x, (x.sum(1) > 0).long()), batch_size=16)


if __name__ == "__main__":
    seed_everything(0)
    tb_logger = TensorBoardLogger("logs", name="classifier")
    csv_logger = CSVLogger("logs", name="classifier_csv")
    stopper = EarlyStopping(monitor="val_loss", mode="min", patience=100, stopping_threshold=0.45)
    trainer = Trainer(
        max_epochs=40,
        logger=[tb_logger, csv_logger],
        callbacks=[LearningRateMonitor(logging_interval="step"), stopper],
        log_every_n_steps=2,
        enable_progress_bar=False,
    )
    trainer.fit(LitClassifier(), data(64, 1), data(64, 2))
    print("STOPPED", trainer.current_epoch, trainer.early_stopping_callback.stopping_reason_message)
    print("LOGDIR", trainer.log_dir, csv_logger.log_dir)
'''

# The only change a user makes: the imports.
RENAMES = {
    "from lightning.pytorch import LightningModule, Trainer, seed_everything":
        "from trainer import TrainModule as LightningModule, Trainer, seed_everything",
    "from lightning.pytorch.callbacks import": "from callbacks import",
    "from lightning.pytorch.loggers import": "from loggers import",
}


@pytest.mark.slow
def test_a_lightning_script_with_loggers_lr_monitor_and_a_stopping_threshold_runs_renamed(tmp_path, script_env):
    script = LIGHTNING_SCRIPT
    for old, new in RENAMES.items():
        assert old in script
        script = script.replace(old, new)
    path = tmp_path / "train.py"
    path.write_text(script)
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=script_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("STOPPED", "LOGDIR")))
    epoch, reason = lines["STOPPED"].split(" ", 1)
    assert int(epoch) < 39 and reason.startswith("Stopping threshold reached: val_loss = ")
    tb_dir, csv_dir = lines["LOGDIR"].split()
    assert tb_dir == os.path.join("logs", "classifier", "version_0")
    assert csv_dir == os.path.join("logs", "classifier_csv", "version_0")

    acc = EventAccumulator(str(tmp_path / tb_dir))
    acc.Reload()
    lrs = [e.value for e in acc.Scalars("lr-Adam")]
    assert lrs[0] == pytest.approx(0.05) and min(lrs) < 0.049  # the scheduler's steps show
    assert {"train_loss", "val_loss", "hp_metric"} <= set(acc.Tags()["scalars"])

    with open(tmp_path / csv_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {"lr-Adam", "train_loss", "val_loss", "step"} <= set(rows[0])
    assert float([r for r in rows if r["val_loss"]][-1]["val_loss"]) < 0.45
    assert (tmp_path / csv_dir / "hparams.yaml").read_text() == "lr: 0.05\n"
    assert (tmp_path / tb_dir / "checkpoints").is_dir()  # under the first logger's version
