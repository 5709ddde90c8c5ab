"""The Trainer's log writer: a log write that fails at the validation after an epoch's last batch
(a full log disk) ends the fit only once that epoch's checkpoint is saved."""

from __future__ import annotations

import os

import pytest

from callbacks import ModelCheckpoint
from loggers import Logger
from tests._models import Classifier, loader
from trainer import Trainer


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


class FullDiskAtValidation(KeepsRows):
    """A logger whose disk fills when epoch ``full_at``'s validation values arrive."""

    def __init__(self, full_at: int) -> None:
        super().__init__()
        self.full_at = full_at

    def log_metrics(self, metrics, step=None) -> None:
        if "val_loss" in metrics and metrics.get("epoch") == self.full_at:
            raise OSError(28, "No space left on device")
        super().log_metrics(metrics, step)


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


def test_the_training_rows_hold_what_the_model_logged_and_epoch_only_as_lightnings():
    logger = KeepsRows()
    trainer = Trainer(max_epochs=1, logger=logger, log_every_n_steps=2, enable_progress_bar=False,
                      enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Classifier(), loader(64))  # 4 steps: rows at steps 1 and 3
    assert [step for step, _ in logger.rows] == [1, 3]
    # No throughput of the Trainer's own (Lightning's ThroughputMonitor logs it when a user asks).
    assert [sorted(row) for _, row in logger.rows] == [["epoch", "train_loss"]] * 2


class FinalizedRows(KeepsRows):
    """Keeps each stage's rows until ``finalize``, as a buffering logger does."""

    def __init__(self) -> None:
        super().__init__()
        self.finalized: list[str] = []

    def finalize(self, status: str) -> None:
        self.finalized.append(status)


def test_the_loggers_are_finalized_after_fit_test_and_predict_as_lightnings():
    logger = FinalizedRows()
    trainer = Trainer(max_epochs=1, logger=logger, enable_progress_bar=False, enable_checkpointing=False,
                      enable_model_summary=False)
    model = Classifier()
    trainer.fit(model, loader(32))
    trainer.test(model, loader(32), verbose=False)
    assert logger.finalized == ["success", "success"]
    rows = len(logger.rows)
    trainer.predict(model, loader(32))
    assert logger.finalized == ["success"] * 3 and len(logger.rows) == rows  # predict writes no row


def test_a_mock_logger_gets_no_call_before_setup_as_lightnings(tmp_path):
    from unittest.mock import Mock

    from callbacks import Callback

    class Checks(Callback):
        def setup(self, trainer, pl_module, stage):
            # none of the Logger methods of ours that Lightning lacks (use_trainer_dir, prepare_stage, ...)
            seen.append((list(trainer.logger.method_calls), os.listdir(tmp_path)))

    seen = []
    logger = Mock(version="0", save_dir=str(tmp_path))
    logger.name = "name"
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, limit_train_batches=1, logger=logger,
                      callbacks=[Checks()], enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Classifier(), loader(32))
    assert seen == [([], [])]
    logger.log_graph.assert_called_once()


class LogsItsGradNorm(Classifier):
    """Logs the Trainer's gradient norm itself, the way the docs show."""

    def __init__(self) -> None:
        super().__init__()
        self.norms: list[float] = []

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.log("grad_norm", self.trainer.grad_norm)
        self.norms.append(float(self.trainer.grad_norm))


def test_clipping_adds_no_grad_norm_to_the_rows_and_a_model_can_log_trainer_grad_norm_itself():
    options = dict(max_epochs=1, log_every_n_steps=2, enable_progress_bar=False, enable_checkpointing=False,
                   enable_model_summary=False, gradient_clip_val=0.01)
    logger = KeepsRows()
    trainer = Trainer(logger=logger, **options)
    trainer.fit(Classifier(), loader(64))
    assert trainer.grad_norm is not None and float(trainer.grad_norm) > 0.01  # clipped, and readable
    # Lightning logs no gradient norm of its own: a clipping Lightning script's rows hold what it logged.
    assert [sorted(row) for _, row in logger.rows] == [["epoch", "train_loss"]] * 2

    logger, model = KeepsRows(), LogsItsGradNorm()
    trainer = Trainer(logger=logger, **options)
    trainer.fit(model, loader(64))
    norms = model.norms
    assert len(set(norms)) == 4  # each step's own norm
    assert [sorted(row) for _, row in logger.rows] == [["epoch", "grad_norm", "train_loss"]] * 2
    # The row of step n holds the norm (before clipping) of the step that made it: steps 2 and 4.
    assert [row["grad_norm"] for _, row in logger.rows] == pytest.approx([norms[1], norms[3]])
