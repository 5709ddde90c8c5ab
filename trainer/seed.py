"""Seeding every generator a training run draws from."""

from __future__ import annotations

import os
import random

import torch

# Spawned DDP workers and DistributedSampler read the seed back from here.
SEED_ENV = "TRAINER_GLOBAL_SEED"


def seed_everything(seed: int) -> int:
    """Seed python's ``random``, numpy (when installed) and torch on every device.

    Returns the seed. The seed is also put in the environment (``TRAINER_GLOBAL_SEED``) so
    that processes started later, such as DDP workers, can derive theirs from it.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed_everything(seed={seed!r}): seed must be an int, e.g. seed_everything(0).")
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed_everything(seed={seed!r}): seed must be in [0, 2**32).")
    os.environ[SEED_ENV] = str(seed)
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    return seed
