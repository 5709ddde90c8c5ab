"""What a run sets up for its callbacks: ``self.log`` in their hooks (Lightning's)."""

from __future__ import annotations

import copy
import pickle

from callbacks import Callback
from tests._models import Classifier, loader, quiet
from trainer import Trainer


class _Logs(Callback):
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.log("cb_epoch_start", 2.0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.log("cb_batch_end", float(batch_idx), prog_bar=True)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self.log_dict({"cb_val_a": 1.0, "cb_val_b": 4.0})


class _OwnLog(Callback):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, text: str) -> None:  # a callback's own method of that name
        self.lines.append(text)

    def on_train_start(self, trainer, pl_module) -> None:
        self.log("started")


def test_callbacks_log_into_the_run_as_the_module_does():
    cb = _Logs()
    trainer = Trainer(**quiet(max_epochs=1, limit_train_batches=3, limit_val_batches=2, callbacks=[cb]))
    trainer.fit(Classifier(), loader(64), loader(32))
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert metrics["cb_epoch_start"] == 2.0 and metrics["cb_batch_end"] == 2.0  # the last batch's
    assert metrics["cb_val_a"] == 1.0 and metrics["cb_val_b"] == 4.0
    assert "cb_batch_end" in trainer.progress_bar_metrics
    copy.deepcopy(cb), pickle.dumps(cb)  # no model rides along with the callback


class _OwnList(Callback):
    def __init__(self) -> None:
        self.log: list[str] = []  # an attribute of that name

    def on_train_end(self, trainer, pl_module) -> None:
        self.log.append("ended")


def test_a_callbacks_own_log_is_kept():
    own, listed = _OwnLog(), _OwnList()
    Trainer(**quiet(max_epochs=1, limit_train_batches=1, callbacks=[own, listed])).fit(Classifier(), loader(16))
    assert own.lines == ["started"] and listed.log == ["ended"]
