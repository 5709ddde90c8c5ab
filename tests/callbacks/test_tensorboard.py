"""TensorBoardLogger: what lands in the event file."""

from __future__ import annotations

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks import Callback
from tests._models import Classifier, loader
from trainer import Trainer


class _Losses(Callback):
    """The loss the model returned at each logging step, as a user would print it."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % trainer.log_every_n_steps == 0:
            self.seen[trainer.global_step] = float(outputs.detach())


def _scalars(run_dir: str, tag: str) -> dict[int, float]:
    events = EventAccumulator(run_dir)
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


def test_every_logging_step_is_in_the_event_file_with_the_logged_value():
    losses = _Losses()
    trainer = Trainer(max_epochs=3, log_every_n_steps=2, callbacks=[losses], enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(Classifier(), loader(n=64, batch_size=16))
    written = _scalars(trainer.run_dir, "train_loss")
    assert sorted(written) == sorted(losses.seen) == [2, 4, 6, 8, 10, 12]
    for step, value in losses.seen.items():
        assert written[step] == pytest.approx(value, rel=1e-6)  # the event file stores float32
    assert sorted(_scalars(trainer.run_dir, "lr")) == [2, 4, 6, 8, 10, 12]
    assert sorted(_scalars(trainer.run_dir, "train_loss_epoch")) == [4, 8, 12]


class _FailsAtStep(Classifier):
    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == 7:
            raise RuntimeError("boom")
        return super().training_step(batch, batch_idx)


def test_values_logged_before_a_crash_are_written():
    trainer = Trainer(max_epochs=5, log_every_n_steps=2, enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(_FailsAtStep(), loader(n=64, batch_size=16))
    assert sorted(_scalars(trainer.run_dir, "train_loss")) == [2, 4, 6]


class _TensorLR(Classifier):
    """A tensor learning rate, halved every step: schedulers update such an lr in place."""

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=torch.tensor(0.1))
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5), "interval": "step"}


def test_the_lr_written_is_the_lr_of_that_step():
    trainer = Trainer(max_epochs=1, log_every_n_steps=2, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(_TensorLR(), loader(n=96, batch_size=16))
    assert _scalars(trainer.run_dir, "lr") == pytest.approx({2: 0.1 / 4, 4: 0.1 / 16, 6: 0.1 / 64})
