"""One training script, run on either side of the checkpoint round trip.

``python _checkpoint_script.py SIDE write FOLDER``: train 2 epochs of 8 steps, saving every 3
steps and at each epoch's end, then ``trainer.save_checkpoint(FOLDER/end.ckpt)``.
``python _checkpoint_script.py SIDE read OUT FILE...``: load each FILE as a user would (the
model's and the DataModule's ``load_from_checkpoint``, ``test(ckpt_path=...)``,
``fit(ckpt_path=...)``) and write what each saw to ``OUT/<FILE's name>.json``. One process reads
them all: importing Lightning takes seconds.

SIDE is ``lightning`` (the real package: only this process imports it) or ``ours`` (this
project, through the renamed imports of docs/migrating-from-lightning.md): the code below is
the same for both, as a Lightning user's script is.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SIDE = sys.argv[1]
if SIDE == "lightning":
    import lightning as L
    from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint

    LightningModule, LightningDataModule, Trainer = L.LightningModule, L.LightningDataModule, L.Trainer
else:
    import trainer as T
    from callbacks import Callback, EarlyStopping, ModelCheckpoint

    LightningModule, LightningDataModule, Trainer = T.TrainModule, T.DataModule, T.Trainer

g = torch.Generator().manual_seed(0)
X = torch.randn(96, 8, generator=g)
Y = X.sum(1, keepdim=True)
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


class Net(LightningModule):
    def __init__(self, lr: float = 0.1, hidden: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.seen_extra = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]

    def on_save_checkpoint(self, checkpoint):
        checkpoint["vocabulary"] = ["a", "b"]

    def on_load_checkpoint(self, checkpoint):
        self.seen_extra = checkpoint.get("vocabulary")


class Data(LightningDataModule):
    def __init__(self, batch_size: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.served = 0

    def train_dataloader(self):
        self.served += 1
        return DataLoader(TensorDataset(X[:64], Y[:64]), batch_size=self.hparams.batch_size)

    def val_dataloader(self):
        return DataLoader(TensorDataset(X[64:], Y[64:]), batch_size=16)

    def test_dataloader(self):
        return self.val_dataloader()

    def state_dict(self):
        return {"served": self.served + 100}

    def load_state_dict(self, state_dict):
        self.served = state_dict["served"]


class Counter(Callback):
    """A callback with state, and the checkpoint hooks in the order they ran."""

    def __init__(self) -> None:
        self.count, self.calls = 0, []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.count += 1

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state_dict):
        self.calls.append("load_state_dict")
        self.count = state_dict["count"]

    def on_load_checkpoint(self, trainer, module, checkpoint):
        self.calls.append("on_load_checkpoint")


class Start(Callback):
    """Where fit started: the counters, the first batch, the optimizer and the scheduler."""

    def on_train_start(self, trainer, module):
        opt = trainer.optimizers[0]
        self.seen = {
            "epoch": trainer.current_epoch, "step": trainer.global_step,
            "lr": opt.param_groups[0]["lr"], "scheduler_epoch": trainer.lr_scheduler_configs[0].scheduler.last_epoch,
            "momentum": [opt.state[p]["momentum_buffer"].flatten().tolist() for p in module.parameters() if p in opt.state],
            "weights": [p.detach().flatten().tolist() for p in module.parameters()],
        }

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.seen.setdefault("first_batch", batch_idx)


def callbacks(folder=None):
    """The stateful callbacks, then the checkpoints (Lightning runs ModelCheckpoint last anyway)."""
    saves = [] if folder is None else [
        ModelCheckpoint(dirpath=folder, every_n_train_steps=3, save_top_k=-1),
        ModelCheckpoint(dirpath=folder, filename="{epoch}-end", monitor="val_loss", save_top_k=-1),
    ]
    return [EarlyStopping("val_loss", patience=5), Counter(), Start(), *saves]


def write(folder: str) -> None:
    torch.manual_seed(0)
    trainer = Trainer(max_epochs=2, default_root_dir=folder, callbacks=callbacks(folder), **QUIET)
    trainer.fit(Net(lr=0.02, hidden=6), datamodule=Data(batch_size=8))  # a rate that does not diverge
    trainer.save_checkpoint(os.path.join(folder, "end.ckpt"))


def read_one(path: str, out: str) -> None:
    model = Net.load_from_checkpoint(path)
    data = Data.load_from_checkpoint(path)
    seen = {
        "hparams": dict(model.hparams), "data_hparams": dict(data.hparams), "data_served": data.served,
        "weights": [p.detach().flatten().tolist() for p in model.parameters()], "extra": model.seen_extra,
    }
    tester = Trainer(default_root_dir=out + ".runs", **QUIET)
    seen["test"] = tester.test(Net(hidden=6), datamodule=Data(batch_size=8), ckpt_path=path, verbose=False)[0]
    seen["test_ckpt_path"] = os.fspath(tester.ckpt_path)
    resumed = callbacks()
    stopper, counter, start = resumed  # Lightning's Trainer appends its default ones to the list
    data = Data(batch_size=8)
    trainer = Trainer(max_epochs=3, default_root_dir=out + ".runs", callbacks=resumed, **QUIET)
    module = Net(hidden=6)
    trainer.fit(module, datamodule=data, ckpt_path=path)
    seen.update(
        start=start.seen, end=[trainer.current_epoch, trainer.global_step], fit_ckpt_path=os.fspath(trainer.ckpt_path),
        fit_extra=module.seen_extra, calls=counter.calls, count_at_start=counter.count - (trainer.global_step - start.seen["step"]),
        data_served_at_start=data.served - 1 if data.served > 100 else None, stopper_best=float(stopper.best_score),
    )
    with open(out, "w") as f:
        json.dump(seen, f)


def read(out: str, *paths: str) -> None:
    for path in paths:
        read_one(path, os.path.join(out, os.path.basename(path) + ".json"))


if __name__ == "__main__":
    {"write": write, "read": read}[sys.argv[2]](*sys.argv[3:])
