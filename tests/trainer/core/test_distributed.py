"""trainer/core/distributed.py, seed.py and metrics.py: rank_zero_only, rank_zero_warn, grad_norm with
Lightning's keys, seed_everything(workers=True); and the DataModule's Lightning surface."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from callbacks import Callback, ModelCheckpoint
from tests._models import Classifier, dataset, quiet
from trainer import DataModule, Trainer, grad_norm, rank_zero_only, rank_zero_warn, seed_everything
from trainer.core.seed import seed_worker


def test_rank_zero_only_runs_on_rank_zero_only(monkeypatch):
    calls = []

    @rank_zero_only
    def note(x):
        calls.append(x)
        return x

    assert note(1) == 1
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    assert note(2) is None
    with __import__("warnings").catch_warnings(record=True) as caught:
        __import__("warnings").simplefilter("always")
        rank_zero_warn("quiet on rank 1")
    assert calls == [1] and not caught
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    with pytest.warns(UserWarning, match="loud on rank 0"):
        rank_zero_warn("loud on rank 0")


def test_grad_norm_has_lightnings_keys_and_values():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1, bias=False))
    model(torch.ones(4, 3)).sum().backward()
    model[0].bias.grad = None  # a parameter without a gradient is left out
    norms = grad_norm(model, norm_type=2)
    assert set(norms) == {"grad_2.0_norm/0.weight", "grad_2.0_norm/1.weight", "grad_2.0_norm_total"}
    assert torch.allclose(norms["grad_2.0_norm/0.weight"], model[0].weight.grad.norm())
    total = torch.cat([model[0].weight.grad.flatten(), model[1].weight.grad.flatten()]).norm()
    assert torch.allclose(norms["grad_2.0_norm_total"], total)
    assert set(grad_norm(model, "inf")) >= {"grad_inf_norm_total"}
    with pytest.raises(ValueError, match=r"^`norm_type` must be a positive number or 'inf' \(infinity norm\)\. Got 0\. grad_norm\(norm_type=0\)"):
        grad_norm(model, 0)


class Draws(Dataset):
    """Each item: what the worker's torch, random and numpy generators draw."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        import numpy as np

        return torch.tensor([torch.rand(()).item(), random.random(), float(np.random.rand())])


class RecordsBatches(Classifier):
    def __init__(self):
        super().__init__()
        self.draws = []

    def training_step(self, batch, batch_idx):
        self.draws.append(batch.clone())
        return self.net[0].weight.sum() * 0 + self.net(torch.zeros(1, 8)).sum()


def _draws(workers: bool) -> torch.Tensor:
    seed_everything(7, workers=workers)
    model = RecordsBatches()
    loader = DataLoader(Draws(), batch_size=1, num_workers=2)
    Trainer(max_epochs=1, **quiet()).fit(model, loader)
    return torch.cat(model.draws)


def test_seed_everything_workers_gives_each_worker_and_rank_its_own_seeds_and_repeats():
    seeded = _draws(workers=True)
    assert len(set(seeded[:, 2].tolist())) == 4 and len(set(seeded[:, 1].tolist())) == 4  # each worker its own
    assert torch.equal(seeded, _draws(workers=True))  # and again the same
    assert os.environ["TRAINER_SEED_WORKERS"] == "1"
    # Ranks start their loaders from the same seed; the rank goes into the workers' seeds.
    draws = []
    for rank in (0, 1, 0):
        torch.manual_seed(3)
        seed_worker(0, rank=rank)
        draws.append((torch.rand(()).item(), random.random()))
    assert draws[0] == draws[2] != draws[1]
    seed_everything(0)  # leaves workers off again
    assert os.environ["TRAINER_SEED_WORKERS"] == "0"


class Data(DataModule):
    def __init__(self, batch_size: int = 16):
        super().__init__()
        self.save_hyperparameters()
        self.batches_served = 0
        self.attached = None

    def setup(self, stage):
        self.attached = self.trainer

    def train_dataloader(self):
        return DataLoader(dataset(64), batch_size=self.hparams.batch_size)

    def state_dict(self):
        return {"batches_served": self.batches_served + 5}

    def load_state_dict(self, state_dict):
        self.batches_served = state_dict["batches_served"]


def test_datamodule_state_and_trainer_and_hparams_in_checkpoints():
    dm = Data(batch_size=8)
    trainer = Trainer(max_epochs=1, callbacks=[ModelCheckpoint(dirpath="ck", save_last=True)], **quiet(enable_checkpointing=True))
    trainer.fit(Classifier(), datamodule=dm)
    assert dm.attached is trainer
    ckpt = torch.load(os.path.join("ck", "last.ckpt"), weights_only=True)
    # Lightning's keys: the state under the DataModule's class name, its hyperparameters beside the model's
    assert ckpt["Data"] == {"batches_served": 5} and ckpt["datamodule_hyper_parameters"] == {"batch_size": 8}
    assert ckpt["datamodule_hparams_name"] == "kwargs"
    again = Data(batch_size=8)
    Trainer(max_epochs=2, **quiet(enable_checkpointing=True)).fit(Classifier(), datamodule=again, ckpt_path=os.path.join("ck", "last.ckpt"))
    assert again.batches_served == 5
    assert Data.load_from_checkpoint(os.path.join("ck", "last.ckpt")).batches_served == 5  # built from its hyperparameters


def test_from_datasets():
    dm = DataModule.from_datasets(dataset(32), val_dataset=[dataset(16), dataset(8)], batch_size=8)
    trainer = Trainer(max_epochs=1, num_sanity_val_steps=0, **quiet())
    trainer.fit(Classifier(), datamodule=dm)
    assert trainer.global_step == 4 and {"val_loss/dataloader_idx_0", "val_loss/dataloader_idx_1"} <= set(trainer.callback_metrics)
    assert isinstance(dm.train_dataloader(), DataLoader) and dm.train_dataloader().batch_size == 8


def test_objects_gathered_across_ranks_carry_their_tensors_as_bytes_not_through_torch_save(monkeypatch):
    import pickle
    from unittest.mock import Mock

    from trainer.core.distributed import tensors_as_bytes

    state = {
        "torch": torch.get_rng_state(), "half": torch.randn(3, 2).to(torch.bfloat16), "flag": torch.tensor(True),
        "scalar": torch.tensor(2.5, dtype=torch.float64), "empty": torch.empty(0, 4),
        "strided": torch.arange(12).view(3, 4).t(),
        "numpy": np.random.get_state(), "nested": [(torch.ones(2),)], "grad": torch.ones(2, requires_grad=True),
    }
    saves = Mock(wraps=torch.save)
    monkeypatch.setattr(torch, "save", saves)
    back = pickle.loads(pickle.dumps(tensors_as_bytes(state)))  # what all_gather_object does with it
    assert saves.call_count == 1  # only the tensor that needs grad goes the old way (torch keeps its autograd flag)
    for key in ("torch", "half", "flag", "scalar", "empty", "strided"):
        assert back[key].dtype == state[key].dtype and torch.equal(back[key], state[key]), key
    assert torch.equal(back["nested"][0][0], torch.ones(2)) and back["grad"].requires_grad
    assert (back["numpy"][1] == state["numpy"][1]).all()
