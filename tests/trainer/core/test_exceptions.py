"""MisconfigurationException: raised where Lightning raises it, Lightning's sentence first and ours
after, and still a ValueError (a TypeError too where the value's type is wrong)."""

from __future__ import annotations

import pytest
import torch

from tests._models import Classifier, loader, quiet
from callbacks import ProgressBar
from trainer import DataModule, MisconfigurationException, Trainer, TrainModule


@pytest.mark.parametrize("kwargs, lightning, also", [
    (dict(max_epochs=-100), "`max_epochs` must be a non-negative integer or -1. You passed in -100.", ValueError),
    (dict(max_steps=-2), "`max_steps` must be a non-negative integer or -1 (infinite steps). You passed in -2.", ValueError),
    (dict(gradient_clip_algorithm="norm2"), "`gradient_clip_algorithm` norm2 is invalid. Allowed algorithms: ['value', 'norm'].", ValueError),
    (dict(check_val_every_n_epoch=1.2), "`check_val_every_n_epoch` should be an integer, found 1.2.", TypeError),
    (dict(reload_dataloaders_every_n_epochs=-1), "`reload_dataloaders_every_n_epochs` should be an int >= 0, got -1.", ValueError),
    (dict(limit_val_batches=1.2), "You have passed invalid value 1.2 for limit_val_batches, it has to be in [0.0, 1.0] or an int.", ValueError),
    (dict(overfit_batches=-0.1), "You have passed invalid value -0.1 for overfit_batches, it has to be in [0.0, 1.0] or an int.", ValueError),
    (dict(fast_dev_run=-1), "fast_dev_run=-1 is not a valid configuration. It should be >= 0.", ValueError),
    (dict(enable_checkpointing="yes"), "enable_checkpointing='yes' must be True or False.", TypeError),
])
def test_a_bad_trainer_option_is_lightnings_exception_with_its_sentence_first(kwargs, lightning, also):
    with pytest.raises(MisconfigurationException) as err:
        Trainer(**kwargs)
    assert str(err.value).startswith(lightning) and isinstance(err.value, ValueError) and isinstance(err.value, also)
    assert str(next(iter(kwargs.values()))) in str(err.value)


def test_what_a_stage_needs_from_the_model_is_lightnings_exception():
    trainer = Trainer(max_steps=1, **quiet())
    no_step = Classifier()
    no_step.training_step = None
    with pytest.raises(MisconfigurationException, match=r"^No `training_step\(\)` method defined\."):
        trainer.fit(no_step, loader())
    with pytest.raises(TypeError, match=r"^`model` must be a `LightningModule` or `torch._dynamo.OptimizedModule`, got `Linear`"):
        trainer.fit(torch.nn.Linear(2, 2), loader())
    no_optimizer = Classifier()
    no_optimizer.configure_optimizers = None
    with pytest.raises(MisconfigurationException, match=r"^No `configure_optimizers\(\)` method defined\."):
        trainer.fit(no_optimizer, loader())
    for stage, model, sentence in (
        ("validate", _without("validation_step"), r"^No `validation_step\(\)` method defined to run `Trainer.validate`\."),
        ("test", _without("test_step"), r"^No `test_step\(\)` method defined to run `Trainer.test`\."),
        ("predict", _without("predict_step"), r"^`predict_step` cannot be None to run `Trainer.predict`"),
        ("predict", _NoForward(), r"^`Trainer.predict` requires `forward` method to run\."),
    ):
        with pytest.raises(MisconfigurationException, match=sentence):
            getattr(trainer, stage)(model, loader())


def _without(hook: str) -> Classifier:
    model = Classifier()
    setattr(model, hook, None)  # how Lightning's tests and scripts undefine a hook
    return model


class _NoForward(TrainModule):
    """TrainModule's default predict_step calls forward, which this module does not define."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)


@pytest.mark.parametrize("option, sentence", [
    (dict(gradient_clip_val=1.0), "Automatic gradient clipping is not supported for manual optimization."),
    (dict(accumulate_grad_batches=2), "Automatic gradient accumulation is not supported for manual optimization."),
])
def test_options_the_trainer_cannot_apply_under_manual_optimization(option, sentence):
    model = Classifier()
    model.automatic_optimization = False
    with pytest.raises(MisconfigurationException, match="^" + sentence):
        Trainer(max_steps=1, **quiet(**option)).fit(model, loader())


@pytest.mark.parametrize("build, sentence", [
    (lambda: __import__("callbacks").ModelCheckpoint(save_top_k=-3), "Invalid value for save_top_k=-3. Must be >= -1"),
    (lambda: __import__("callbacks").ModelCheckpoint(every_n_epochs=-3), "Invalid value for every_n_epochs=-3. Must be >= 0"),
    (lambda: __import__("callbacks").EarlyStopping(monitor="x", mode="up"), "`mode` can be min, max, got up"),
    (lambda: __import__("callbacks").GradientAccumulationScheduler({-1: 2}), "Epoch should be an int greater than or equal to 0."),
    (lambda: __import__("callbacks").GradientAccumulationScheduler({1: 0}), "Accumulation factor should be an int greater than 0."),
    (lambda: __import__("callbacks").LearningRateMonitor(logging_interval="batch"), "logging_interval should be `step` or `epoch` or `None`."),
    (lambda: __import__("callbacks").StochasticWeightAveraging(swa_lrs=-1), "The `swa_lrs` should a positive float"),
    (lambda: __import__("callbacks").StochasticWeightAveraging(swa_lrs=0.1, swa_epoch_start=1.5), "swa_epoch_start should be a >0 integer"),
    (lambda: __import__("callbacks").Timer("60 minutes"), "`Timer(duration='60 minutes')` is not a valid duration. Expected a string in the format DD:HH:MM:SS."),
    (lambda: __import__("callbacks").Timer(10, interval="batch"), "Unsupported parameter value `Timer(interval=batch)`."),
    (lambda: DataModule().val_dataloader(), "`val_dataloader` must be implemented to be used with the Lightning Trainer"),
    (lambda: Trainer(callbacks=[ProgressBar(), ProgressBar()]), "You added multiple progress bar callbacks to the Trainer"),
    (lambda: Trainer(callbacks=[ProgressBar()], enable_progress_bar=False), "Trainer was configured with `enable_progress_bar=False` but found `ProgressBar`"),
])
def test_lightnings_callback_and_datamodule_misconfigurations(build, sentence):
    with pytest.raises(MisconfigurationException) as err:
        build()
    assert str(err.value).startswith(sentence)


def test_the_accumulation_scheduler_refuses_manual_optimization_and_the_trainers_own_accumulation():
    from callbacks import GradientAccumulationScheduler

    model = Classifier()
    model.automatic_optimization = False
    with pytest.raises(RuntimeError, match="^Automatic gradient accumulation and the `GradientAccumulationScheduler` is not supported"):
        GradientAccumulationScheduler({1: 2}).on_train_start(Trainer(**quiet()), model)
    trainer = Trainer(max_steps=1, accumulate_grad_batches=2, callbacks=[GradientAccumulationScheduler({0: 2})], **quiet())
    with pytest.raises(ValueError, match="^You have set `accumulate_grad_batches` and are using the `GradientAccumulationScheduler`"):
        trainer.fit(Classifier(), loader())


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(16):
            yield torch.randn(8, generator=g), torch.randint(0, 2, (), generator=g)


def test_a_fraction_of_a_loader_without_a_length_and_a_fraction_interval_across_epochs_are_lightnings_errors():
    stream = torch.utils.data.DataLoader(_Stream(), batch_size=4)
    with pytest.raises(MisconfigurationException, match=r"^When using an `IterableDataset` for `train_dataloader`, `Trainer\(limit_train_batches\)` must be `1.0` or an int"):
        Trainer(max_epochs=1, limit_train_batches=0.5, **quiet()).fit(Classifier(), stream)
    with pytest.raises(MisconfigurationException, match=r"^When using an `IterableDataset` for `test_dataloader`"):
        Trainer(limit_test_batches=0.5, **quiet()).test(Classifier(), stream, verbose=False)
    with pytest.raises(MisconfigurationException, match=r"^`val_check_interval` should be an integer or a time-based duration"):
        Trainer(val_check_interval=0.5, check_val_every_n_epoch=None)


def test_fewer_batches_than_the_logging_interval_is_lightnings_warning():
    with pytest.warns(UserWarning, match=r"^The number of training batches \(2\) is smaller than the logging interval Trainer\(log_every_n_steps=50\)"):
        Trainer(max_steps=2, enable_progress_bar=False, enable_checkpointing=False).fit(Classifier(), loader(32, 16))
