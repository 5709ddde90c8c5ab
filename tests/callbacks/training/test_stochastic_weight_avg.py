"""StochasticWeightAveraging: the average, BatchNorm statistics, the final checkpoint, and an exact resume."""

from __future__ import annotations

import copy
import glob
import os

import pytest
import torch
from torch import nn

from callbacks import Callback, ModelCheckpoint, StochasticWeightAveraging
from tests._models import Classifier, loader
from trainer import Trainer


class WithBatchNorm(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))


class Snapshots(Callback):
    """The weights and lr at each epoch's end (before SWA's own epoch-end work)."""

    def __init__(self) -> None:
        self.weights: list[list[torch.Tensor]] = []
        self.lrs: list[float] = []

    def on_train_epoch_end(self, trainer, module):
        self.weights.append([p.detach().clone() for p in module.parameters()])
        self.lrs.append(trainer.optimizer.param_groups[0]["lr"])


def _trainer(*callbacks, epochs=4, **options):
    return Trainer(max_epochs=epochs, enable_progress_bar=False, log_dir=None, enable_model_summary=False,
                   callbacks=list(callbacks), **options)


def test_the_model_ends_with_the_average_of_the_swa_epochs_and_fresh_batchnorm_statistics():
    snaps = Snapshots()
    swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=2, annealing_epochs=1)
    trainer = _trainer(snaps, swa, ModelCheckpoint(save_last=True))
    model = WithBatchNorm()
    trainer.fit(model, loader(64))
    # Epochs (indexes) 1, 2, 3 are averaged; SWALR, from epoch 1 on, reaches swa_lrs after one epoch.
    expected = [torch.stack(ws).mean(0) for ws in zip(*snaps.weights[1:])]
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.detach(), e)
    assert snaps.lrs == [0.1, 0.1, pytest.approx(0.01), pytest.approx(0.01)]
    # BatchNorm statistics recomputed for the averaged weights, as update_bn does.
    reference = copy.deepcopy(model)
    for m in reference.modules():
        if isinstance(m, nn.BatchNorm1d):
            m.reset_running_stats()
    torch.optim.swa_utils.update_bn(loader(64), reference)
    bn, ref_bn = model.net[1], reference.net[1]
    assert torch.equal(bn.running_mean, ref_bn.running_mean) and torch.equal(bn.running_var, ref_bn.running_var)
    # The final checkpoint holds the averaged weights.
    last = torch.load(os.path.join("checkpoints", "last.ckpt"), weights_only=True)  # the state fit ended with
    for name, value in model.state_dict().items():
        assert torch.equal(last["state_dict"][name], value), name


def test_a_run_resumed_mid_swa_ends_with_the_same_weights():
    full = WithBatchNorm()
    _trainer(StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=0.25, annealing_epochs=3),
             ModelCheckpoint(dirpath="ck", save_top_k=-1), enable_checkpointing=True).fit(full, loader(64))
    mid = glob.glob(os.path.join("ck", "epoch=1-*.ckpt"))[0]  # SWA started in epoch 1, still annealing

    resumed = WithBatchNorm()
    _trainer(StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=0.25, annealing_epochs=3),
             ModelCheckpoint(dirpath="ck2")).fit(resumed, loader(64), ckpt_path=mid)
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("kwargs, message", [
    (dict(swa_lrs=-1.0), r"swa_lrs=-1.0\) must be a positive float"),
    (dict(swa_lrs=[0.2, 1]), r"^The `swa_lrs` should a positive float, or a list of positive floats"),  # Lightning's: floats only
    (dict(swa_lrs=0.1, swa_epoch_start=0), r"swa_epoch_start=0\) must be an int >= 1"),
    (dict(swa_lrs=0.1, swa_epoch_start=1.5), r"or a float in \(0, 1\]"),
    (dict(swa_lrs=0.1, annealing_strategy="step"), r"Unknown StochasticWeightAveraging\(annealing_strategy\)='step'. Valid: 'cos', 'linear'"),
])
def test_bad_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StochasticWeightAveraging(**kwargs)


def test_swa_lrs_of_the_wrong_length_is_an_error_at_fit():
    with pytest.raises(ValueError, match=r"has 2 values and the optimizer has 1 param group"):
        _trainer(StochasticWeightAveraging(swa_lrs=[0.1, 0.2])).fit(Classifier(), loader(32))


class Steps(Classifier):
    def __init__(self, interval):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.interval = interval

    def configure_optimizers(self):
        params = [{"params": self.net[0].parameters(), "lr": 0.1}, {"params": self.net[2].parameters(), "lr": 0.2}]
        optimizer = torch.optim.SGD(params)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1), "interval": self.interval}}


def test_swalr_takes_over_as_lightnings_does_and_says_so(caplog):
    seen = []

    class Watch(Callback):
        def on_train_epoch_start(self, trainer, module):
            groups = trainer.optimizer.param_groups
            seen.append(([g["lr"] for g in groups], [g.get("initial_lr") for g in groups]))

    with caplog.at_level("INFO", logger="trainer"), pytest.warns(UserWarning, match="SWA is currently only supported every epoch"):
        _trainer(StochasticWeightAveraging(swa_lrs=[0.123, 0.321], swa_epoch_start=1), Watch(), epochs=1).fit(Steps("step"), loader(32))
    assert seen == [([0.1, 0.2], [0.123, 0.321])]  # the lrs untouched at SWALR's start; initial_lr the SWA lrs
    assert "Swapping scheduler `StepLR` for `SWALR`" in caplog.text
