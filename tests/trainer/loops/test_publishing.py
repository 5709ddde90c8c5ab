"""trainer/loops/publishing.py: the values fit publishes, reduced over the processes as each
``self.log(..., reduce_fx=...)`` asks (Lightning's ``sync_dist``), under DDP(2) on CPU with gloo."""

from __future__ import annotations

import pytest

from strategies import DDPStrategy
from tests._models import Classifier, loader
from trainer import Trainer

pytestmark = pytest.mark.slow


class LogsItsRank(Classifier):
    """Each rank logs values that differ by its rank, with each reduce_fx."""

    def training_step(self, batch, batch_idx):
        rank = self.global_rank
        self.log("step_sum", 1.0 + rank, on_step=True, on_epoch=False, reduce_fx="sum", sync_dist=True)
        self.log("step_max", float(batch_idx + rank), on_step=True, on_epoch=False, reduce_fx="max", sync_dist=True)
        self.log("step_mean", float(rank), sync_dist=True)
        self.log("mine", float(rank), rank_zero_only=True)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.log("val_max", float(batch_idx + self.global_rank), reduce_fx="max", sync_dist=True)
        self.log("val_min", float(batch_idx + self.global_rank), reduce_fx="min", sync_dist=True)
        return super().validation_step(batch, batch_idx)


@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_step_and_epoch_values_are_reduced_over_the_ranks_by_their_reduce_fx():
    trainer = Trainer(strategy=DDPStrategy(timeout=20), devices=2, max_epochs=1, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, logger=False, num_sanity_val_steps=0)
    trainer.fit(LogsItsRank(), loader(48, batch_size=8), loader(48, batch_size=8))  # 3 batches a rank
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert metrics["step_sum"] == 1.0 + 2.0  # the last step's, summed over the ranks
    assert metrics["step_max"] == 2 + 1  # the last step's batch_idx 2, plus rank 1
    assert metrics["step_mean"] == 0.5
    assert metrics["mine"] == 0.0  # rank_zero_only: rank 0's own, not reduced
    assert metrics["val_max"] == 2 + 1 and metrics["val_min"] == 0.0  # over every batch of both ranks
