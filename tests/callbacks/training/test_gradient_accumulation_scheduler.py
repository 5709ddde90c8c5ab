"""GradientAccumulationScheduler: the steps each epoch makes, and estimated_stepping_batches agreeing."""

from __future__ import annotations

import pytest
import torch

from callbacks import Callback, GradientAccumulationScheduler
from tests._models import Classifier, loader, quiet
from trainer import Trainer


class ReadsTheEstimate(Classifier):
    def configure_optimizers(self):
        self.estimate = self.trainer.estimated_stepping_batches
        return super().configure_optimizers()


class StepsPerEpoch(Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []  # (accumulate_grad_batches, global_step) at each epoch's end

    def on_train_epoch_end(self, trainer, module):
        self.seen.append((trainer.accumulate_grad_batches, trainer.global_step))


def test_each_epoch_accumulates_as_scheduled_and_the_estimate_agrees():
    record, model = StepsPerEpoch(), ReadsTheEstimate()
    trainer = Trainer(**quiet(max_epochs=3, callbacks=[GradientAccumulationScheduler({1: 4, 2: 3}), record]))
    trainer.fit(model, loader(128))  # 8 batches per epoch
    # Epoch 0 before the first key: 1 (8 steps); epoch 1: 4 (2 steps); epoch 2: 3 (3 steps, the last group short).
    assert record.seen == [(1, 8), (4, 10), (3, 13)]
    assert model.estimate == trainer.global_step == 13
    assert trainer.accumulate_grad_batches == 1  # the Trainer's own option comes back


def test_the_weights_match_accumulation_set_on_the_trainer_for_a_single_value():
    torch.manual_seed(0)
    a, b = Classifier(), Classifier()
    b.load_state_dict(a.state_dict())
    Trainer(**quiet(max_epochs=2, callbacks=[GradientAccumulationScheduler({0: 4})])).fit(a, loader(64))
    Trainer(**quiet(max_epochs=2, accumulate_grad_batches=4)).fit(b, loader(64))
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


@pytest.mark.parametrize("scheduling, error, message", [
    ({}, TypeError, r"scheduling=\{\}\) must be a non-empty dict"),
    ({-1: 2}, ValueError, r"the epoch -1 must be an int >= 0"),
    ({0: 0}, ValueError, r"epoch 0 accumulates 0 batches, which must be an int >= 1"),
])
def test_bad_schedules_say_what_is_wrong(scheduling, error, message):
    with pytest.raises(error, match=message):
        GradientAccumulationScheduler(scheduling)


def test_it_refuses_a_trainer_that_accumulates_too():
    trainer = Trainer(**quiet(max_epochs=1, accumulate_grad_batches=2, callbacks=[GradientAccumulationScheduler({0: 4})]))
    with pytest.raises(ValueError, match=r"^You have set `accumulate_grad_batches` and are using the `GradientAccumulationScheduler`.*accumulate_grad_batches=2"):
        trainer.fit(Classifier(), loader(32))


def test_a_model_with_its_own_optimizer_step_is_told_the_hook_runs_once_a_group():
    class OwnStep(Classifier):
        calls = 0

        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
            type(self).calls += 1
            optimizer.step(closure=optimizer_closure)

    trainer = Trainer(**quiet(max_epochs=1, callbacks=[GradientAccumulationScheduler({0: 2})]))
    with pytest.warns(UserWarning, match=r"^When using `Trainer\(accumulate_grad_batches != 1\)` and overriding"):
        trainer.fit(OwnStep(), loader(64))
    assert OwnStep.calls == 2  # 4 batches, 2 groups
