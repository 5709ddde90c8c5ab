"""Under strategy="ddp" with 2 real gloo processes: a DataModule's prepare_data once per
machine and setup on every rank, several validation loaders each sharded, the sanity check,
values that callbacks log at the epoch's end, and evaluating a checkpoint."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import Callback, ModelCheckpoint
from tests._models import Classifier, dataset, quiet
from trainer import DataModule, Trainer

pytestmark = pytest.mark.slow


# --- module level, so that the spawned workers can unpickle them --------------------------
class Files(DataModule):
    """Leaves a file per call in ``folder``: which process prepared, which set up."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def prepare_data(self):
        open(os.path.join(self.folder, f"prepared-{os.getpid()}"), "w").close()

    def setup(self, stage):
        rank = torch.distributed.get_rank()
        assert len([f for f in os.listdir(self.folder) if f.startswith("prepared")]) == 1  # done before any setup
        open(os.path.join(self.folder, f"setup-{stage}-{rank}"), "w").close()

    def train_dataloader(self):
        return DataLoader(dataset(64), batch_size=8, shuffle=True)

    def val_dataloader(self):
        return [DataLoader(dataset(40, seed=3), batch_size=8), DataLoader(dataset(24, seed=4), batch_size=8)]


class Sanity(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.sanity_batches = 0

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.sanity_batches += self.trainer.sanity_checking
        return super().validation_step(batch, batch_idx)


class CountsSanity(Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_sanity_check_end(self, trainer, module):
        self.batches = int(trainer.strategy.all_reduce_sum(torch.tensor([float(module.sanity_batches)])).item())

    def on_train_epoch_end(self, trainer, module):
        module.log("rank_value", float(trainer.strategy.global_rank))

    def state_dict(self):
        return {"batches": self.batches}

    def load_state_dict(self, state):
        self.batches = state["batches"]


@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_a_datamodule_and_several_validation_loaders_under_ddp_match_one_process(tmp_path):
    folder = tmp_path / "marks"
    folder.mkdir()
    counter = CountsSanity()
    model = Sanity()
    trainer = Trainer(strategy="ddp", devices=2, max_epochs=2, seed=0, callbacks=[counter], **quiet())
    trainer.fit(model, datamodule=Files(str(folder)))
    marks = sorted(os.listdir(folder))
    assert len([m for m in marks if m.startswith("prepared")]) == 1  # once on this machine
    assert [m for m in marks if m.startswith("setup")] == ["setup-fit-0", "setup-fit-1"]
    assert counter.batches == 8  # 2 sanity batches per loader on each rank
    assert trainer.callback_metrics["rank_value"] == 0.5  # a callback's epoch-end value, the mean over ranks
    # Each loader sharded, its metric reduced over both ranks: what one process finds for it.
    alone = Trainer(**quiet()).validate(model, [DataLoader(dataset(40, seed=3), batch_size=8), DataLoader(dataset(24, seed=4), batch_size=8)])
    for i in range(2):
        assert trainer.callback_metrics[f"val_loss/dataloader_idx_{i}"] == pytest.approx(alone[i][f"val_loss/dataloader_idx_{i}"], abs=1e-6)


@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_predict_under_ddp_loads_the_checkpoint_and_returns_one_list_per_loader():
    Trainer(max_epochs=1, log_dir=None, enable_progress_bar=False, callbacks=[ModelCheckpoint(save_last=True)]).fit(
        Classifier(), DataLoader(dataset(32), batch_size=8))  # "last" to evaluate: Lightning's last.ckpt
    loaders = {"a": DataLoader(dataset(20, seed=5), batch_size=4), "b": DataLoader(dataset(12, seed=6), batch_size=4)}
    fresh = Classifier()
    out = Trainer(strategy="ddp", devices=2, **quiet()).predict(fresh, loaders, ckpt_path="last")
    trained = Classifier()
    trained.load_state_dict(torch.load("checkpoints/last.ckpt", weights_only=True)["state_dict"])
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), trained.state_dict().values()))
    assert isinstance(out, list) and len(out) == 2  # one list per loader, a dict's in its order, as Lightning's
    for predictions, loader in zip(out, loaders.values()):
        with torch.no_grad():
            expected = trained(loader.dataset.tensors[0]).argmax(-1)
        assert torch.equal(torch.cat(predictions), expected)  # every rank's share, in the loader's order
