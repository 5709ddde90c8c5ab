"""strategies/base.py: Lightning's hooks for a strategy that restores the optimizers itself."""

from __future__ import annotations

import pytest
import torch

from strategies import SingleDeviceStrategy
from tests._models import Classifier, loader, quiet
from trainer import Trainer


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
