"""trainer/core/summary.py: the example input's forward runs under the precision it is handed."""

from __future__ import annotations

import torch

from strategies.precision import Precision
from trainer import TrainModule
from trainer.core.summary import ModelSummary


class _Probe(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)
        self.example_input_array = torch.zeros(1, 2)
        self.autocast: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.autocast.append(torch.is_autocast_enabled("cpu"))
        return self.layer(x)


def test_the_example_forward_runs_under_the_autocast_of_the_precision_handed_to_it():
    model = _Probe()
    ModelSummary(model)
    ModelSummary(model, precision=Precision("bf16-mixed"))
    assert model.autocast == [False, True]
