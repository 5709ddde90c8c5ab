"""Moving and measuring batches."""

from __future__ import annotations

import dataclasses
from collections import namedtuple

import torch

from trainer.data import batch_size, move_to_device

CPU = torch.device("cpu")


def test_a_cpu_batch_bound_for_the_cpu_is_passed_through_unchanged():
    x, y = torch.randn(4, 3), torch.arange(4)
    for batch in ([x, y], (x, y), {"x": x, "meta": {"ids": [1, 2], "name": "a"}}, x):
        assert move_to_device(batch, CPU) is batch


def test_other_containers_are_rebuilt_with_their_type():
    Pair = namedtuple("Pair", "x y")

    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        n: int

    pair = move_to_device(Pair(torch.ones(2), 3), CPU)
    assert type(pair) is Pair and torch.equal(pair.x, torch.ones(2)) and pair.y == 3
    moved = move_to_device(Batch(torch.ones(2), 5), CPU)
    assert type(moved) is Batch and moved.n == 5


def test_batch_size_is_the_first_non_empty_leading_dimension():
    assert batch_size([torch.randn(5, 3), torch.arange(5)]) == 5
    assert batch_size((torch.empty(0, 3), torch.arange(7))) == 7
    assert batch_size([torch.tensor(1.0), torch.arange(2)]) == 1  # a 0-d tensor counts as one
    assert batch_size({"x": [torch.randn(6, 2)]}) == 6
    assert batch_size(["text", 3]) == 1
