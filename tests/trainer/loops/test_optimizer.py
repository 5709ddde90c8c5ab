"""What ``self.optimizers()`` hands out: Lightning's LightningOptimizer (trainer/loops/optimization/optimizer.py)."""

from __future__ import annotations

import copy
import pickle

import torch

from tests._models import Classifier, TinyGAN, gan_loader, loader, quiet
from tests.trainer.loops.test_fit_loop import (
    CpuScaling, OverflowsInFloat32AtBatch1, WeightsAfterEachStep, _assert_batch_1_skipped_and_the_scale_halved,
)
from trainer import LightningOptimizer, Trainer


def test_the_wrapper_shares_the_optimizers_state_both_ways_and_is_of_its_class():
    model = torch.nn.Linear(3, 4)
    adam = torch.optim.Adam(model.parameters(), lr=0.1)
    wrapped = LightningOptimizer(adam)
    assert isinstance(wrapped, torch.optim.Adam) and isinstance(wrapped, LightningOptimizer)
    assert wrapped.optimizer is adam and LightningOptimizer(wrapped).optimizer is adam  # never wrapped twice
    assert wrapped.state is adam.state and wrapped.param_groups is adam.param_groups and wrapped.defaults is adam.defaults

    adam.param_groups[0]["lr"] = 1.0
    assert wrapped.param_groups[0]["lr"] == 1.0
    saved = copy.deepcopy(adam.state_dict())
    fresh = torch.optim.Adam(model.parameters(), lr=100)
    LightningOptimizer(fresh).load_state_dict(saved)  # loaded through the wrapper: into the optimizer
    assert fresh.param_groups[0]["lr"] == 1.0
    wrapped.param_groups = fresh.param_groups  # assigned through the wrapper: the optimizer's too
    assert adam.param_groups is fresh.param_groups

    model(torch.ones(2, 3)).sum().backward()
    wrapped.step()  # outside a fit: the optimizer's own step
    assert adam.state_dict()["state"][0]["step"] == 1 and wrapped.state_dict() == adam.state_dict()
    assert repr(wrapped) == "Lightning" + repr(adam)
    for copied in (copy.deepcopy(wrapped), pickle.loads(pickle.dumps(wrapped))):
        assert type(copied).__name__ == "LightningAdam" and copied.optimizer is not adam
        assert copied.state_dict()["state"][0]["step"] == 1


class Seen(Classifier):
    def training_step(self, batch, batch_idx):
        self.seen = self.optimizers()
        return super().training_step(batch, batch_idx)


def test_under_automatic_optimization_optimizers_hands_out_the_wrapper_during_and_after_fit():
    model = Seen()
    trainer = Trainer(max_epochs=1, limit_train_batches=2, **quiet())
    trainer.fit(model, loader())
    sgd = trainer.optimizers[0]
    assert model.seen is model.optimizers()  # one wrapper per optimizer, not one per call
    assert isinstance(model.seen, LightningOptimizer) and isinstance(model.seen, torch.optim.SGD)
    assert model.seen.optimizer is sgd and str(model.seen) == "Lightning" + str(sgd)
    assert model.optimizers(use_pl_optimizer=False) is sgd


class StepsInOptimizerStep(OverflowsInFloat32AtBatch1):
    """Lightning's warm-up idiom: the hook steps the optimizer it is given, with the closure."""

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        self.given = optimizer
        optimizer.step(closure=optimizer_closure)


def test_the_optimizer_given_to_optimizer_step_is_the_wrapper_and_steps_through_the_scaler():
    record = WeightsAfterEachStep()
    model = StepsInOptimizerStep()
    trainer = Trainer(max_epochs=1, limit_train_batches=3, callbacks=[record], **quiet())
    trainer.strategy.precision = CpuScaling()
    trainer.fit(model, loader())
    assert model.given is model.optimizers() and isinstance(model.given, torch.optim.SGD)
    _assert_batch_1_skipped_and_the_scale_halved(record)  # the scaler skipped the overflowing step


def test_under_manual_optimization_the_wrappers_are_of_the_optimizers_classes():
    model = TinyGAN()
    Trainer(max_epochs=1, **quiet()).fit(model, gan_loader())
    opts = model.optimizers()
    assert all(isinstance(o, LightningOptimizer) and isinstance(o, type(o.optimizer)) for o in opts)
    assert [o.optimizer for o in opts] == model.optimizers(use_pl_optimizer=False) == model.trainer.optimizers
