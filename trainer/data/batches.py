"""Batches and loaders: moving nested batches, measuring them, and rebuilding loaders."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, Sampler, default_collate

from trainer.core.distributed import (  # noqa: F401 - the data room's names too
    apply_to_tensors, move_to_device, on_cpu, tensors_as_bytes,
)
from trainer.data.combined_loader import CombinedLoader

if TYPE_CHECKING:
    from strategies import Strategy

_log = logging.getLogger("trainer")


def batch_size(batch: Any) -> int:
    """Length along dim 0 of the first tensor found (1 if there is none)."""
    if type(batch) is tuple or type(batch) is list:  # the usual (inputs, targets): this runs every step
        first = batch[0] if batch else None
        if type(first) is torch.Tensor:
            shape = first.shape
            if shape and shape[0]:
                return shape[0]
    if isinstance(batch, (list, tuple)):
        for x in batch:
            if x is None:  # a finished loader's place in a CombinedLoader(mode="max_size") batch
                continue
            n = (x.shape[0] if x.ndim else 1) if isinstance(x, torch.Tensor) else batch_size(x)
            if n:
                return n
        return 1
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.ndim else 1
    if isinstance(batch, dict):
        for x in batch.values():
            if x is None:
                continue
            n = batch_size(x)
            if n:
                return n
        return 1
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return batch_size([getattr(batch, f.name) for f in dataclasses.fields(batch)])
    return 1


def uniform_batches(loader: Any) -> tuple[int, int, int] | None:
    """``(batch size, size of the last batch, index of the last batch)`` for a DataLoader that
    batches its sampler's indices in fixed-size groups; None for any other iterable.

    With the default collate function, a batch's size is the number of samples drawn for it,
    known without looking at the batch (which can cost up to a microsecond per step inside a training
    loop, see benchmarks/). A custom ``collate_fn`` may pack or split samples, so its batches
    are measured like any other iterable's.
    """
    if not isinstance(loader, DataLoader) or type(loader.batch_sampler) is not BatchSampler:
        return None
    if loader.collate_fn is not default_collate:  # it may pack or split samples: measure its batches
        return None
    size = loader.batch_sampler.batch_size
    try:
        samples = len(loader.batch_sampler.sampler)
    except TypeError:  # a sampler without a length (e.g. over an IterableDataset)
        return None
    count = len(loader.batch_sampler)
    last = size if loader.batch_sampler.drop_last or samples % size == 0 else samples % size
    return size, last, count - 1


def loader_length(loader: Any) -> int | None:
    if isinstance(loader, CombinedLoader):  # its len() wants iter() first (Lightning's); its length is known before
        n = loader._length()
        return None if n == math.inf else int(n)
    try:
        return len(loader)
    except (TypeError, NotImplementedError):  # iterable-style dataset without __len__ (or one whose __len__ says so)
        return None


class SkipBatches(Sampler):
    """Yield a batch sampler's batches from ``skip`` on, without loading the skipped data.

    ``after_skip`` runs once the skipped indices have been drawn: the resume path uses it to
    put the RNG back to where the interrupted run was, after the sampler took its seed.
    """

    def __init__(self, batch_sampler: Any, skip: int, after_skip: Callable[[], None] | None = None) -> None:
        self.batch_sampler = batch_sampler
        self.skip = skip
        self.after_skip = after_skip

    def __iter__(self) -> Iterator[list[int]]:
        it = iter(self.batch_sampler)
        for _ in range(self.skip):
            next(it, None)
        if self.after_skip is not None:
            self.after_skip()
            self.after_skip = None
        yield from it

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip)


_LOADER_ARGS = (
    "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
    "generator", "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order",
)


def rebuild_loader(loader: DataLoader, *, sampler: Sampler | None = None, batch_sampler: Any = None) -> DataLoader:
    """A copy of ``loader`` with another sampler or batch sampler and every other setting kept."""
    if type(loader) is not DataLoader:
        raise TypeError(
            f"Cannot re-create the sampler of a {type(loader).__name__}: only torch.utils.data.DataLoader "
            "is supported here. Pass a plain DataLoader, or give it a DistributedSampler yourself."
        )
    kwargs = {name: getattr(loader, name) for name in _LOADER_ARGS if hasattr(loader, name)}
    if kwargs.get("num_workers", 0) == 0:
        kwargs.pop("prefetch_factor", None)
        kwargs["persistent_workers"] = False
    if batch_sampler is not None:
        return DataLoader(loader.dataset, batch_sampler=batch_sampler, **kwargs)
    if loader.batch_sampler is None:  # automatic batching disabled
        return DataLoader(loader.dataset, batch_size=None, sampler=sampler, **kwargs)
    if loader.batch_size is None:  # DataLoader(batch_sampler=BatchSampler(...)): its batching, the new sampler
        batches = loader.batch_sampler
        if type(batches) is not BatchSampler:
            raise TypeError(
                f"Cannot swap the sampler inside DataLoader(batch_sampler={batches!r}): only a "
                "torch.utils.data.BatchSampler's batch size and drop_last are known. Pass batch_size= instead."
            )
        return DataLoader(
            loader.dataset, batch_size=batches.batch_size, sampler=sampler, drop_last=batches.drop_last, **kwargs
        )
    return DataLoader(
        loader.dataset, batch_size=loader.batch_size, sampler=sampler, drop_last=loader.drop_last, **kwargs
    )


def is_batch_sampler(obj: Any) -> bool:
    return isinstance(obj, BatchSampler) or hasattr(obj, "batch_size")


def check_same_length(counts: list[int | float]) -> None:
    """Every rank's number of training batches per epoch, which must agree."""
    if len(set(counts)) > 1:
        raise ValueError(
            f"The processes have different numbers of training batches per epoch: {counts} (by rank). "
            "Every step all-reduces gradients, so a rank that runs out first would wait forever for the "
            "others. Let the Trainer shard a plain DataLoader (DistributedSampler pads to equal lengths), "
            f"give each rank the same number of batches, or set limit_train_batches<={min(counts)}."
        )


def describe_fit(strategy: Strategy, train_loader: Any, accumulate: int) -> str:
    """E.g. 'Training with ddp (gloo) on cpu; 2 device(s), world size 2;
    global batch 64 = 16 per device x 2 device(s) x 2 accumulation.'"""
    devices = strategy.num_devices * strategy.world_size
    tail = f"x {devices} device(s) x {accumulate} accumulation"
    loader_batch = getattr(train_loader, "batch_size", None)  # per process; dp splits it across its devices
    if loader_batch:
        total = loader_batch * strategy.world_size * accumulate
        batch = f"{total} = {loader_batch / strategy.num_devices:g} per device {tail}"
    else:
        batch = f"= per-device batch {tail}"
    return (
        f"Training with {strategy.describe()}; {devices} device(s), world size {strategy.world_size}; "
        f"global batch {batch}."
    )


def in_lockstep(batches: Iterator[Any], strategy: Strategy) -> Iterator[Any]:
    """An unsized loader on several processes: take a batch only when every rank has one.

    A rank that runs out first would otherwise wait forever in the others' next gradient
    all-reduce. The epoch ends on every rank when the first one runs out.
    """
    while True:
        batch = next(batches, _END)
        have = int(strategy.all_reduce_sum(torch.tensor([float(batch is not _END)])).item())
        if have < strategy.world_size:
            if have and strategy.is_global_zero:
                _log.warning(
                    "train_dataloaders ran out on %d of %d processes before the others; the epoch ended on "
                    "all of them. Give every rank the same number of batches to use all the data.",
                    strategy.world_size - have, strategy.world_size,
                )
            return
        yield batch


_END = object()
