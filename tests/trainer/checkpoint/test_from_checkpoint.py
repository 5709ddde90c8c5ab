"""trainer/checkpoint/from_checkpoint.py: a module-valued hyperparameter and weights_only, as Lightning has them."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from trainer import TrainModule
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
