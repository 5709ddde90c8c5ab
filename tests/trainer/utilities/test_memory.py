"""trainer.utilities.memory.recursive_detach."""

from __future__ import annotations

from collections import namedtuple

import torch

from trainer.utilities.memory import recursive_detach


def test_recursive_detach_detaches_every_tensor_and_leaves_the_input_alone():
    Pair = namedtuple("Pair", "a b")
    weight = torch.ones(2, requires_grad=True)
    x = {"loss": weight * 2, "nested": [weight.sum(), (3, "s")], "pair": Pair(weight, 1)}
    y = recursive_detach(x, to_cpu=True)
    assert x["loss"].requires_grad and x["nested"][0].requires_grad
    assert not y["loss"].requires_grad and not y["nested"][0].requires_grad
    assert y["nested"][1] == (3, "s") and y["loss"].device.type == "cpu"
    assert torch.equal(y["loss"], torch.full((2,), 2.0))
    assert isinstance(y["pair"], Pair) and not y["pair"].a.requires_grad and y["pair"].b == 1
