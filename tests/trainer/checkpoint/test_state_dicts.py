"""A resume whose optimizers or weights are not those of the file stops before training, with a
sentence naming the difference (torch's own errors came at the first step, or never)."""

from __future__ import annotations

import pytest
import torch

from tests._models import Classifier, loader, quiet
from trainer import Trainer
from trainer.checkpoint import layout


class Opt(Classifier):
    """``groups`` param groups (the first layer, then the rest), under ``optimizer``."""

    def __init__(self, optimizer: str = "sgd", groups: int = 1, split: int = 2):
        super().__init__(optimizer=optimizer)
        self.groups, self.split, self.steps = groups, split, 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return super().training_step(batch, batch_idx)

    def configure_optimizers(self):
        params = list(self.parameters())
        groups = [{"params": params}] if self.groups == 1 else [{"params": params[:self.split]}, {"params": params[self.split:]}]
        if self.optimizer_name == "adam":
            return torch.optim.Adam(groups, lr=0.01)
        return torch.optim.SGD(groups, lr=0.1, momentum=0.9)


def _saved(tmp_path, model, forget_class: bool = False) -> str:
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(model, loader(32))
    path = str(tmp_path / "a.ckpt")
    trainer.save_checkpoint(path)
    if forget_class:  # a file of Lightning's, or of ours before the class was recorded
        ckpt = torch.load(path, weights_only=False)
        ckpt[layout.KEY].pop("optimizer_classes", None)
        torch.save(ckpt, path)
    return path


def _resume(path: str, model: Opt) -> str:
    with pytest.raises(ValueError) as info:
        Trainer(max_epochs=3, **quiet()).fit(model, loader(32), ckpt_path=path)
    assert model.steps == 0  # stopped before training
    return str(info.value)


@pytest.mark.parametrize("forget_class", [False, True])
@pytest.mark.parametrize("saved, resumed", [("adam", "sgd"), ("sgd", "adam")])
def test_another_optimizer_is_named_before_training(tmp_path, saved, resumed, forget_class):
    message = _resume(_saved(tmp_path, Opt(saved), forget_class), Opt(resumed))
    names = {"adam": "Adam", "sgd": "SGD"}
    if forget_class:
        assert f"not {names[resumed]}'s" in message and "another optimizer" in message
    else:
        assert f"{names[saved]}" in message and f"now returns {names[resumed]}" in message
    assert "Resume with the optimizer it was trained with" in message


@pytest.mark.parametrize("forget_class", [False, True])
def test_another_number_of_param_groups_is_named(tmp_path, forget_class):
    message = _resume(_saved(tmp_path, Opt(groups=1), forget_class), Opt(groups=2))
    assert "1 param group(s)" in message and "now has 2" in message


def test_param_groups_of_other_sizes_are_named(tmp_path):
    message = _resume(_saved(tmp_path, Opt(groups=2, split=2)), Opt(groups=2, split=1))
    assert "[2, 2] parameters" in message and "now holds [1, 3]" in message


def test_integer_weights_into_a_float_model_are_named(tmp_path):
    path = _saved(tmp_path, Opt())
    ckpt = torch.load(path, weights_only=False)
    ckpt["state_dict"]["net.0.weight"] = ckpt["state_dict"]["net.0.weight"].long()
    torch.save(ckpt, path)
    message = _resume(path, Opt())
    assert "'net.0.weight'" in message and "torch.int64" in message and "torch.float32" in message


def test_the_same_optimizer_resumes_and_load_from_checkpoint_still_casts(tmp_path):
    path = _saved(tmp_path, Opt("adam", groups=2))
    model = Opt("adam", groups=2)
    Trainer(max_epochs=2, **quiet()).fit(model, loader(32), ckpt_path=path)
    assert model.steps == 2
    ckpt = torch.load(path, weights_only=False)
    assert ckpt[layout.KEY]["optimizer_classes"] == ["torch.optim.adam.Adam"]
    ckpt["state_dict"] = {k: v.double() for k, v in ckpt["state_dict"].items()}
    torch.save(ckpt, path)
    loaded = Opt.load_from_checkpoint(path)  # Lightning's: load_state_dict casts to the model's dtype
    assert loaded.net[0].weight.dtype == torch.float32
