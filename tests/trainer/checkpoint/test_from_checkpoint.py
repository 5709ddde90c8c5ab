"""trainer/checkpoint/from_checkpoint.py: a module-valued hyperparameter and weights_only, as Lightning has them."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from tests._models import quiet
from trainer import Trainer, TrainModule
from trainer.checkpoint.files import CheckpointError


class Wrapper(TrainModule):
    def __init__(self, net: nn.Module, lr: float = 0.1) -> None:
        super().__init__()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the "already saved during checkpointing" warning
            self.save_hyperparameters()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _lightnings_file(path) -> Wrapper:
    """A checkpoint as Lightning writes this model: the network pickled among the hyperparameters."""
    model = Wrapper(nn.Linear(3, 2), lr=0.5)
    torch.save({
        "state_dict": model.state_dict(), "hyper_parameters": {"net": nn.Linear(3, 2), "lr": 0.5},
        "hparams_name": "kwargs", "pytorch-lightning_version": "2.6.6", "epoch": 0, "global_step": 1,
    }, path)
    return model


def test_weights_only_false_rebuilds_the_network_a_lightning_file_pickled_and_loads_its_weights(tmp_path):
    trained = _lightnings_file(tmp_path / "lightning.ckpt")
    loaded = Wrapper.load_from_checkpoint(tmp_path / "lightning.ckpt", weights_only=False)
    assert isinstance(loaded.net, nn.Linear) and loaded.hparams.lr == 0.5
    assert torch.equal(loaded.net.weight, trained.net.weight)  # the state dict's weights, not the pickled copy's


def test_by_default_such_a_file_is_refused_before_any_code_in_it_runs(tmp_path):
    _lightnings_file(tmp_path / "lightning.ckpt")
    with pytest.raises(CheckpointError, match="weights_only=False"):
        Wrapper.load_from_checkpoint(tmp_path / "lightning.ckpt")


class Trained(Wrapper):
    def training_step(self, batch, batch_idx):
        return self(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _our_file(tmp_path) -> tuple[Trained, str]:
    model = Trained(nn.Linear(3, 2), lr=0.5)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3)), batch_size=4)
    trainer = Trainer(max_steps=2, **quiet())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        trainer.fit(model, data)
        trainer.save_checkpoint(tmp_path / "ours.ckpt")
    return model, str(tmp_path / "ours.ckpt")


def test_our_checkpoint_rebuilds_a_network_passed_to_init_when_weights_only_false_is_asked_for(tmp_path):
    trained, path = _our_file(tmp_path)
    loaded = Trained.load_from_checkpoint(path, weights_only=False)
    assert isinstance(loaded.net, nn.Linear) and loaded.net is not trained.net and loaded.hparams.lr == 0.5
    assert torch.equal(loaded.net.weight, trained.net.weight)
    assert torch.load(path, weights_only=True)["hyper_parameters"] == {"lr": 0.5}  # the default load stays safe


def test_by_default_our_checkpoint_asks_for_the_network_and_takes_it(tmp_path):
    trained, path = _our_file(tmp_path)
    with pytest.raises(TypeError, match=r"left out 'net'.*load_from_checkpoint\(path, net=\.\.\.\)"):
        Trained.load_from_checkpoint(path)
    loaded = Trained.load_from_checkpoint(path, net=nn.Linear(3, 2))
    assert torch.equal(loaded.net.weight, trained.net.weight)
