"""The Trainer's properties (trainer/trainer_properties.py): what Lightning documents as settable
is settable, the run's other values are read-only, and Lightning's ``scaler`` and ``received_sigterm``."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from callbacks import Callback
from tests._models import Classifier, loader, quiet
from trainer import DataModule, Trainer
from trainer.core.signals import Interrupted


READ_ONLY = [
    "train_dataloader", "num_training_batches", "grad_norm", "callback_metrics", "logged_metrics",
    "lr_scheduler_configs", "is_last_batch",
]


@pytest.mark.parametrize("name", READ_ONLY)
def test_the_runs_values_are_read_only_as_lightning_documents_them(name):
    trainer = Trainer(max_steps=1, **quiet())
    trainer.fit(Classifier(), loader(32))
    before = getattr(trainer, name)
    with pytest.raises(AttributeError):
        setattr(trainer, name, before)
    assert getattr(trainer, name) == before


def test_optimizers_ckpt_path_and_datamodule_stay_settable_as_in_lightning():
    trainer = Trainer(max_steps=1, **quiet())
    trainer.fit(Classifier(), loader(32))
    replacement = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    trainer.optimizers = [replacement]
    trainer.ckpt_path = "some.ckpt"
    datamodule = DataModule()  # a plain attribute in Lightning: its lightning_setattr sets it
    trainer.datamodule = datamodule
    assert trainer.optimizers == [replacement] and trainer.ckpt_path == "some.ckpt" and trainer.datamodule is datamodule


def test_lr_scheduler_configs_is_the_list_the_trainer_steps():
    class Scheduled(Classifier):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=1.0)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]

    class TakeOver(Callback):  # as StochasticWeightAveraging does: the Trainer steps none from now on
        def on_train_start(self, trainer, module):
            trainer.lr_scheduler_configs.clear()

    model = Scheduled()
    trainer = Trainer(max_epochs=3, limit_train_batches=1, **quiet(callbacks=[TakeOver()]))
    trainer.fit(model, loader(32))
    assert trainer.optimizers[0].param_groups[0]["lr"] == 1.0 and trainer.lr_scheduler_configs == []


def test_scaler_is_lightnings_none_without_float16():
    trainer = Trainer(max_steps=1, precision="bf16-mixed", **quiet())
    trainer.fit(Classifier(), loader(32))
    assert trainer.scaler is None and trainer.scaler is trainer.strategy.precision.scaler


def test_received_sigterm_turns_true_when_fit_gets_sigterm():
    seen = []

    class Term(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append(trainer.received_sigterm)
            if batch_idx == 0:
                os.kill(os.getpid(), signal.SIGTERM)

    trainer = Trainer(max_epochs=1, **quiet(callbacks=[Term()]))
    assert trainer.received_sigterm is False
    with pytest.raises(Interrupted, match="SIGTERM"):
        trainer.fit(Classifier(), loader(64))
    assert seen[0] is False and trainer.received_sigterm is True


def test_manual_backward_outside_a_call_says_the_module_has_no_trainer():
    with pytest.raises(RuntimeError, match="is not attached to a `Trainer`"):
        Classifier().manual_backward(torch.ones((), requires_grad=True))
