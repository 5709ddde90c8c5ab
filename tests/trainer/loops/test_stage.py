"""run_stage: however a stage ends, the checkpoints handed to the writer thread are on disk first."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, ModelCheckpoint
from tests._models import Classifier
from trainer import Trainer


class FailsAfterTheFirstSave(Callback):
    """Raises at the second step, after the first step's save went to the writer thread; its own
    ``on_exception`` fails too (as a logger's write on a full disk does), so no callback after it
    (ModelCheckpoint's) sees the failure."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 1:
            raise RuntimeError("the step failed")

    def on_exception(self, trainer, pl_module, exception):
        raise OSError(28, "No space left on device")


def test_a_fit_that_fails_returns_after_the_checkpoint_handed_to_the_writer_is_on_disk(tmp_path):
    # A checkpoint of about 32 MB: copied, then serialized and written on the writer thread, which
    # takes far longer than the error takes to reach the caller.
    model = Classifier(features=2048, hidden=4096)
    data = TensorDataset(torch.randn(32, 2048), torch.randint(0, 2, (32,)))
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    trainer = Trainer(max_steps=4, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[FailsAfterTheFirstSave(), checkpoint])
    with pytest.raises(OSError, match="No space left"):
        trainer.fit(model, DataLoader(data, batch_size=16))
    assert sorted(os.listdir(tmp_path)) == ["epoch=0-step=1.ckpt"]  # complete, and no temporary file beside it
    saved = torch.load(tmp_path / "epoch=0-step=1.ckpt", weights_only=True)
    assert saved["global_step"] == 1
