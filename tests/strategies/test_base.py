"""The Strategy interface's defaults, as a strategy that overrides one of them sees them called."""

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
