"""Callbacks under DDP(2), on CPU with gloo: the ranks must decide alike.

Each spawn costs seconds, so one fit checks EarlyStopping, NaNGuard(skip), the progress bar
and the TensorBoard writer together, and a second one checks NaNGuard(raise).
"""

from __future__ import annotations

import glob
import json
import os
from unittest.mock import Mock

import pytest
import torch

from callbacks import Callback, EarlyStopping, ModelCheckpoint, NaNGuard, ProgressBar
from strategies._spawn import WorkerError
from tests._models import Classifier, loader
from trainer import Trainer

pytestmark = pytest.mark.slow

# The validation score per epoch, as the mean over ranks. Rank 1 logs SCORE + SKEW and rank 0
# SCORE - SKEW, so rank 1 alone would stop in epoch 2 and the mean stops in epoch 3.
SCORE = [1.0, 0.8, 0.9, 0.85, 0.1, 0.1, 0.1, 0.1]
SKEW = [0.0, 0.25, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0]


class RankSkewed(Classifier):
    def __init__(self, skew: bool = True, nan_at: int | None = None, nan_rank: int = 1) -> None:
        super().__init__()
        self.skew, self.nan_at, self.nan_rank = skew, nan_at, nan_rank

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        trainer = self.trainer
        if trainer.global_step == self.nan_at and trainer.strategy.global_rank == self.nan_rank:
            loss = loss * float("nan")  # only on this rank
        return loss

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        epoch, rank = self.trainer.current_epoch, self.trainer.strategy.global_rank
        sign = 1.0 if rank == 1 else -1.0
        self.log("score", SCORE[epoch] + (sign * SKEW[epoch] if self.skew else 0.0))


class PerRank(Callback):
    """Writes what each rank saw at the end of fit, or at its error, to ``<folder>/rank<r>.json``."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_fit_end(self, trainer, module) -> None:
        stopper = next(cb for cb in trainer.callbacks if isinstance(cb, EarlyStopping))
        guard = next(cb for cb in trainer.callbacks if isinstance(cb, NaNGuard))
        bar = next(cb for cb in trainer.callbacks if isinstance(cb, ProgressBar))
        weights = torch.cat([p.detach().flatten() for p in module.parameters()])
        self._write(trainer, {
            "epoch": trainer.current_epoch, "step": trainer.global_step, "stopper": {k: float(v) if isinstance(v, torch.Tensor) else v for k, v in stopper.state_dict().items()},
            "skipped": guard.skipped_steps, "bar_active": bar._active,
            "finite": bool(torch.isfinite(weights).all()), "weights": weights.tolist(),
        })

    def on_exception(self, trainer, module, exception) -> None:
        self._write(trainer, {"error": type(exception).__name__, "message": str(exception)})

    def _write(self, trainer, payload: dict) -> None:
        with open(os.path.join(self.folder, f"rank{trainer.strategy.global_rank}.json"), "w") as f:
            json.dump(payload, f)


def _ranks(folder) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_ranks_stop_skip_draw_and_log_as_one(tmp_path, capfd):
    # What one process does with the same per-process data (32 samples, 4 steps per epoch).
    reference = Trainer(max_epochs=8, log_dir=None, enable_progress_bar=False, enable_checkpointing=False,
                        callbacks=[EarlyStopping("score", patience=2)])
    reference.fit(RankSkewed(skew=False), loader(32, batch_size=8), loader(16, batch_size=8))
    assert (reference.current_epoch, reference.global_step) == (4, 16)
    capfd.readouterr()

    folder = tmp_path / "ranks"
    folder.mkdir()
    stopper = EarlyStopping("score", patience=2)
    trainer = Trainer(
        strategy="ddp", devices=2, max_epochs=8, log_every_n_steps=2, enable_checkpointing=False,
        callbacks=[stopper, NaNGuard(action="skip"), PerRank(str(folder)), ProgressBar()],  # the tqdm bar: its lines
    )
    # 64 samples: 32 per rank. The NaN comes on rank 1 only, in the batch that makes step 6.
    trainer.fit(RankSkewed(nan_at=5), loader(64, batch_size=8), loader(32, batch_size=8))
    zero, one = _ranks(folder)

    # EarlyStopping: the reduced score decides, identically on both ranks, where one process stops.
    assert (trainer.current_epoch, trainer.global_step) == (reference.current_epoch, reference.global_step)
    assert zero["epoch"] == one["epoch"] == 4 and zero["step"] == one["step"] == 16
    message = zero["stopper"]["stopping_reason_message"]
    assert "did not improve" in message
    assert zero["stopper"] == one["stopper"] == {
        "wait_count": 2, "best_score": pytest.approx(0.8), "stopped_epoch": 3, "patience": 2,
        "stopping_reason": 3, "stopping_reason_message": message,  # 3: EarlyStoppingReason.PATIENCE_EXHAUSTED
    }
    assert stopper.stopped_epoch == 3  # rank 0's state came back to the caller

    # NaNGuard(skip): both ranks skipped step 6, so the weights stayed finite and equal.
    assert zero["skipped"] == one["skipped"] == [6]
    assert zero["finite"] and one["finite"] and zero["weights"] == one["weights"]

    # Only rank 0 draws: one line per epoch, not two.
    assert (zero["bar_active"], one["bar_active"]) == (True, False)
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("epoch ")]
    assert [line.split(" done")[0] for line in lines] == ["epoch 0", "epoch 1", "epoch 2", "epoch 3"]

    # Only rank 0 writes TensorBoard events: one run folder with one events file.
    assert glob.glob(os.path.join("lightning_logs", "*")) == [os.path.join("lightning_logs", "version_0")]
    assert len(glob.glob(os.path.join("lightning_logs", "version_0", "events.out.tfevents.*"))) == 1


@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_nan_guard_raise_raises_on_every_rank_at_the_same_step(tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    trainer = Trainer(
        strategy="ddp", devices=2, max_epochs=1, log_dir=None, enable_progress_bar=False, enable_checkpointing=False,
        callbacks=[EarlyStopping("score"), NaNGuard(action="raise"), PerRank(str(folder))],
    )
    with pytest.raises(WorkerError, match=r"FloatingPointError: The training loss is not finite"):
        trainer.fit(RankSkewed(nan_at=2), loader(64, batch_size=8), loader(32, batch_size=8))
    for seen in _ranks(folder):
        assert seen["error"] == "FloatingPointError"
        assert "at step 3 (epoch 0) on rank(s) [1]" in seen["message"]


class CountsSaves(ModelCheckpoint):
    """Wraps torch.save at the start of training, as Lightning's test does, and writes each rank's count."""

    def __init__(self, folder: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.folder = folder

    def on_train_start(self, trainer, module) -> None:
        super().on_train_start(trainer, module)
        torch.save = Mock(wraps=torch.save)

    def state_dict(self):  # counts, and returns nothing (as Lightning's test's does): the caller gets no state back
        super().state_dict()
        self.state_dicts = getattr(self, "state_dicts", 0) + 1

    def on_train_end(self, trainer, module) -> None:
        super().on_train_end(trainer, module)
        with open(os.path.join(self.folder, f"saves{trainer.global_rank}.json"), "w") as f:
            json.dump([torch.save.call_count, self.state_dicts], f)


@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_each_checkpoint_is_one_torch_save_on_rank_0_and_none_on_the_others(tmp_path):
    # The ranks' RNG states, gathered into every checkpoint, cross as bytes, not through torch.save
    counter = CountsSaves(str(tmp_path), dirpath=str(tmp_path / "ckpts"), save_top_k=-1)
    trainer = Trainer(strategy="ddp", devices=2, max_epochs=3, log_dir=None, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[counter])
    trainer.fit(Classifier(), loader(32, batch_size=8), loader(16, batch_size=8))
    assert [json.loads((tmp_path / f"saves{r}.json").read_text()) for r in (0, 1)] == [[3, 3], [0, 3]]
    assert trainer.state.finished
    assert len(os.listdir(tmp_path / "ckpts")) == 3
