"""Splitting a DataLoader across processes without changing what it does (ddp and the strategies
built on it): training gets a DistributedSampler in place of the loader's plain sampler;
evaluation gets contiguous shards, so that every sample counts exactly once."""

from __future__ import annotations

import os
from typing import Any, Iterator

from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler, Sampler, SequentialSampler

from trainer.core.seed import SEED_ENV


class ContiguousShard(Sampler):
    """Rank r gets the r-th contiguous slice of ``range(n)``; concatenated in rank order the
    slices are the dataset in order, with no sample repeated or dropped."""

    def __init__(self, n: int, world_size: int, rank: int) -> None:
        per, extra = divmod(n, world_size)
        self.start = rank * per + min(rank, extra)
        self.stop = self.start + per + (1 if rank < extra else 0)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.stop))

    def __len__(self) -> int:
        return self.stop - self.start


def sampler_seed() -> int:
    return int(os.environ.get(SEED_ENV, "0"))


def sampler_to_shard(loader: DataLoader) -> Sampler | None:
    """The sampler that draws the loader's samples (also inside a user's
    ``DataLoader(batch_sampler=BatchSampler(...))``), if a DistributedSampler can take its
    place without changing what the loader does, or is one already. None for a batch sampler
    of the user's own class over a DistributedSampler (left alone); otherwise a ValueError."""
    batches = loader.batch_sampler
    if loader.batch_size is None and batches is not None:  # DataLoader(batch_sampler=...): its own batching
        inner = getattr(batches, "sampler", None)
        if type(batches) is not BatchSampler:
            if isinstance(inner, DistributedSampler):
                return None
            raise unsplittable_batches(batches, f"is a {type(batches).__name__}")
        if isinstance(inner, DistributedSampler) or plain(inner):
            return inner
        raise unsplittable_batches(batches, f"draws from a {type(inner).__name__}")
    if not plain(loader.sampler) or (batches is not None and type(batches) is not BatchSampler):
        custom = loader.sampler if not plain(loader.sampler) else batches
        raise ValueError(
            f"strategy='ddp' must split the loader across processes, but it uses {type(custom).__name__}, "
            "which it cannot split without changing what it does. Give the DataLoader a "
            "torch.utils.data.DistributedSampler (or a sampler that shards by rank) yourself; it is then "
            "left alone."
        )
    return loader.sampler


def plain(sampler: Any) -> bool:
    """Only the plain samplers can be swapped for a DistributedSampler without changing meaning."""
    return type(sampler) is SequentialSampler or (
        type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None
    )


def drops_last(loader: DataLoader) -> bool:
    batches = loader.batch_sampler
    return batches.drop_last if loader.batch_size is None and batches is not None else loader.drop_last


def unsplittable_batches(batches: Any, what: str) -> ValueError:
    return ValueError(
        f"strategy='ddp' must split the loader across processes, but its DataLoader(batch_sampler={batches!r}) "
        f"{what}, which it cannot split without changing its batches. Build the batch sampler over a "
        "torch.utils.data.DistributedSampler yourself (it is then left alone), or, for plain batches, pass "
        "batch_size=, shuffle= and drop_last= instead of batch_sampler= (the Trainer then shards them)."
    )
