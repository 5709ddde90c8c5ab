"""trainer.utilities.seed.isolate_rng."""

from __future__ import annotations

import random

import numpy as np
import torch

from trainer.utilities.seed import isolate_rng


def test_isolate_rng_leaves_every_generator_where_it_was():
    torch.rand(1), np.random.rand(1), random.random()
    with isolate_rng():
        inside = (torch.rand(2), np.random.rand(2), random.random())
    after = (torch.rand(2), np.random.rand(2), random.random())
    assert torch.equal(inside[0], after[0]) and np.array_equal(inside[1], after[1]) and inside[2] == after[2]


def test_isolate_rng_restores_even_when_the_block_raises():
    before = torch.get_rng_state()
    try:
        with isolate_rng(include_cuda=False):
            torch.rand(5)
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert torch.equal(torch.get_rng_state(), before)
