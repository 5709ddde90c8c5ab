"""Lightning's ``utilities.seed``: code that draws random numbers without moving anyone else's generators."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from trainer.core.seed import seed_everything

__all__ = ["isolate_rng", "seed_everything"]


@contextmanager
def isolate_rng(include_cuda: bool = True) -> Iterator[None]:
    """Inside the block, draw from torch's, Python's and numpy's global generators (and CUDA's with
    ``include_cuda``); on leaving it, they are back where they were, as if the block never ran."""
    python_state = random.getstate()
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if include_cuda and torch.cuda.is_available() else None
    try:
        import numpy
    except ImportError:  # numpy is optional: without it there is no numpy generator to keep
        numpy = None
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        random.setstate(python_state)
        torch.set_rng_state(torch_state)
        if include_cuda:
            torch.cuda.set_rng_state_all(cuda_states or [])
        if numpy is not None:
            numpy.random.set_state(numpy_state)
