"""WeightAveraging and EMAWeightAveraging: the average against one by hand, validation on it, checkpoints, resume."""

from __future__ import annotations

import os

import pytest
import torch

from callbacks import Callback, EMAWeightAveraging, ModelCheckpoint, WeightAveraging
from tests._models import Classifier, loader, quiet
from trainer import MisconfigurationException, Trainer


class StepWeights(Callback):
    """The weights after each optimizer step, and those validation ran on (placed after the averaging callback)."""

    def __init__(self) -> None:
        self.steps: list[list[torch.Tensor]] = []
        self.validated: list[list[torch.Tensor]] = []
        self.after_validation: list[list[torch.Tensor]] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.steps.append([p.detach().clone() for p in module.parameters()])

    def on_validation_epoch_start(self, trainer, module):
        self.validated.append([p.detach().clone() for p in module.parameters()])

    def on_train_epoch_end(self, trainer, module):
        self.after_validation.append([p.detach().clone() for p in module.parameters()])


def _fit(model, *callbacks, epochs=2, ckpt_path=None, **options):
    trainer = Trainer(**quiet(max_epochs=epochs, enable_model_summary=False, callbacks=list(callbacks), **options))
    trainer.fit(model, loader(64), loader(32), ckpt_path=ckpt_path)
    return trainer


def _mean(snapshots: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [torch.stack(group).mean(0) for group in zip(*snapshots)]


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b))


def test_the_default_average_is_the_mean_of_the_weights_after_each_step_and_validation_runs_on_it():
    model, weights = Classifier(), StepWeights()
    initial = [p.detach().clone() for p in model.parameters()]
    _fit(model, WeightAveraging(), weights)
    assert len(weights.steps) == 8 and len(weights.validated) == 3  # 2 epochs of 4 batches; the sanity check first
    assert _close(weights.validated[0], initial)  # before any step the average is the model's copy
    assert _close(weights.validated[1], _mean(weights.steps[:4]))  # the first epoch's validation: the average so far
    assert _close(weights.validated[2], _mean(weights.steps))
    assert _close(weights.after_validation[0], weights.steps[3])  # the training weights are back after it
    assert _close(list(model.parameters()), _mean(weights.steps))  # fit ends with the average


def test_ema_matches_one_computed_by_hand_with_its_update_schedule():
    model, weights = Classifier(), StepWeights()
    _fit(model, EMAWeightAveraging(decay=0.5, update_every_n_steps=2, update_starting_at_step=2), weights)
    updates = [w for i, w in enumerate(weights.steps) if i >= 2 and i % 2 == 0]  # steps 2, 4, 6
    expected = updates[0]  # the first update copies
    for w in updates[1:]:
        expected = [0.5 * e + 0.5 * x for e, x in zip(expected, w)]
    assert _close(list(model.parameters()), expected)


def test_should_update_of_ema():
    ema = EMAWeightAveraging(update_every_n_steps=5, update_starting_at_step=10)
    assert [ema.should_update(step_idx=i) for i in (5, 9, 10, 11, 15)] == [False, False, True, False, True]
    assert not ema.should_update(epoch_idx=3)
    by_epoch = EMAWeightAveraging(update_starting_at_epoch=2)
    assert [by_epoch.should_update(epoch_idx=i) for i in range(4)] == [False, False, True, True]


def test_averaging_at_epoch_ends_only():
    class EveryEpoch(WeightAveraging):
        def should_update(self, step_idx=None, epoch_idx=None):
            return epoch_idx is not None

    model, weights = Classifier(), StepWeights()
    _fit(model, EveryEpoch(), weights, epochs=3)
    assert _close(list(model.parameters()), _mean([weights.steps[3], weights.steps[7], weights.steps[11]]))


def test_a_checkpoint_holds_the_average_as_its_state_dict_and_the_training_weights_beside(tmp_path):
    model, weights = Classifier(), StepWeights()
    _fit(model, WeightAveraging(), weights, ModelCheckpoint(dirpath=tmp_path, filename="end"), epochs=1)
    checkpoint = torch.load(os.path.join(tmp_path, "end.ckpt"), weights_only=True)
    average = [checkpoint["state_dict"][name] for name, _ in model.named_parameters()]
    current = [checkpoint["current_model_state"][name] for name, _ in model.named_parameters()]
    assert _close(average, _mean(weights.steps)) and _close(current, weights.steps[-1])
    assert int(checkpoint["averaging_state"]["n_averaged"]) == 4
    plain = Classifier()
    plain.load_state_dict(checkpoint["state_dict"])  # loads for inference as it is


def test_ema_state_survives_a_resume(tmp_path):
    straight = Classifier()
    resumed = Classifier()
    resumed.load_state_dict(straight.state_dict())
    _fit(straight, EMAWeightAveraging(decay=0.9), epochs=4)
    _fit(resumed, EMAWeightAveraging(decay=0.9), ModelCheckpoint(dirpath=tmp_path, save_last=True), epochs=2)
    again = Classifier()
    _fit(
        again,
        EMAWeightAveraging(decay=0.9),
        ModelCheckpoint(dirpath=tmp_path, save_last=True),
        epochs=4,
        ckpt_path=os.path.join(tmp_path, "last.ckpt"),
    )
    assert _close(list(again.parameters()), list(straight.parameters()))


def test_bad_decay_fails_at_construction():
    with pytest.raises(MisconfigurationException, match=r"decay=1.5"):
        EMAWeightAveraging(decay=1.5)
