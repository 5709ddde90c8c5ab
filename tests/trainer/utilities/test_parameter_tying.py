"""trainer.utilities.parameter_tying: tied weights found and tied again."""

from __future__ import annotations

import torch
from torch import nn

from trainer.utilities import find_shared_parameters, set_shared_parameters


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 3, bias=False)
        self.middle = nn.Linear(3, 4, bias=False)
        self.decoder = nn.Linear(4, 3, bias=False)
        self.decoder.weight = self.encoder.weight


def test_find_shared_parameters_lists_each_tied_group():
    assert find_shared_parameters(_Tied()) == [["encoder.weight", "decoder.weight"]]
    assert find_shared_parameters(nn.Linear(2, 2)) == []


def test_set_shared_parameters_ties_untied_weights_again():
    model = _Tied()
    model.decoder.weight = nn.Parameter(torch.zeros(3, 4))  # untied, as a device move or a copy can leave it
    set_shared_parameters(model, [["encoder.weight", "decoder.weight"]])
    assert model.decoder.weight is model.encoder.weight
    assert find_shared_parameters(model) == [["encoder.weight", "decoder.weight"]]
