"""The Strategy interface's defaults, as a strategy that overrides one of them sees them called, and
Lightning's hooks for a strategy that restores the optimizers itself."""

from __future__ import annotations

import os

import pytest
import torch

from callbacks import ModelCheckpoint
from strategies import SingleDeviceStrategy
from tests._models import Classifier, loader, quiet
from trainer import Trainer


class Recording(SingleDeviceStrategy):
    """Lightning users override ``save_checkpoint`` to write elsewhere or add to each file."""

    def __init__(self) -> None:
        super().__init__()
        self.saved: list[str] = []

    def save_checkpoint(self, checkpoint, filepath, storage_options=None):
        checkpoint["written_by"] = "Recording"
        self.saved.append(os.path.basename(filepath))
        super().save_checkpoint(checkpoint, filepath, storage_options)


def test_every_checkpoint_goes_through_the_strategys_save_checkpoint(tmp_path):
    strategy = Recording()
    trainer = Trainer(strategy=strategy, max_epochs=2, **quiet(callbacks=[ModelCheckpoint(dirpath=tmp_path)]))
    trainer.fit(Classifier(), loader(n=32))
    trainer.save_checkpoint(tmp_path / "by-hand.ckpt")
    assert strategy.saved == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", "by-hand.ckpt"]
    assert sorted(os.listdir(tmp_path)) == ["by-hand.ckpt", "epoch=1-step=4.ckpt"]  # top 1: the first was rotated out
    assert torch.load(tmp_path / "by-hand.ckpt", weights_only=True)["written_by"] == "Recording"


def test_save_checkpoint_refuses_storage_options_in_lightnings_words(tmp_path):
    with pytest.raises(TypeError, match=r"^`SingleDeviceStrategy.save_checkpoint\(..., storage_options=...\)` is not"):
        SingleDeviceStrategy().save_checkpoint({"state_dict": {}}, tmp_path / "x.ckpt", storage_options={"anon": True})
    assert not os.listdir(tmp_path)


class AdamClassifier(Classifier):
    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=0.01)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]


@pytest.fixture
def checkpoint(tmp_path):
    trainer = Trainer(max_epochs=2, **quiet())
    trainer.fit(AdamClassifier(), loader(32))
    path = tmp_path / "two_epochs.ckpt"
    trainer.save_checkpoint(path)
    return path


@pytest.mark.parametrize("restores", [True, False])
def test_a_strategy_that_restores_the_optimizers_itself_is_left_to_it(checkpoint, restores):
    class OwnRestore(SingleDeviceStrategy):  # as a Lightning user writes it
        calls = []

        @property
        def lightning_restore_optimizer(self) -> bool:
            return restores

        def load_optimizer_state_dict(self, checkpoint):
            self.calls.append(len(checkpoint["optimizer_states"]))
            super().load_optimizer_state_dict(checkpoint)

    strategy = OwnRestore(torch.device("cpu"))
    trainer = Trainer(max_epochs=2, strategy=strategy, **quiet())
    trainer.fit(AdamClassifier(), loader(32), ckpt_path=checkpoint)  # nothing left to train: the state as loaded
    assert strategy.optimizers == trainer.optimizers
    assert strategy.calls == ([1] if restores else [])
    adam_steps = [s["step"].item() for s in trainer.optimizers[0].state.values()]
    assert adam_steps == ([4.0] * 4 if restores else [])  # 2 epochs of 2 batches, or a fresh Adam
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == (2 if restores else 0)
