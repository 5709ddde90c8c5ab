"""LearningRateMonitor: Lightning's key names, read back from metrics.csv."""

from __future__ import annotations

import csv
import os

import pytest
import torch

from callbacks import LearningRateMonitor
from loggers import CSVLogger
from tests._models import Classifier, loader
from trainer import Trainer


class TwoOptimizers(Classifier):
    """Adam (two param groups) with a per-epoch scheduler, and an SGD with momentum."""

    def configure_optimizers(self):
        adam = torch.optim.Adam([
            {"params": self.net[0].weight}, {"params": self.net[3].parameters(), "lr": 0.01},
        ], lr=0.1, weight_decay=0.5)
        sgd = torch.optim.SGD([self.net[0].bias], lr=0.2, momentum=0.9)
        return [
            {"optimizer": adam, "lr_scheduler": torch.optim.lr_scheduler.StepLR(adam, 1, gamma=0.5), "interval": "epoch"},
            {"optimizer": sgd},
        ]


class ManualTwo(TwoOptimizers):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        x, y = batch
        for opt in self.optimizers():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(self(x), y)
            self.manual_backward(loss)
            opt.step()
        self.log("train_loss", loss)


def _rows(logger: CSVLogger) -> list[dict[str, str]]:
    with open(os.path.join(logger.log_dir, "metrics.csv"), newline="") as f:
        return list(csv.DictReader(f))


def _fit(model, monitor, max_epochs=2):
    logger = CSVLogger("logs")
    trainer = Trainer(max_epochs=max_epochs, log_every_n_steps=2, enable_progress_bar=False, enable_checkpointing=False,
                      logger=logger, callbacks=[monitor])
    trainer.fit(model, loader(64))
    return trainer, logger


def test_keys_follow_lightning_per_optimizer_and_param_group():
    monitor = LearningRateMonitor(logging_interval="step", log_momentum=True, log_weight_decay=True)
    trainer, logger = _fit(ManualTwo(), monitor)
    rows = _rows(logger)
    keys = {"lr-Adam/pg1", "lr-Adam/pg2", "lr-SGD", "lr-Adam/pg1-momentum", "lr-SGD-momentum", "lr-Adam/pg2-weight_decay"}
    assert keys <= set(rows[0])
    by_step = {int(r["step"]): r for r in rows}
    # Lightning's: before each batch whose row is logged (every 2nd), at that row's step.
    assert sorted(s for s, r in by_step.items() if r.get("lr-SGD")) == [1, 3, 5, 7]  # 8 batches
    # Manual optimization steps its own scheduler never here, so the rates stay as configured.
    assert float(by_step[1]["lr-Adam/pg1"]) == 0.1 and float(by_step[1]["lr-Adam/pg2"]) == 0.01
    assert float(by_step[1]["lr-SGD"]) == 0.2 and float(by_step[1]["lr-SGD-momentum"]) == 0.9
    assert float(by_step[1]["lr-Adam/pg1-momentum"]) == 0.9 and float(by_step[1]["lr-Adam/pg2-weight_decay"]) == 0.5
    assert monitor.lrs["lr-SGD"] == [0.2] * 4 and trainer.callback_metrics["lr-SGD"] == 0.2
    # Lightning's record of the last momentum and weight decay logged, per group
    assert monitor.last_momentum_values == {"lr-Adam/pg1-momentum": 0.9, "lr-Adam/pg2-momentum": 0.9, "lr-SGD-momentum": 0.9}
    assert monitor.last_weight_decay_values["lr-Adam/pg2-weight_decay"] == 0.5


class Scheduled(Classifier):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5), "interval": "epoch"}


def test_epoch_interval_logs_at_each_epoch_start_and_none_follows_the_scheduler():
    _, logger = _fit(Scheduled(), LearningRateMonitor(logging_interval="epoch"), max_epochs=3)
    logged = [(int(r["step"]), float(r["lr-SGD"])) for r in _rows(logger) if r.get("lr-SGD")]
    assert logged == [(0, 0.1), (4, 0.05), (8, 0.025)]
    _, logger = _fit(Scheduled(), LearningRateMonitor(), max_epochs=3)  # the scheduler steps per epoch
    assert [(int(r["step"]), float(r["lr-SGD"])) for r in _rows(logger) if r.get("lr-SGD")] == logged


def test_it_needs_a_logger_and_a_known_interval():
    with pytest.raises(ValueError, match=r"LearningRateMonitor\(logging_interval='batch'\) must be 'step', 'epoch' or None"):
        LearningRateMonitor(logging_interval="batch")
    trainer = Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False, callbacks=[LearningRateMonitor()])
    with pytest.raises(ValueError, match="LearningRateMonitor needs a logger"):
        trainer.fit(Classifier(), loader(32))


def test_lightnings_sentences_for_a_missing_momentum_and_two_groups_of_one_name(tmp_path):
    from trainer import MisconfigurationException

    class Plain(Classifier):
        def configure_optimizers(self):
            return torch.optim.Adagrad(self.parameters(), lr=0.1)

    trainer = Trainer(max_steps=1, enable_progress_bar=False, enable_checkpointing=False, log_dir=tmp_path,
                      callbacks=[LearningRateMonitor(log_momentum=True)])
    with pytest.warns(RuntimeWarning, match=r"^You have set log_momentum=True, but some optimizers do not have momentum\."):
        trainer.fit(Plain(), loader(32))

    class Twins(Classifier):
        def configure_optimizers(self):
            first, second = list(self.net.children())[0], list(self.net.children())[-1]
            return torch.optim.SGD([{"params": first.parameters(), "name": "a"}, {"params": second.parameters(), "name": "a"}], lr=0.1)

    trainer = Trainer(max_steps=1, enable_progress_bar=False, enable_checkpointing=False, log_dir=tmp_path,
                      callbacks=[LearningRateMonitor()])
    with pytest.raises(MisconfigurationException, match=r"^A single `Optimizer` cannot have multiple parameter groups with identical `name` values\. lr-SGD has duplicated parameter group names \['a'\]"):
        trainer.fit(Twins(), loader(32))


def test_a_schedulers_name_is_its_key(tmp_path):
    class Named(Classifier):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return [opt], [{"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1), "name": "my_logging_name"}]

    monitor = LearningRateMonitor()
    trainer = Trainer(max_epochs=1, enable_progress_bar=False, enable_checkpointing=False, log_dir=tmp_path, callbacks=[monitor])
    trainer.fit(Named(), loader(32))
    assert list(monitor.lrs) == ["my_logging_name"]


def test_an_optimizer_that_gains_a_group_moves_its_key_to_pg1_and_keeps_its_values_as_lightnings_does():
    from callbacks import Callback

    class Grows(Callback):
        def on_train_epoch_start(self, trainer, module):
            if trainer.current_epoch == 1:  # a finetuning callback's add_param_group, before the monitor logs
                extra = torch.nn.Parameter(torch.zeros(1))
                trainer.optimizers[0].add_param_group({"params": [extra], "lr": 0.01})

    monitor = LearningRateMonitor(logging_interval="epoch")
    trainer = Trainer(max_epochs=2, callbacks=[Grows(), monitor], logger=CSVLogger("logs"), enable_progress_bar=False,
                      enable_checkpointing=False)
    trainer.fit(Classifier(), loader(32))
    assert list(monitor.lrs) == ["lr-SGD/pg1", "lr-SGD/pg2"] and monitor.lrs["lr-SGD/pg1"] == [0.1, 0.1]
    assert monitor.lrs["lr-SGD/pg2"] == [0.01]
