"""Seeding every generator a training run draws from."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import random
from typing import Iterator

import torch

# Spawned DDP workers and DistributedSampler read the seed back from here.
SEED_ENV = "TRAINER_GLOBAL_SEED"


def seed_everything(seed: int | None = None, workers: bool = False, verbose: bool = True) -> int:
    """Seed python's ``random``, numpy (when installed) and torch on every device.

    Returns the seed. The seed is also put in the environment (``TRAINER_GLOBAL_SEED``) so
    that processes started later, such as DDP workers, can derive theirs from it. ``seed=None``
    takes it from there (else 0). ``workers=True``: each DataLoader worker the Trainer runs gets
    its own seeds for torch, ``random`` and numpy, derived from the loader's, the worker's id and
    the process's global rank (a DataLoader of your own ``worker_init_fn`` keeps it).
    """
    if seed is None:
        env = os.environ.get(SEED_ENV, os.environ.get("PL_GLOBAL_SEED"))
        seed = int(env) if env is not None and env.isdigit() else 0
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed_everything(seed={seed!r}): seed must be an int, e.g. seed_everything(0).")
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed_everything(seed={seed!r}): seed must be in [0, 2**32).")
    os.environ[SEED_ENV] = str(seed)
    os.environ[WORKERS_ENV] = "1" if workers else "0"
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    return seed


def seed_worker(worker_id: int, rank: int = 0) -> None:
    """A DataLoader's ``worker_init_fn`` under ``seed_everything(workers=True)``: seeds torch,
    ``random`` and numpy in the worker from (the loader's base seed, worker id, global rank),
    so that no two workers of any rank draw the same numbers, and a rerun draws them again."""
    base = torch.initial_seed() - worker_id  # torch gives each worker base_seed + worker_id
    digest = hashlib.sha256(f"{base}/{worker_id}/{rank}".encode()).digest()
    torch_seed, std_seed, np_seed = (int.from_bytes(digest[i:i + 8], "little") for i in (0, 8, 16))
    torch.manual_seed(torch_seed)
    random.seed(std_seed)
    try:
        import numpy as np
    except ImportError:
        return
    np.random.seed(np_seed % 2**32)


def seeded_workers(loader: object, rank: int) -> None:
    """Give ``loader`` :func:`seed_worker` when ``seed_everything(workers=True)`` asked for it and
    the loader has workers and no ``worker_init_fn`` of its own."""
    if os.environ.get(WORKERS_ENV) != "1" or getattr(loader, "num_workers", 0) == 0:
        return
    if getattr(loader, "worker_init_fn", True) is None:
        loader.worker_init_fn = functools.partial(seed_worker, rank=rank)  # type: ignore[attr-defined]


WORKERS_ENV = "TRAINER_SEED_WORKERS"


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
