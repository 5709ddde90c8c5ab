"""LBFGS under automatic optimization: the optimizer runs the closure as often as it asks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests._models import loader, quiet
from trainer import TrainModule, Trainer


class Regression(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(8, 2)
        self.calls = 0

    def training_step(self, batch, batch_idx):
        self.calls += 1
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=5)


def by_hand(batches: int) -> tuple[nn.Linear, int]:
    torch.manual_seed(0)
    net = nn.Linear(8, 2)
    opt = torch.optim.LBFGS(net.parameters(), lr=0.5, max_iter=5)
    calls = 0
    for i, (x, y) in enumerate(loader(64, 16)):
        if i == batches:
            break

        def closure():
            nonlocal calls
            calls += 1
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            return loss

        opt.step(closure)
    return net, calls


def test_lbfgs_steps_with_the_closure_as_a_hand_written_loop_does():
    model = Regression()
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(model, loader(64, 16))
    net, calls = by_hand(4)
    assert trainer.global_step == 4  # one per optimizer step, not per closure call
    assert model.calls == calls > 4  # the closure ran as many times as LBFGS asked
    assert torch.equal(model.net.weight, net.weight) and torch.equal(model.net.bias, net.bias)


def test_lbfgs_hooks_run_per_closure_call_and_max_steps_counts_steps():
    seen = []

    class Hooked(Regression):
        def on_before_optimizer_step(self, optimizer):
            seen.append(self.trainer.global_step)

    model = Hooked()
    trainer = Trainer(max_steps=2, **quiet())
    trainer.fit(model, loader(64, 16))
    assert trainer.global_step == 2 and len(seen) == model.calls and set(seen) == {0, 1}


def test_lbfgs_with_accumulation_is_a_sentence():
    with pytest.raises(ValueError, match=r"accumulate_grad_batches=2\) with LBFGS"):
        Trainer(max_epochs=1, accumulate_grad_batches=2, **quiet()).fit(Regression(), loader(64, 16))
