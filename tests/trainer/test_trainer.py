"""The training loop: results a user can check against a loop written by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tests._models import Classifier, loader, quiet
from trainer import Trainer


def test_accumulation_with_a_short_last_group_matches_a_hand_written_loop():
    torch.manual_seed(0)
    model = Classifier()
    by_hand = Classifier()
    by_hand.load_state_dict(model.state_dict())
    Trainer(max_epochs=1, accumulate_grad_batches=3, **quiet()).fit(model, loader(n=160, batch_size=16))
    opt = by_hand.configure_optimizers()
    batches = list(loader(n=160, batch_size=16))  # 10 batches: groups of 3, 3, 3, then 1
    for start in range(0, len(batches), 3):
        group = batches[start:start + 3]
        for x, y in group:
            (nn.functional.cross_entropy(by_hand(x), y) / len(group)).backward()  # x / 1 is exact
        opt.step()
        opt.zero_grad()
    for a, b in zip(model.state_dict().values(), by_hand.state_dict().values()):
        assert torch.equal(a, b)


class _NaNAtStep(Classifier):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * math.nan if self.trainer.global_step >= 3 else loss


def test_a_nan_loss_stops_fit_at_the_logging_cadence():
    trainer = Trainer(max_epochs=2, log_every_n_steps=2, **quiet())
    with pytest.raises(FloatingPointError, match="at step 4"):
        trainer.fit(_NaNAtStep(), loader(n=128, batch_size=16))
