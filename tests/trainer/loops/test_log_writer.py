"""The Trainer's log writer: a log write that fails at the validation after an epoch's last batch
(a full log disk) ends the fit only once that epoch's checkpoint is saved."""

from __future__ import annotations

import os

import pytest

from callbacks import ModelCheckpoint
from loggers import Logger
from tests._models import Classifier, loader
from trainer import Trainer


class FullDiskAtValidation(Logger):
    """A logger whose disk fills when epoch ``full_at``'s validation values arrive."""

    def __init__(self, full_at: int) -> None:
        super().__init__()
        self.full_at = full_at

    @property
    def name(self) -> str:
        return "full"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        if "val_loss" in metrics and metrics.get("epoch") == self.full_at:
            raise OSError(28, "No space left on device")


@pytest.mark.parametrize("save_on_train_epoch_end", [None, True])
def test_a_log_write_failing_after_the_last_batch_s_validation_keeps_that_epoch_s_checkpoint(
    tmp_path, save_on_train_epoch_end
):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1,
                                 save_on_train_epoch_end=save_on_train_epoch_end)
    trainer = Trainer(max_epochs=5, logger=FullDiskAtValidation(full_at=2), callbacks=[checkpoint],
                      log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(OSError, match="No space left on device"):
        trainer.fit(Classifier(), loader(64), loader(32))
    assert sorted(os.listdir(tmp_path)) == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt", "epoch=2-step=12.ckpt"]


class KeepsRows(Logger):
    """A logger that keeps every row it is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    @property
    def name(self) -> str:
        return "rows"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.rows.append((step, dict(metrics)))


def test_the_training_rows_hold_what_the_model_logged_and_epoch_only_as_lightnings():
    logger = KeepsRows()
    trainer = Trainer(max_epochs=1, logger=logger, log_every_n_steps=2, enable_progress_bar=False,
                      enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Classifier(), loader(64))  # 4 steps: rows at steps 1 and 3
    assert [step for step, _ in logger.rows] == [1, 3]
    # No throughput of the Trainer's own (Lightning's ThroughputMonitor logs it when a user asks).
    assert [sorted(row) for _, row in logger.rows] == [["epoch", "train_loss"]] * 2
