"""What an evaluation run makes readable and writes: the sanity check's values, the step rows."""

from __future__ import annotations

import torch

from callbacks import Callback
from tests._models import Classifier, loader, quiet
from trainer import Trainer


class _Seen(Callback):
    """What the hooks read of ``trainer.progress_bar_metrics`` and ``callback_metrics``."""

    def __init__(self) -> None:
        self.seen: dict[str, dict] = {}

    def on_sanity_check_end(self, trainer, pl_module) -> None:
        self.seen["sanity_end"] = (dict(trainer.progress_bar_metrics), set(trainer.callback_metrics))

    def on_train_start(self, trainer, pl_module) -> None:
        self.seen["train_start"] = (dict(trainer.progress_bar_metrics), set(trainer.callback_metrics))


class _ProgBarVal(Classifier):
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self(x), y), prog_bar=True)


def test_sanity_check_values_are_shown_until_its_end_then_gone():
    # Lightning's: a bar drawn at on_sanity_check_end shows what the check logged; training starts without it
    seen = _Seen()
    trainer = Trainer(**quiet(max_epochs=1, limit_train_batches=2, limit_val_batches=2, num_sanity_val_steps=2, callbacks=[seen]))
    trainer.fit(_ProgBarVal(), loader(64), loader(64))
    bar, callback = seen.seen["sanity_end"]
    assert set(bar) == {"val_loss"} and "val_loss" in callback
    assert seen.seen["train_start"] == ({}, set())
    assert "val_loss" in trainer.progress_bar_metrics  # the real validation's, after the epoch
