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


def test_a_validation_step_value_with_prog_bar_is_in_progress_bar_metrics_only_as_lightnings():
    class LogsStepValues(Classifier):
        def validation_step(self, batch, batch_idx):
            self.log("shown", float(batch_idx), on_step=True, on_epoch=False, prog_bar=True)
            self.log("both", float(batch_idx), on_step=True, on_epoch=True, prog_bar=True, logger=False)
            self.log("hidden", float(batch_idx), on_step=True, on_epoch=False)
            return super().validation_step(batch, batch_idx)

    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=3, num_sanity_val_steps=0,
                      enable_progress_bar=False, enable_checkpointing=False, logger=False)
    trainer.fit(LogsStepValues(), loader(32), loader(64))
    # The last validation step's values, under the names the options give them, as Lightning shows them.
    mine = ("shown", "both", "hidden")
    assert {k: float(v) for k, v in trainer.progress_bar_metrics.items() if k.startswith(mine)} == {
        "shown": 2.0, "both_step": 2.0, "both_epoch": 1.0,
    }
    assert "shown" not in trainer.callback_metrics and "both_step" not in trainer.callback_metrics
