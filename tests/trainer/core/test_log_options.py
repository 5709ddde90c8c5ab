"""self.log's Lightning keywords (trainer/core/log_options.py): on_step/on_epoch per hook, the
name_step/name_epoch pair, reduce_fx, logger=False, add_dataloader_idx, torchmetrics Metrics,
and the sentences for what cannot be logged."""

from __future__ import annotations

import csv
import os
import re
import pytest
import torch
import torchmetrics
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from tests._models import Classifier, loader, quiet
from trainer import Trainer



class Keywords(Classifier):
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("both", loss, on_step=True, on_epoch=True, prog_bar=True)
        self.log("epoch_only", loss, on_step=False, on_epoch=True)
        self.log("step_only", loss, on_epoch=False)
        self.log("hidden", 7.0, logger=False)
        self.log("total", 1.0, reduce_fx="sum", on_epoch=True, on_step=False)
        self.log("biggest", float(batch_idx), reduce_fx=torch.max, on_step=False)
        return loss

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))
        self.log("val_step_too", 1.0, on_step=True)
        self.log("shared", 2.0, add_dataloader_idx=False)
        self.log("val_hidden", 3.0, logger=False)


def test_keywords_name_the_values_as_lightning_and_keep_logger_false_out_of_tensorboard():
    model = Keywords()
    trainer = Trainer(max_epochs=2, log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(model, loader(64), [loader(32), loader(16)])  # 4 training batches per epoch
    cm = trainer.callback_metrics
    assert {"both", "both_step", "both_epoch", "epoch_only", "step_only", "hidden", "total", "biggest"} <= set(cm)
    assert "epoch_only_step" not in cm and "step_only_epoch" not in cm
    assert cm["total"] == 4.0 and cm["biggest"] == 3.0 and cm["hidden"] == 7.0
    assert cm["both"] == cm["both_epoch"]  # at the epoch's end the plain name is the epoch value
    assert cm["shared"] == 2.0 and "val_loss/dataloader_idx_0" in cm and "val_loss/dataloader_idx_1" in cm
    assert "val_step_too_epoch/dataloader_idx_0" in cm and "val_hidden/dataloader_idx_1" in cm
    assert "hidden" not in trainer.train_epoch_metrics and "val_hidden/dataloader_idx_0" not in trainer.logged_metrics
    acc = EventAccumulator(trainer.run_dir)
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"both_step", "both_epoch", "step_only", "epoch_only", "total", "biggest", "shared"} <= tags  # Lightning's names
    assert not {t for t in tags if "hidden" in t}  # logger=False: callback_metrics only
    assert not {"both_epoch_epoch", "epoch_only_epoch", "total_epoch", "step_only_epoch"} & tags
    assert len(acc.Scalars("both_step")) == 8  # every step (log_every_n_steps=1)


class WithMetric(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.train_acc = torchmetrics.classification.BinaryAccuracy()
        self.val_acc = torchmetrics.classification.BinaryAccuracy()
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.train_acc(logits.argmax(-1), y)
        self.log("train_acc", self.train_acc, on_step=True, on_epoch=True)
        return nn.functional.cross_entropy(logits, y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        preds = self(x).argmax(-1)
        self.seen.append((preds, y))
        self.val_acc.update(preds, y)
        self.log("val_acc", self.val_acc)


def test_a_torchmetrics_metric_is_computed_at_the_epoch_end_and_reset():
    model = WithMetric()
    trainer = Trainer(max_epochs=1, num_sanity_val_steps=0, log_every_n_steps=1, **quiet())
    trainer.fit(model, loader(64), loader(48, batch_size=20))  # batches of 20, 20, 8: a mean of means would differ
    preds = torch.cat([p for p, _ in model.seen])
    target = torch.cat([t for _, t in model.seen])
    assert trainer.callback_metrics["val_acc"] == pytest.approx((preds == target).float().mean().item())
    assert "train_acc_epoch" in trainer.callback_metrics and "train_acc_step" in trainer.callback_metrics
    assert model.val_acc.update_count == 0 and model.train_acc.update_count == 0  # reset after compute


class ReducesWithDefaults(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.acc = torchmetrics.classification.BinaryAccuracy()
        self.step_acc: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.step_acc.append(float(self.acc(logits.argmax(-1), y)))
        self.log("most", float(batch_idx), reduce_fx="max")
        self.log("total", float(batch_idx), reduce_fx="sum")
        self.log("least", -float(batch_idx), reduce_fx=torch.min)
        self.log("acc", self.acc)
        return nn.functional.cross_entropy(logits, y)


def test_reduce_fx_and_a_metric_in_training_step_with_the_defaults_are_step_values_only_as_lightnings(tmp_path):
    from loggers import CSVLogger

    model = ReducesWithDefaults()
    trainer = Trainer(max_epochs=1, log_every_n_steps=1, logger=CSVLogger(tmp_path), **quiet())
    trainer.fit(model, loader(64))  # 4 batches
    with open(os.path.join(trainer.log_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    # Lightning's training_step defaults are on_step=True, on_epoch=False whatever reduce_fx is: one row per
    # step with that step's values, and no epoch row holding the epoch's max, sum or min (or the Metric's compute).
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3]
    assert [float(r["most"]) for r in rows] == [0.0, 1.0, 2.0, 3.0]
    assert [float(r["total"]) for r in rows] == [0.0, 1.0, 2.0, 3.0]
    assert [float(r["least"]) for r in rows] == [0.0, -1.0, -2.0, -3.0]
    assert [float(r["acc"]) for r in rows] == pytest.approx(model.step_acc)
    assert not {h for h in rows[0] if h.endswith(("_step", "_epoch"))}
    cm = trainer.callback_metrics  # the last step's values
    assert (cm["most"], cm["total"], cm["least"]) == (3.0, 3.0, -3.0)
    assert cm["acc"].item() == pytest.approx(model.step_acc[-1])
    assert not trainer.train_epoch_metrics


def _fit_logging(value, where="training_step"):
    class Logs(Classifier):
        def training_step(self, batch, batch_idx):
            if where == "training_step":
                self.log("bad", value)
            return super().training_step(batch, batch_idx)

        def configure_optimizers(self):
            if where == "configure_optimizers":
                self.log("lr", 0.1)
            return super().configure_optimizers()

    Trainer(max_steps=1, **quiet()).fit(Logs(), loader(16))


def test_what_cannot_be_logged_gets_a_sentence_naming_the_call():
    with pytest.raises(TypeError, match=r"self.log\('bad', value='text'\).*Strings are not logged"):
        _fit_logging("text")
    # Lightning's sentence first, and its ValueError: an `except ValueError` written for Lightning catches it.
    for value in (None, {"a": 1}, [1, 2, 3]):
        with pytest.raises(ValueError, match=re.escape(f"`self.log(bad, {value})` was called, but")):
            _fit_logging(value)
    with pytest.raises(ValueError, match=r"self.log\('bad', value\).*shape \(3,\).*value.mean\(\)"):
        _fit_logging(torch.ones(3))
    with pytest.raises(RuntimeError, match=r"self.log\('lr', ...\) was called from Logs.configure_optimizers"):
        _fit_logging(None, where="configure_optimizers")
    with pytest.raises(ValueError, match=r"reduce_fx must be 'mean', 'sum', 'max' or 'min'"):
        Trainer(max_steps=1, **quiet()).fit(_Reduce(), loader(16))


class _Reduce(Classifier):
    def training_step(self, batch, batch_idx):
        self.log("x", 1.0, reduce_fx="median")
        return super().training_step(batch, batch_idx)


def test_log_dict_takes_the_same_keywords():
    class LogsDict(Classifier):
        def validation_step(self, batch, batch_idx):
            self.log_dict({"a": 1.0, "b": 2.0}, prog_bar=True, on_step=True, on_epoch=True, logger=False)

    trainer = Trainer(max_epochs=1, num_sanity_val_steps=0, **quiet())
    trainer.validate(LogsDict(), loader(32))
    assert trainer.callback_metrics["a_epoch"] == 1.0 and trainer.callback_metrics["b"] == 2.0
    assert trainer.logged_metrics == {} and {"a_epoch", "b_epoch"} <= trainer.prog_bar_names


class Indexes(Classifier):
    def training_step(self, batch, batch_idx):
        self.log("idx", float(batch_idx), on_step=True, on_epoch=True, logger=False)
        return super().training_step(batch, batch_idx)


def test_a_mid_epoch_checkpoint_keeps_the_keywords_of_what_was_logged():
    from callbacks import ModelCheckpoint

    Trainer(max_steps=2, callbacks=[ModelCheckpoint(dirpath="ck", save_last=True)], **quiet(enable_checkpointing=True)).fit(Indexes(), loader(64))
    resumed = Trainer(max_epochs=1, callbacks=[ModelCheckpoint(dirpath="ck")], **quiet(enable_checkpointing=True))
    resumed.fit(Indexes(), loader(64), ckpt_path="ck/last.ckpt")  # batches 2 and 3 of the 4
    assert resumed.callback_metrics["idx_epoch"] == 1.5  # the mean of 0, 1, 2, 3: both halves, still named idx_epoch
    assert "idx" not in resumed.train_epoch_metrics and "idx_epoch" not in resumed.logged_metrics  # still logger=False


class LogsAtTrainStart(Classifier):
    def on_train_start(self):
        self.log("foo", 123.0)


def test_a_value_logged_in_on_train_start_is_the_first_epochs_and_written_at_its_end(tmp_path):
    from loggers import CSVLogger

    trainer = Trainer(max_epochs=2, log_every_n_steps=1, logger=CSVLogger(tmp_path), enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(LogsAtTrainStart(), loader(32))  # 2 steps an epoch
    with open(os.path.join(trainer.log_dir, "metrics.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r["foo"]]
    assert [(r["step"], r["foo"], r["epoch"]) for r in rows] == [("1", "123.0", "0")]  # the first epoch's end only
    assert trainer.callback_metrics["foo"].item() == 123.0


def test_logging_with_neither_on_step_nor_on_epoch_is_lightnings_error_with_the_fix():
    from trainer import MisconfigurationException

    class Useless(Classifier):
        def training_step(self, batch, batch_idx):
            self.log("x", 1.0, on_step=False, on_epoch=False)
            return super().training_step(batch, batch_idx)

    with pytest.raises(MisconfigurationException, match=r"^`self.log\(on_step=False, on_epoch=False\)` is not useful\. .*on_epoch=True"):
        Trainer(**quiet(max_steps=1)).fit(Useless(), loader(32))


class _NamedLoader(Classifier):
    def __init__(self, add_dataloader_idx: bool) -> None:
        super().__init__()
        self.add_idx = add_dataloader_idx

    def training_step(self, batch, batch_idx):
        self.log("foo/dataloader_idx_0", 1.0, add_dataloader_idx=self.add_idx)
        return super().training_step(batch, batch_idx)


def test_lightnings_misconfiguration_for_a_bad_reduce_fx_and_a_name_with_its_loader():
    from trainer.core.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match=re.escape("Only `self.log(..., reduce_fx={min,max,mean,sum})` are supported.")):
        Trainer(max_steps=1, **quiet()).fit(_Reduce(), loader(16))
    with pytest.raises(MisconfigurationException, match="`self.log` with the key `foo/dataloader_idx_0`.*add_dataloader_idx=False"):
        Trainer(max_steps=1, **quiet()).fit(_NamedLoader(True), loader(16))
    trainer = Trainer(max_steps=1, **quiet())
    trainer.fit(_NamedLoader(False), loader(16))  # the user's own name, kept as given
    assert float(trainer.callback_metrics["foo/dataloader_idx_0"]) == 1.0



class LogsAMetric(Classifier):
    """Logs a torchmetrics Metric under "acc": its own ``self.acc``, or one held in a list, which
    is none of the module's attributes (a list's items are not submodules)."""

    def __init__(self, own: bool, logs_own: bool, metric_attribute: str | None = None) -> None:
        super().__init__()
        if own:
            self.acc = torchmetrics.classification.BinaryAccuracy()
        self.logged = [self.acc if logs_own else torchmetrics.classification.BinaryAccuracy()]
        self.metric_attribute = metric_attribute

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.logged[0](self(x).argmax(-1), y)
        self.log("acc", self.logged[0], metric_attribute=self.metric_attribute)
        return super().training_step(batch, batch_idx)


def test_a_logged_metric_must_be_an_attribute_of_the_module_as_lightnings():
    from trainer.core.exceptions import MisconfigurationException

    lightnings = "Could not find the `LightningModule` attribute for the `torchmetrics.Metric` logged. "
    with pytest.raises(MisconfigurationException, match=re.escape(lightnings + "You can fix this by setting an attribute")):
        Trainer(max_steps=1, **quiet()).fit(LogsAMetric(own=False, logs_own=False), loader(16))
    with pytest.raises(MisconfigurationException, match=re.escape("metric_attribute=name)` where `name` is one of ['acc']")):
        Trainer(max_steps=1, **quiet()).fit(LogsAMetric(own=True, logs_own=False), loader(16))
    for model in (LogsAMetric(own=True, logs_own=True), LogsAMetric(own=False, logs_own=False, metric_attribute="x")):
        trainer = Trainer(max_steps=1, **quiet())
        trainer.fit(model, loader(16))  # the module's own metric, or one named by metric_attribute
        assert "acc" in trainer.callback_metrics


class LogsEpoch(Classifier):
    """Logs its own ``epoch`` (``-batch_idx``), as Lightning's test does, with ``logger`` as given."""

    def __init__(self, **log_options) -> None:
        super().__init__()
        self.log_options = log_options

    def training_step(self, batch, batch_idx):
        self.log("epoch", -batch_idx, **self.log_options)
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("logger", [False, True])
def test_logged_metrics_hold_the_last_steps_values_with_or_without_a_logger_as_lightnings(tmp_path, logger):
    from loggers import CSVLogger

    trainer = Trainer(max_epochs=1, limit_train_batches=2, enable_progress_bar=False, enable_checkpointing=False,
                      logger=CSVLogger(tmp_path) if logger else False)  # 2 steps: no logging step (every 50)
    trainer.fit(LogsEpoch(), loader(64))
    assert set(trainer.logged_metrics) == {"epoch", "train_loss"}  # the Classifier logs train_loss
    assert trainer.logged_metrics["epoch"] == -1  # the user's own epoch, not replaced by the Trainer's


def test_logger_true_without_a_logger_is_lightnings_warning(recwarn):
    trainer = Trainer(max_epochs=1, limit_train_batches=2, enable_progress_bar=False, enable_checkpointing=False,
                      logger=False)
    with pytest.warns(UserWarning, match=re.escape("You called `self.log('epoch', ..., logger=True)` but have no logger")):
        trainer.fit(LogsEpoch(logger=True), loader(64))
    recwarn.clear()
    trainer = Trainer(max_epochs=1, limit_train_batches=2, enable_progress_bar=False, enable_checkpointing=False,
                      logger=False)
    trainer.fit(LogsEpoch(), loader(64))  # logger left at its default: no warning
    assert not [w for w in recwarn if "have no logger" in str(w.message)]


class LogsTwice(Classifier):
    def __init__(self, second_prog_bar: bool) -> None:
        super().__init__()
        self.second_prog_bar = second_prog_bar

    def training_step(self, batch, batch_idx):
        self.log("foo", 1.0, prog_bar=False)
        self.log("foo", 2.0, prog_bar=self.second_prog_bar)
        return super().training_step(batch, batch_idx)


def test_a_name_logged_twice_with_another_prog_bar_is_lightnings_error_naming_the_hook():
    from trainer.core.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match=re.escape("`self.log(foo, ...)` twice in `training_step`")):
        Trainer(max_steps=1, **quiet()).fit(LogsTwice(second_prog_bar=True), loader(16))
    trainer = Trainer(max_steps=1, **quiet())
    trainer.fit(LogsTwice(second_prog_bar=False), loader(16))  # the same keywords: the later value
    assert float(trainer.callback_metrics["foo"]) == 2.0


def test_a_tensor_of_several_elements_is_lightnings_error():
    class LogsVector(Classifier):
        def on_train_start(self):
            self.log("foo", torch.tensor([1.0, 2.0]))

    with pytest.raises(ValueError, match="was called, but the tensor must have a single element"):
        Trainer(max_steps=1, **quiet()).fit(LogsVector(), loader(16))
