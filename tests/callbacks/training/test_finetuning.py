"""BaseFinetuning and BackboneFinetuning: what trains when, the lrs, and a resume after the unfreeze."""

from __future__ import annotations

import glob
import os

import pytest
import torch
from torch import nn

from callbacks import BackboneFinetuning, BaseFinetuning, Callback, ModelCheckpoint
from tests._models import Classifier, loader
from trainer import Trainer


class WithBackbone(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU())
        self.head = nn.Linear(16, 2)
        del self.net

    def forward(self, x):
        return self.head(self.backbone(x))

    def configure_optimizers(self):
        return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=0.1)


class Seen(Callback):
    """At each epoch's end: the backbone's first weight (to see whether it trained) and the lrs."""

    def __init__(self) -> None:
        self.weights: list[torch.Tensor] = []
        self.lrs: list[list[float]] = []

    def on_train_epoch_end(self, trainer, module):
        self.weights.append(module.backbone[0].weight.detach().clone())
        self.lrs.append([g["lr"] for g in trainer.optimizer.param_groups])


def _trainer(*callbacks, epochs=4, **options):
    options.setdefault("log_dir", None)
    return Trainer(max_epochs=epochs, enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks), **options)


def test_the_backbone_trains_from_the_unfreeze_epoch_with_its_own_growing_lr():
    seen, model = Seen(), WithBackbone()
    before = model.backbone[0].weight.detach().clone()
    _trainer(BackboneFinetuning(unfreeze_backbone_at_epoch=2, lambda_func=lambda epoch: 2.0), seen).fit(model, loader(64))
    assert torch.equal(seen.weights[0], before) and torch.equal(seen.weights[1], before)  # frozen in epochs 0 and 1
    assert not torch.equal(seen.weights[2], before)  # trains from epoch 2
    # Epoch 2: a second group at 0.1 * 0.1 (backbone_initial_ratio_lr); then x2 per epoch, never above 0.1.
    assert seen.lrs[1] == [0.1] and seen.lrs[2] == [0.1, pytest.approx(0.01)] and seen.lrs[3] == [0.1, pytest.approx(0.02)]
    assert model.backbone[1].weight.requires_grad  # BatchNorm trained all along (train_bn=True)


def test_the_default_lambda_doubles_the_backbones_lr_each_epoch_and_aligns_with_a_decaying_head():
    """Lightning's default ``lambda_func`` doubles; a StepLR on the head's lr meets it at epoch 6."""

    class Decaying(WithBackbone):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.head.parameters(), lr=0.1)
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)]

    class Starts(Callback):  # after BackboneFinetuning: the lrs each epoch trains with
        def __init__(self):
            self.lrs = []

        def on_train_epoch_start(self, trainer, module):
            self.lrs.append([g["lr"] for g in trainer.optimizer.param_groups])

    starts = Starts()
    _trainer(BackboneFinetuning(unfreeze_backbone_at_epoch=3), starts, epochs=8, limit_train_batches=4).fit(Decaying(), loader(64))
    head = [0.1 * 0.7**e for e in range(8)]
    assert [lrs[0] for lrs in starts.lrs] == pytest.approx(head)
    # 0.1 x the head's at the unfreeze, then x2 per epoch; from epoch 6 (2 x 0.01372 > 0.01176) the head's
    assert [lrs[1] for lrs in starts.lrs[3:]] == pytest.approx([0.00343, 0.00686, 0.01372, head[6], head[7]])


def test_a_run_resumed_after_the_unfreeze_has_the_groups_back_and_ends_identical():
    full = WithBackbone()
    torch.manual_seed(0)
    resumed = WithBackbone()
    resumed.load_state_dict(full.state_dict())
    _trainer(BackboneFinetuning(unfreeze_backbone_at_epoch=1), ModelCheckpoint(dirpath="ck", save_top_k=-1),
             enable_checkpointing=True).fit(full, loader(64))
    mid = glob.glob(os.path.join("ck", "epoch=2-*.ckpt"))[0]
    seen = Seen()
    _trainer(BackboneFinetuning(unfreeze_backbone_at_epoch=1), seen).fit(resumed, loader(64), ckpt_path=mid)
    assert len(seen.lrs[-1]) == 2  # the backbone's group came back
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_base_finetuning_helpers_freeze_and_unfreeze():
    class Mine(BaseFinetuning):
        def freeze_before_training(self, pl_module):
            self.freeze(pl_module.backbone, train_bn=False)

        def finetune_function(self, pl_module, epoch, optimizer):
            if epoch == 1:
                self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, train_bn=False)

    seen, model = Seen(), WithBackbone()
    _trainer(Mine(), seen, epochs=2).fit(model, loader(64))
    assert seen.lrs == [[0.1], [0.1, pytest.approx(0.01)]]  # first group's lr / initial_denom_lr=10
    assert torch.equal(model.backbone[1].weight, torch.ones(16))  # train_bn=False: BatchNorm is not in the new group
    assert len(BaseFinetuning.flatten_modules(model.backbone)) == 3


def test_the_helpers_take_nested_lists_and_warn_of_params_the_optimizer_holds_as_lightnings_do():
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    assert BaseFinetuning.flatten_modules([net[0], [net[1], [net[2]]]]) == [net[0], net[1], net[2]]
    BaseFinetuning.freeze([net[0], [net[1]]], train_bn=False)
    assert not net[0].weight.requires_grad and not net[1].weight.requires_grad and not net[1].track_running_stats
    optimizer = torch.optim.SGD(net[0].parameters(), lr=0.1)
    with pytest.warns(UserWarning, match="The provided params to be frozen already exist within another group"):
        BaseFinetuning.unfreeze_and_add_param_group(net, optimizer)  # net[0]'s are in the optimizer already
    assert len(optimizer.param_groups) == 2 and len(optimizer.param_groups[1]["params"]) == 4  # the others, once


def test_bad_arguments_and_a_missing_backbone_are_explained():
    with pytest.raises(ValueError, match=r"BackboneFinetuning\(unfreeze_backbone_at_epoch\)=-1"):
        BackboneFinetuning(unfreeze_backbone_at_epoch=-1)
    with pytest.raises(ValueError, match=r"backbone_initial_ratio_lr=0\) must be a positive number"):
        BackboneFinetuning(backbone_initial_ratio_lr=0)
    with pytest.raises(ValueError, match=r"BackboneFinetuning needs Classifier.backbone"):
        _trainer(BackboneFinetuning()).fit(Classifier(), loader(32))
