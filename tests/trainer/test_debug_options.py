"""The quick-debug options (sanity check, fast_dev_run, overfit_batches), the model summary,
and values that callbacks log at the epoch's end."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from callbacks import Callback, ModelCheckpoint, ModelSummary, ProgressBar
from tests._models import Classifier, dataset, loader, quiet
from trainer import Trainer


class Counted(Classifier):
    """Counts its steps, and the validation steps that ran before the first training step."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.train_steps = self.val_steps = self.val_before_training = 0

    def training_step(self, batch, batch_idx):
        self.train_steps += 1
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.val_steps += 1
        self.val_before_training += self.train_steps == 0
        return super().validation_step(batch, batch_idx)


def _fit(model, **options):
    torch.manual_seed(0)
    shuffled = DataLoader(dataset(64), batch_size=8, shuffle=True)
    trainer = Trainer(**quiet(max_epochs=2, **options))
    trainer.fit(model, shuffled, DataLoader(dataset(48), batch_size=8, shuffle=True))
    return trainer


def test_the_sanity_check_runs_two_validation_batches_first_and_changes_nothing_in_training():
    torch.manual_seed(0)
    checked, plain = Counted(dropout=0.5), Counted(dropout=0.5)
    plain.load_state_dict(checked.state_dict())
    trainer = _fit(checked)
    _fit(plain, num_sanity_val_steps=0)
    assert checked.val_before_training == 2 and plain.val_before_training == 0
    # Dropout, shuffling and the val loader's draws: every RNG was put back, so the weights are equal.
    assert all(torch.equal(a, b) for a, b in zip(checked.state_dict().values(), plain.state_dict().values()))
    assert _fit(Counted(), num_sanity_val_steps=-1).module.val_before_training == 6  # -1: all of it
    assert trainer.callback_metrics["val_loss"] == pytest.approx(trainer.logged_metrics["val_loss"].item())


def test_the_sanity_checks_values_are_not_kept_and_callbacks_see_its_validation_hooks_as_in_lightning():
    seen = []

    class Watch(Callback):
        def on_sanity_check_start(self, trainer, module):
            seen.append(("start", trainer.sanity_checking))

        def on_validation_start(self, trainer, module):
            seen.append(("validation", trainer.sanity_checking))

        def on_sanity_check_end(self, trainer, module):
            seen.append(("end", trainer.sanity_checking))

    model = Counted()
    trainer = Trainer(**quiet(max_epochs=1, check_val_every_n_epoch=None, callbacks=[Watch()]))
    trainer.fit(model, loader(32), loader(32))
    # Lightning 2.6.6 records [start, validation, ..., end] with sanity_checking True throughout.
    assert model.val_steps == 2 and seen == [("start", True), ("validation", True), ("end", True)]
    assert "val_loss" not in trainer.callback_metrics


def test_a_broken_validation_step_fails_before_any_training():
    class Broken(Counted):
        def validation_step(self, batch, batch_idx):
            raise KeyError("typo")

    model = Broken()
    with pytest.raises(KeyError, match="typo"):
        Trainer(**quiet(max_epochs=5)).fit(model, loader(), loader())
    assert model.train_steps == 0


def test_fast_dev_run_runs_one_batch_of_each_and_writes_nothing(capfd, trainer_log):
    model = Counted()
    checkpoint = ModelCheckpoint(dirpath="ckpts", monitor="not_logged", save_last=True, every_n_train_steps=1)
    trainer = Trainer(max_epochs=50, fast_dev_run=True, callbacks=[checkpoint, ProgressBar()])
    trainer.fit(model, loader(64), loader(32))
    assert (model.train_steps, model.val_steps, trainer.global_step) == (1, 1, 1)
    assert os.listdir(".") == []  # no runs/, no checkpoints, not even the configured ModelCheckpoint's
    # which stays among the callbacks, as in Lightning, and saved nothing (nor asked for its monitor)
    assert trainer.checkpoint_callback is checkpoint and checkpoint in trainer.callbacks
    assert checkpoint.best_model_path == checkpoint.last_model_path == ""
    assert trainer_log[-1] == (
        "fast_dev_run=1: trained on 1 batch(es) (1 optimizer step(s)) and validated on up to 1 batch(es) of each "
        "validation loader; wrote no logs and no checkpoints."
    )
    out, err = capfd.readouterr()
    assert "Trainable params" in out  # the summary (rich's, the default with rich) and the bar stay, as in Lightning
    assert "epoch 0 done" in err
    assert trainer.fast_dev_run is True and Trainer(fast_dev_run=1).fast_dev_run is True  # Lightning's reading back
    model = Counted()
    Trainer(fast_dev_run=3).fit(model, loader(64), loader(32))
    assert (model.train_steps, model.val_steps) == (3, 2)  # the validation loader has 2 batches
    assert len(Trainer(fast_dev_run=2).predict(model, loader(64, 8))) == 2
    with pytest.raises(ValueError, match=r"fast_dev_run=-1 must be True \(one batch of each loader\), False, or a number"):
        Trainer(fast_dev_run=-1)


class Recorder(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.train_x: list[torch.Tensor] = []
        self.val_x: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        self.train_x.append(batch[0])
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.val_x.append(batch[0])
        return super().validation_step(batch, batch_idx)


def test_overfit_batches_trains_and_validates_on_the_same_first_batches_every_epoch():
    model = Recorder()
    shuffled = DataLoader(dataset(64), batch_size=8, shuffle=True)
    val = DataLoader(dataset(64, seed=5), batch_size=8, shuffle=True)
    with pytest.warns(UserWarning, match=r"You requested to overfit but enabled train dataloader shuffling"):
        Trainer(**quiet(max_epochs=3, overfit_batches=2, num_sanity_val_steps=0)).fit(model, shuffled, val)
    x, val_x = dataset(64).tensors[0], dataset(64, seed=5).tensors[0]
    expected = [x[:8], x[8:16]] * 3
    assert len(model.train_x) == 6 and all(torch.equal(a, b) for a, b in zip(model.train_x, expected))
    # Validation on the validation loader's first 2 batches, in order, as Lightning 2 does
    assert len(model.val_x) == 6 and all(torch.equal(a, b) for a, b in zip(model.val_x, [val_x[:8], val_x[8:16]] * 3))


class Frozen(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(2, 2)  # 6 parameters
        self.head.requires_grad_(False)


def test_the_model_summary_lists_top_level_modules_and_counts_frozen_parameters(trainer_log):
    Trainer(max_steps=1, **quiet(callbacks=[ModelSummary()])).fit(Frozen(), loader(32))  # the logged table
    err = next(line for line in trainer_log if "Trainable params" in line)
    assert "0 | net  | Sequential | 178    | train | 0" in err and "1 | head | Linear     | 6      | train | 0" in err
    assert "178       Trainable params" in err and "6         Non-trainable params" in err
    assert "184       Total params" in err and "0.001     Total estimated model params size (MB)" in err
    trainer_log.clear()
    Trainer(max_steps=1, **quiet(enable_model_summary=False)).fit(Frozen(), loader(32))
    assert not any("Trainable params" in line for line in trainer_log)
    Trainer(max_steps=1, **quiet(callbacks=[ModelSummary(max_depth=2)])).fit(Frozen(), loader(32))
    assert any("net.0 | Linear" in line for line in trainer_log)


class LogsAtEpochEnd(Callback):
    def on_train_epoch_end(self, trainer, module):
        module.log("from_callback", float(trainer.current_epoch))


def test_a_callback_logs_in_on_train_epoch_end_and_a_checkpoint_monitors_it():
    trainer = Trainer(
        max_epochs=3, enable_progress_bar=False,
        callbacks=[LogsAtEpochEnd(), ModelCheckpoint(monitor="from_callback", mode="max", save_top_k=1)],
    )
    trainer.fit(Classifier(), loader(32))
    assert trainer.callback_metrics["from_callback"] == 2.0
    assert "epoch=2" in trainer.checkpoint_callback.best_model_path


def test_fast_dev_run_gives_code_that_uses_the_logger_a_stand_in_that_writes_nothing():
    from loggers import DummyLogger

    class UsesLogger(Counted):
        def training_step(self, batch, batch_idx):
            self.logger.experiment.add_scalar("custom", 1.0, self.global_step)  # a TensorBoard call, as in Lightning scripts
            self.loggers[0].experiment[0].add_text("note", "x")
            return super().training_step(batch, batch_idx)

    trainer = Trainer(fast_dev_run=True)
    trainer.fit(UsesLogger(), loader(64))
    assert isinstance(trainer.logger, DummyLogger) and os.listdir(".") == []
    assert Trainer(fast_dev_run=True, logger=False).logger is None


def test_the_dummy_logger_takes_any_call_with_any_arguments():
    from loggers import DummyLogger

    logger = DummyLogger()
    assert logger.log_hyperparams("1", 2, three="three") is None and logger.log_metrics("1", 2, three="three") is None
    assert logger.log_text("key", columns=["a"], data=[[1]]) is None  # a method of another logger (WandbLogger's)


def test_fast_dev_run_logs_every_step_as_lightning_does():
    class Logs(Classifier):
        def training_step(self, batch, batch_idx):
            self.log("a", 2.0, on_step=True, on_epoch=True)
            return super().training_step(batch, batch_idx)

    seen = []

    class Rows(Callback):
        def on_train_log(self, trainer, pl_module, metrics):
            seen.append(trainer.global_step)

    trainer = Trainer(fast_dev_run=3, callbacks=[Rows()])  # far fewer steps than log_every_n_steps=50
    trainer.fit(Logs(), loader(64))
    assert seen == [1, 2, 3] and {"a_step", "a_epoch"} <= set(trainer.logged_metrics)
