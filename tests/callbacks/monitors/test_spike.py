"""SpikeDetection: a crafted loss spike raises TrainingSpikeException and writes the batches to skip."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from callbacks import SpikeDetection, TrainingSpikeException
from tests._models import quiet
from trainer import MisconfigurationException, Trainer, TrainModule


class ScriptedLoss(TrainModule):
    """Its loss is 1 / (batch_idx + 1), and ``spike`` at batch 4 (None: a smooth run)."""

    def __init__(self, spike: float | None) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1, bias=False)
        self.spike = spike

    def training_step(self, batch, batch_idx):
        value = self.spike if batch_idx == 4 and self.spike is not None else 1 / (batch_idx + 1)
        return self.layer.weight.sum() * 0 + torch.tensor(value)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(spike, tmp_path, **kwargs):
    detector = SpikeDetection(exclude_batches_path=tmp_path, **kwargs)
    trainer = Trainer(**quiet(max_epochs=1, enable_model_summary=False, callbacks=[detector]))
    trainer.fit(ScriptedLoss(spike), torch.utils.data.DataLoader(torch.ones(10, 1)))
    return detector


def test_a_jump_far_above_the_running_mean_raises_and_writes_the_batches_to_skip(tmp_path):
    with pytest.raises(TrainingSpikeException, match="Training spike detected in batch 4"):
        _fit(4.0, tmp_path)  # the mean of 1, 1/2, 1/3, 1/4 is about 0.52; 4 is far more than 2x that away
    with open(tmp_path / "skip_batches.json") as f:
        assert json.load(f) == [3, 4]


def test_a_smooth_loss_runs_to_the_end(tmp_path):
    detector = _fit(None, tmp_path)
    assert detector.bad_batches == [] and not (tmp_path / "skip_batches.json").exists()


@pytest.mark.parametrize(
    ("spike", "finite_only", "raises"),
    [
        (float("nan"), True, True),
        (float("inf"), True, True),
        (float("nan"), False, False),
        (float("-inf"), False, False),
        (float("inf"), False, True),
        (0.6, True, False),
    ],
)
def test_non_finite_losses(tmp_path, spike, finite_only, raises):
    if raises:
        with pytest.raises(TrainingSpikeException):
            _fit(spike, tmp_path, finite_only=finite_only)
    else:
        _fit(spike, tmp_path, finite_only=finite_only)


def test_mode_max_and_atol(tmp_path):
    _fit(4.0, tmp_path, mode="max")  # a rise is an improvement when higher is better
    _fit(4.0, tmp_path, atol=10.0)  # 3.5 away from the mean: under atol


def test_bad_mode_fails_at_construction():
    with pytest.raises(MisconfigurationException, match="Unknown SpikeDetection\\(mode\\)='mni'"):
        SpikeDetection(mode="mni")
