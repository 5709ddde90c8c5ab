"""Seeding every generator a training run draws from."""

from __future__ import annotations

import contextlib
import os
import random
from typing import Iterator

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


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool | str) -> Iterator[None]:
    """With ``enabled``, deterministic kernels (``torch.use_deterministic_algorithms``, no cuDNN
    autotuning) inside the block; the process's previous settings come back after it."""
    if not enabled:
        yield
        return
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
        os.environ.get(_CUBLAS_ENV),
    )
    # cuBLAS needs a fixed workspace to be deterministic; it is read when a handle is made.
    os.environ.setdefault(_CUBLAS_ENV, ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=enabled == "warn")  # Lightning's "warn": warn, don't raise
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        enabled_before, warn_only, benchmark, cublas = previous
        torch.use_deterministic_algorithms(enabled_before, warn_only=warn_only)
        torch.backends.cudnn.benchmark = benchmark
        if cublas is None:
            os.environ.pop(_CUBLAS_ENV, None)
        else:
            os.environ[_CUBLAS_ENV] = cublas


_CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
