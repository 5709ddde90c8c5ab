"""What the epoch's end hooks see and what they log, as in Lightning: the epoch's values in
``callback_metrics``, torchmetrics Metrics not yet reset (lightning-hydra-template's ``val/acc_best``),
and values logged in ``on_train_epoch_end`` kept under their own names."""

from __future__ import annotations

import pytest
import torch
import torchmetrics
from torch import nn

from loggers import Logger
from tests._models import Classifier, loader
from trainer import Trainer


class Rows(Logger):
    """A user's logger that keeps every row it is given."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self):
        return "rows"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))


class HydraTemplate(Classifier):
    """lightning-hydra-template's pattern: accuracies as Metrics, the best one kept by a MaxMetric."""

    def __init__(self) -> None:
        super().__init__()
        self.train_acc = torchmetrics.Accuracy(task="binary")
        self.val_acc = torchmetrics.Accuracy(task="binary")
        self.val_acc_best = torchmetrics.MaxMetric()
        self.seen: dict[str, list[float]] = {"val_loss": [], "val_acc": [], "train_acc": []}
        self.last_loss = 0.0

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = nn.functional.cross_entropy(logits, y)
        self.last_loss = float(loss)
        self.train_acc(logits.argmax(-1), y)
        self.log("train_loss", loss)  # the defaults: a step value
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.val_acc(logits.argmax(-1), y)
        self.log("val/acc", self.val_acc)

    def on_validation_epoch_end(self):
        self.seen["val_loss"].append(self.trainer.callback_metrics["val_loss"])
        acc = self.val_acc.compute()  # the epoch's accuracy: not reset yet
        self.seen["val_acc"].append(float(acc))
        self.val_acc_best(acc)
        self.log("val/acc_best", self.val_acc_best.compute(), prog_bar=True)

    def on_train_epoch_end(self):
        self.seen["train_acc"].append(float(self.train_acc.compute()))
        self.log("most", torch.tensor(3.0), reduce_fx="max")
        self.log("most_builtin", 4.0, reduce_fx=max)
        self.log("most_torch", torch.tensor(5.0), reduce_fx=torch.max)
        self.log("epochs_done", float(self.current_epoch + 1))


def test_epoch_end_hooks_see_the_epochs_values_and_metrics_are_reset_after_them():
    model, rows = HydraTemplate(), Rows()
    trainer = Trainer(max_epochs=2, logger=rows, enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0)
    trainer.fit(model, loader(64), loader(64, batch_size=32))
    cm = trainer.callback_metrics
    # on_validation_epoch_end read the epoch's val_loss; compute() there gave the epoch's accuracy, not 0.
    assert model.seen["val_loss"][-1] == pytest.approx(cm["val_loss"])
    assert model.seen["val_acc"][-1] == pytest.approx(cm["val/acc"]) and model.seen["val_acc"][-1] > 0
    assert cm["val/acc_best"] == pytest.approx(max(model.seen["val_acc"]))
    assert model.seen["train_acc"][-1] == pytest.approx(cm["train/acc"]) and model.seen["train_acc"][-1] > 0
    # The Metrics were reset after the hooks: each epoch computed its own batches only.
    assert model.train_acc._update_count == 0 and model.val_acc._update_count == 0
    # A value logged in training_step with the defaults: its last step's, as Lightning leaves it.
    assert cm["train_loss"] == pytest.approx(model.last_loss)
    # Values logged in on_train_epoch_end, with reduce_fx max (any spelling): kept, under their own names.
    assert (cm["most"], cm["most_builtin"], cm["most_torch"], cm["epochs_done"]) == (3.0, 4.0, 5.0, 2.0)
    written = {name for _, row in rows.rows for name in row}
    assert {"most", "most_builtin", "most_torch", "epochs_done", "train/acc", "val/acc_best"} <= written
    assert not {"most_epoch", "epochs_done_epoch", "train/acc_epoch"} & written
    assert [row["epochs_done"] for _, row in rows.rows if "epochs_done" in row] == [1.0, 2.0]
