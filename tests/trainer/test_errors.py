"""Bad input fails at construction or at the start of fit, with a sentence that names the argument."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from tests._models import Classifier, dataset, loader, quiet
from trainer import Trainer, TrainModule
from trainer.core.exceptions import MisconfigurationException


@pytest.mark.parametrize(
    "options, error, words",
    [
        (dict(strategy="dpp"), ValueError, ["'dpp'", "'ddp'", "Did you mean 'ddp'"]),
        (dict(strategy=3), TypeError, ["strategy=3"]),
        (dict(precision="bf61"), ValueError, ["precision='bf61'", "'bf16-mixed'"]),
        (dict(precision="16"), None, []),  # alias of "16-mixed" is accepted at construction
        (dict(max_epochs=0), ValueError, ["max_epochs=0", ">= 1"]),
        (dict(max_epochs=-2), ValueError, ["max_epochs=-2"]),
        (dict(max_epochs=1.5), TypeError, ["max_epochs=1.5", "int"]),
        (dict(max_steps=0), ValueError, ["max_steps=0"]),
        (dict(devices=0), ValueError, ["devices=0", "at least 1"]),
        (dict(devices=-2), ValueError, ["devices=-2"]),  # -1 is Lightning's "all devices"
        (dict(devices="two"), ValueError, ["devices='two'", "'auto'"]),
        (dict(devices=2, strategy="single"), ValueError, ["devices=2", "strategy='single'", "ddp"]),
        (dict(devices=[7]), ValueError, ["devices=", "7", "does not exist"]),
        (dict(accumulate_grad_batches=0), ValueError, ["accumulate_grad_batches=0"]),
        (dict(gradient_clip_val=-1.0), ValueError, ["gradient_clip_val=-1.0"]),
        (dict(gradient_clip_algorithm="l2"), ValueError, ["gradient_clip_algorithm='l2'", "'norm'", "'value'"]),
        (dict(log_every_n_steps=0), ValueError, ["log_every_n_steps=0"]),
        (dict(val_check_interval=1.5), ValueError, ["val_check_interval=1.5"]),
        (dict(limit_train_batches=-1), ValueError, ["limit_train_batches=-1"]),
        (dict(limit_val_batches=2.0), ValueError, ["limit_val_batches=2.0"]),
        (dict(enable_progress_bar="yes"), TypeError, ["enable_progress_bar='yes'"]),
        (dict(callbacks=[object()]), TypeError, ["callbacks", "Callback"]),
        (dict(log_dir=5), TypeError, ["log_dir=5"]),
        (dict(optimizer="adam"), TypeError, ["optimizer='adam'", "lambda params"]),
    ],
)
def test_trainer_options_are_checked_at_construction(options, error, words):
    if error is None:
        Trainer(**options)
        return
    with pytest.raises(error) as info:
        Trainer(**options)
    for word in words:
        assert word in str(info.value)


class NoStep(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 2)


class NoConfigure(TrainModule):  # (configure_optimizers returning None runs with no optimizer, as in Lightning)
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()


class Junk(Classifier):
    def configure_optimizers(self):
        return "adam"


class Returns(Classifier):
    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return {"none": None, "vector": loss.repeat(3), "detached": loss.detach(), "string": "loss"}[self.what]


@pytest.mark.parametrize(
    "model, error, words",
    [
        (nn.Linear(8, 2), TypeError, ["Linear", "training_step"]),
        ("not a model", TypeError, ["torch.nn.Module", "str"]),
        (NoStep(), TypeError, ["NoStep", "training_step"]),
        (NoConfigure(), ValueError, ["No `configure_optimizers()` method defined", "Trainer(optimizer=", "lambda params"]),
        (Junk(), TypeError, ["'adam'", "configure_optimizers", "dict(optimizer="]),
        (Returns("string"), TypeError, ["'loss'", "dict with a 'loss'"]),
        (Returns("vector"), ValueError, ["shape (3,)", "loss.mean()"]),
        (Returns("detached"), ValueError, ["does not require grad", ".detach()"]),
    ],
)
def test_bad_models_fail_at_the_start_of_fit(model, error, words):
    with pytest.raises(error) as info:
        Trainer(**quiet(max_steps=1)).fit(model, loader())
    for word in words:
        assert word in str(info.value)


def test_missing_ckpt_path_is_named():
    with pytest.raises(ValueError, match="ckpt_path='nowhere.ckpt' does not exist"):
        Trainer(**quiet(max_steps=1)).fit(Classifier(), loader(), ckpt_path="nowhere.ckpt")


def test_empty_loader_is_refused_before_training():
    empty = DataLoader(dataset(4), batch_size=8, drop_last=True)
    with pytest.raises(ValueError, match="train_dataloaders is empty"):
        Trainer(**quiet(max_steps=1)).fit(Classifier(), empty)


def test_not_a_loader():
    with pytest.raises(TypeError, match="train_dataloaders=3 is not iterable"):
        Trainer(**quiet(max_steps=1)).fit(Classifier(), 3)


def test_log_without_a_trainer_warns_and_records_nothing_so_a_step_can_be_unit_tested():
    model = Classifier()
    with pytest.warns(UserWarning, match=r"^You are trying to `self.log\(\)` but the `self.trainer` reference is not registered"):
        model.log("x", 1.0)
    with pytest.warns(UserWarning, match="hasn't been passed to the `Trainer`"):
        loss = model.training_step(next(iter(loader(16))), 0)  # Classifier's training_step logs train_loss
    assert loss.ndim == 0


def test_log_in_a_hook_that_logs_nothing_is_lightnings_error_naming_the_hook():
    from trainer import MisconfigurationException

    class LogsAtFitStart(Classifier):
        def on_fit_start(self):
            self.log("x", 1.0)

    with pytest.raises(MisconfigurationException, match=r"^You can't `self.log\(\)` inside `on_fit_start`. .*LogsAtFitStart.on_fit_start") as raised:
        Trainer(**quiet(max_steps=1)).fit(LogsAtFitStart(), loader())
    assert isinstance(raised.value, RuntimeError)  # as before
    model = Classifier()
    Trainer(**quiet(max_steps=1)).fit(model, loader())
    with pytest.raises(MisconfigurationException, match=r"^You are trying to `self.log\(\)` but it is not managed by the `Trainer` control flow"):
        model.training_step(next(iter(loader(16))), 0)  # after fit: attached, but no stage runs


class LogsInRefusedHooks(Classifier):
    """Tries self.log in each hook where Lightning refuses it, and keeps each refusal's message."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: dict[str, str] = {}

    def _try(self, hook: str) -> None:
        try:
            self.log("x", 1.0)
        except MisconfigurationException as err:
            self.refused[hook] = str(err)

    def on_validation_model_eval(self):
        super().on_validation_model_eval()
        self._try("on_validation_model_eval")

    def on_validation_end(self):
        self._try("on_validation_end")

    def on_test_end(self):
        self._try("on_test_end")

    def on_save_checkpoint(self, checkpoint):
        self._try("on_save_checkpoint")

    def lr_scheduler_step(self, scheduler, metric):
        scheduler.step()
        self._try("lr_scheduler_step")

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]

    def predict_step(self, batch, batch_idx):
        self._try("predict_step")
        return super().predict_step(batch, batch_idx)


def test_log_in_a_hook_where_lightning_refuses_it_is_lightnings_error():
    model = LogsInRefusedHooks()
    trainer = Trainer(max_epochs=1, enable_progress_bar=False, enable_model_summary=False, logger=False,
                      default_root_dir="out")
    trainer.fit(model, loader(32), loader(32))
    trainer.test(model, loader(32), verbose=False)
    trainer.predict(model, loader(32))
    assert sorted(model.refused) == [
        "lr_scheduler_step", "on_save_checkpoint", "on_test_end", "on_validation_end", "on_validation_model_eval",
        "predict_step",
    ]
    for hook, message in model.refused.items():
        if hook != "predict_step":
            assert message.startswith("You can't `self.log()` inside"), message
    assert "x" not in trainer.callback_metrics  # nothing was recorded
    assert model.refused["predict_step"].startswith(
        "You are trying to `self.log()` but the loop's result collection is not registered yet.")


def test_log_of_a_non_scalar_names_the_shape():
    class LogsVector(Classifier):
        def training_step(self, batch, batch_idx):
            self.log("vec", torch.ones(3))
            return super().training_step(batch, batch_idx)

    with pytest.raises(ValueError, match=r"self.log\('vec'.*shape \(3,\)"):
        Trainer(**quiet(max_steps=1)).fit(LogsVector(), loader())


# --- Lightning's sentence first, then ours ------------------------------------------------------------
def test_a_bad_gradient_clip_val_and_too_long_val_check_interval_say_lightnings_sentence_first():
    with pytest.raises(TypeError, match=r"^`gradient_clip_val` should be an int or a float\. Got test\. gradient_clip_val='test'"):
        Trainer(gradient_clip_val="test")
    with pytest.raises(ValueError, match=r"^`val_check_interval` \(100\) must be less than or equal to the number of the training batches \(2\)\. "):
        Trainer(**quiet(max_epochs=1, val_check_interval=100)).fit(Classifier(), loader(32), loader(16))


def test_a_scheduler_dict_with_keys_lightning_does_not_know_warns_and_trains():
    class Extra(Classifier):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1), "foo": 1}}

    trainer = Trainer(**quiet(max_epochs=1))
    with pytest.warns(RuntimeWarning, match=r"^Found unsupported keys in the lr scheduler dict: \{'foo'\}\. HINT"):
        trainer.fit(Extra(), loader(32))
    assert trainer.global_step == 2  # 32 samples in batches of 16


def test_the_tuner_refuses_a_trainer_that_already_has_a_batch_size_finder():
    from callbacks import BatchSizeFinder
    from trainer.tuner import Tuner

    with pytest.raises(ValueError, match=r"^Trainer is already configured with a `BatchSizeFinder` callback\."):
        Tuner(Trainer(**quiet(callbacks=[BatchSizeFinder()]))).scale_batch_size(Classifier())


def test_the_tuner_refuses_a_trainer_that_already_has_a_learning_rate_finder():
    from callbacks import LearningRateFinder
    from trainer.tuner import Tuner

    with pytest.raises(ValueError, match=r"^Trainer is already configured with a `LearningRateFinder` callback\."):
        Tuner(Trainer(**quiet(callbacks=[LearningRateFinder()]))).lr_find(Classifier())


class _CustomScheduler:  # outside torch.optim: its step takes an argument torch's does not
    def __init__(self, optimizer):
        self.optimizer, self.epochs = optimizer, []

    def step(self, epoch):
        self.epochs.append(epoch)

    def state_dict(self):
        return {"epochs": self.epochs}

    def load_state_dict(self, state_dict):
        self.epochs = state_dict["epochs"]


class _WithCustomScheduler(Classifier):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        self.scheduler = _CustomScheduler(opt)
        return {"optimizer": opt, "lr_scheduler": self.scheduler}


def test_a_scheduler_outside_torch_without_lr_scheduler_step_is_refused_before_the_first_step():
    model = _WithCustomScheduler()
    trainer = Trainer(**quiet(max_epochs=2))
    with pytest.raises(MisconfigurationException, match=r"^The provided lr scheduler `_CustomScheduler` doesn't follow "
                       r"PyTorch's LRScheduler API\. .*lr_scheduler_step\(self, scheduler, metric\)"):
        trainer.fit(model, loader(32))
    assert trainer.global_step == 0  # refused at the start, not after the first epoch


def test_a_scheduler_outside_torch_runs_through_the_models_lr_scheduler_step():
    class OwnStep(_WithCustomScheduler):
        def lr_scheduler_step(self, scheduler, metric):
            scheduler.step(epoch=self.current_epoch)

    model = OwnStep()
    Trainer(**quiet(max_epochs=2)).fit(model, loader(32))
    assert model.scheduler.epochs == [0, 1]
    model = _WithCustomScheduler()  # Lightning's is_overridden also counts a method set on the instance
    model.lr_scheduler_step = lambda scheduler, metric: scheduler.step(epoch=-1)
    Trainer(**quiet(max_epochs=2)).fit(model, loader(32))
    assert model.scheduler.epochs == [-1, -1]


def test_a_scheduler_without_state_dict_is_refused_at_the_start_of_fit():
    class NoState(Classifier):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = type("Stateless", (), {"step": lambda self: None, "optimizer": opt})()
            return {"optimizer": opt, "lr_scheduler": scheduler}

    with pytest.raises(TypeError, match=r"^The provided lr scheduler `Stateless` is invalid\. It should have `state_dict` "
                       r"and `load_state_dict` methods defined\."):
        Trainer(**quiet(max_epochs=1)).fit(NoState(), loader(32))
