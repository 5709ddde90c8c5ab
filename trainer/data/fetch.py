"""Batched fetching: a batch in one indexing call, not a ``dataset[i]`` per sample and a collate.

A ``DataLoader`` over a ``TensorDataset`` with the default ``collate_fn`` makes each batch of
32 from 32 ``dataset[i]`` calls (each a tuple of tensor views) and a ``torch.stack`` per
field: about 160 us, where ``tensor[indices]`` takes about 25 us (benchmarks/overhead.py).
Where the result is the same, element for element, the Trainer fetches that way:

- the loader is a plain ``DataLoader`` with ``num_workers=0``, automatic batching and the
  default ``collate_fn``;
- its dataset is a ``TensorDataset`` (or a ``Subset`` of one, as ``random_split`` makes):
  each field is indexed once with the batch's indices; or any dataset with
  ``__getitems__``, which is called with the batch's indices and collated, as torch's own
  fetcher does.

The indices come from the loader's own iterator (``iter(loader)`` runs as always, with its
seed draw, and its batch sampler gives the batches' indices), so the order, the random
draws, ``set_epoch`` and a resumed run's skipped batches are exactly the loader's. Anything
else is iterated as it is.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import (
    BatchSampler, DataLoader, DistributedSampler, RandomSampler, SequentialSampler, Subset, TensorDataset,
    default_collate,
)
from torch.utils.data._utils.pin_memory import pin_memory

from trainer.data.combined_loader import CombinedLoader

Fetch = Callable[[list[int]], Any]


class Fetching:
    """How a stage fetches its batches: batched where it applies and, with a ``device``
    (``Trainer(data_on_device=True)`` on a GPU), from copies of each ``TensorDataset``'s
    tensors kept on that device for the stage, indexed there: no copy per batch at all."""

    def __init__(self, batched: bool = True, device: torch.device | None = None) -> None:
        self.batched, self.device = batched, device
        self._copies: dict[int, tuple[Any, list[torch.Tensor]]] = {}  # id(dataset) -> (dataset, its tensors there)
        self._warned: set[int] = set()

    def on_device(self, owner: Any, tensors: Callable[[], list[torch.Tensor]]) -> list[torch.Tensor]:
        """``tensors()`` on the device, copied once per stage for ``owner``."""
        entry = self._copies.get(id(owner))
        if entry is None or entry[0] is not owner:
            entry = self._copies[id(owner)] = (owner, [t.to(self.device) for t in tensors()])
        return entry[1]

    def not_on_device(self, loader: Any) -> None:
        dataset = getattr(loader, "dataset", loader)
        if id(dataset) not in self._warned:
            self._warned.add(id(dataset))
            warnings.warn(
                f"Trainer(data_on_device=True) keeps a TensorDataset (or a Subset of one) on {self.device} when "
                "its DataLoader has num_workers=0 and the default collate_fn; this loader's "
                f"{type(dataset).__name__} does not qualify, so its batches are fetched as they are and copied.",
                stacklevel=2,
            )


def batches(loader: Any, fetch: bool | Fetching = True, drawn: Any = None) -> Iterator[Any]:
    """``iter(loader)``, fetching each batch in one call where :func:`batch_fetcher` can.

    ``drawn`` (a deque, or any object with ``append``) receives each batch's sample indices
    as the loader's batch sampler hands them out, in order (a few batches ahead of the one
    being used when workers prefetch); nothing is appended for a loader without a sampler."""
    fetching = fetch if isinstance(fetch, Fetching) else Fetching(bool(fetch))
    if isinstance(loader, CombinedLoader):  # each of its loaders fetched as one would be
        return loader._batches(lambda one: batches(one, fetching))
    fetcher = batch_fetcher(loader, fetching) if fetching.batched else None
    if fetching.device is not None and (fetcher is None or not getattr(fetcher, "on_device", False)):
        fetching.not_on_device(loader)
    it = iter(loader) if drawn is None else _recorded_iter(loader, drawn)
    if fetcher is None or not hasattr(it, "_next_index"):
        return it
    return _fetched(it, fetcher)


def _recorded_iter(loader: Any, drawn: Any) -> Any:
    """``iter(loader)``, appending each batch's indices to ``drawn`` as its batch sampler hands
    them out. A plain DataLoader with worker processes is iterated through a subclass of torch's
    iterator, so that the indices the workers are given before the first batch count too; any
    other loader's iterator records from now on."""
    kind = type(loader)
    if (
        getattr(loader, "num_workers", 0) > 0 and not getattr(loader, "persistent_workers", False)
        and isinstance(loader, DataLoader)
        and kind.__iter__ is DataLoader.__iter__ and kind._get_iterator is DataLoader._get_iterator
    ):
        from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

        class Recording(_MultiProcessingDataLoaderIter):
            def _next_index(self) -> Any:
                return _noted(super()._next_index(), drawn)

        return Recording(loader)
    it = iter(loader)
    if hasattr(it, "_next_index"):
        next_index = it._next_index
        it._next_index = lambda: _noted(next_index(), drawn)
    return it


def _noted(indices: Any, drawn: Any) -> Any:
    drawn.append(list(indices) if isinstance(indices, (list, tuple)) else indices)
    return indices


def _fetched(it: Any, fetch: Fetch) -> Iterator[Any]:
    next_index = it._next_index  # the loader's batch sampler, as its own iterator draws from it
    pin = getattr(it, "_pin_memory", False) and not getattr(fetch, "on_device", False)
    ahead, total = getattr(fetch, "ahead", (1, 0))
    if ahead > 1:  # all but the epoch's last batch; the loop below draws that one, and the end
        chunks = _read_ahead(next_index, fetch.rows, fetch.tensors, ahead, total)  # type: ignore[attr-defined]
        if pin:
            for batch in chunks:
                yield pin_memory(batch, it._pin_memory_device)
        else:  # handed through in C: a generator's resume less per batch
            yield from chunks
    while True:
        try:
            indices = next_index()
        except StopIteration:
            return
        batch = fetch(indices)
        yield pin_memory(batch, it._pin_memory_device) if pin else batch


# A chunk of batches read ahead holds at most this many bytes of the dataset's rows (and 64 batches).
READ_AHEAD_BYTES = 1 << 20
_READ_AHEAD_BATCHES = 64


def _read_ahead(
    next_index: Callable[[], list[int]], rows: Callable[[torch.Tensor], list[torch.Tensor]],
    tensors: list[torch.Tensor], ahead: int, total: int,
) -> Iterator[list[torch.Tensor]]:
    """The epoch's batches but its last, fetched a chunk at a time: up to ``ahead`` batches'
    indices drawn together, as the batch sampler gives them, each field indexed once for the
    chunk and split into the batches (views of the chunk's rows). For a small batch, converting
    its indices and indexing each field cost about as much as its rows (benchmarks/overhead.py).

    The epoch's last batch, and the sampler's end, are left to the caller, to be drawn when the
    loader would draw them: a RandomSampler draws one more permutation from the loader's
    generator as it runs out, and a checkpoint taken before that must not record it. A dataset tensor
    changed in place after its chunk was fetched (its ``_version`` moved) has the chunk's
    remaining rows fetched again: a batch holds the data as it is when the batch is taken."""
    left = total
    while left > 1:
        chunk: list[list[int]] = []
        try:
            while len(chunk) < min(ahead, left - 1):
                chunk.append(next_index())
        except StopIteration:  # fewer batches than its length said: these are all (the caller's
            left = 0  # next draw raises StopIteration again)
        if not chunk:
            return
        left -= len(chunk)
        sizes = [len(indices) for indices in chunk]
        flat = torch.as_tensor(list(itertools.chain.from_iterable(chunk)), dtype=torch.int64)
        versions = [t._version for t in tensors]
        fields = [f.split(sizes) for f in rows(flat)]
        done = 0  # rows of the chunk handed out
        for k, n in enumerate(sizes):
            if [t._version for t in tensors] != versions:  # changed since: fetch the rest again
                versions = [t._version for t in tensors]
                fields = [[None] * k + list(f.split(sizes[k:])) for f in rows(flat[done:])]
            yield [f[k] for f in fields]
            done += n


def read_ahead(loader: DataLoader, tensors: list[torch.Tensor]) -> tuple[int, int]:
    """(how many batches ``_read_ahead`` may draw at once from ``loader``, the epoch's batches);
    (1, 0): one at a time.

    Only where drawing early changes nothing: torch's ``BatchSampler`` over a sequential, a
    distributed, or a random sampler making one pass without replacement, which draw their
    order (and any random number) when the epoch's first batch is asked for. Another sampler
    may draw per batch or read the training's progress, and a resumed epoch's skipping sampler
    puts the RNG back after its skip: those are drawn a batch at a time."""
    batch_sampler = loader.batch_sampler
    if type(batch_sampler) is not BatchSampler or not tensors:
        return 1, 0
    sampler = batch_sampler.sampler
    kind = type(sampler)
    # A RandomSampler drawing more samples than its dataset draws a permutation per pass, mid-epoch.
    one_pass = kind is RandomSampler and not sampler.replacement and sampler.num_samples == len(sampler.data_source)
    if not (kind is SequentialSampler or kind is DistributedSampler or one_pass):
        return 1, 0
    row_bytes = sum(t[0].numel() * t.element_size() for t in tensors if len(t))
    ahead = min(_READ_AHEAD_BATCHES, READ_AHEAD_BYTES // max(1, row_bytes * batch_sampler.batch_size))
    return (ahead, len(batch_sampler)) if ahead > 1 else (1, 0)


def batch_fetcher(loader: Any, fetching: Fetching | None = None) -> Fetch | None:
    """A function from a batch's indices to the batch, equal to what ``loader`` would
    yield for them; None where the loader must be iterated as it is."""
    if type(loader) is not DataLoader or loader.num_workers != 0 or loader.batch_sampler is None:
        return None
    if loader.collate_fn is not default_collate:
        return None
    dataset = loader.dataset
    device = None if fetching is None else fetching.device
    found = _tensor_fetcher(dataset, fetching if device is not None else None)
    if found is not None:
        by_tensor, tensors = found
        if device is None:
            def fetch(indices: list[int]) -> list[torch.Tensor]:
                return by_tensor(torch.as_tensor(indices, dtype=torch.int64))

            fetch.rows, fetch.tensors = by_tensor, tensors  # type: ignore[attr-defined]
            fetch.ahead = read_ahead(loader, tensors)  # type: ignore[attr-defined]
            return fetch
        n = len(dataset)

        def on_device(indices: list[int]) -> list[torch.Tensor]:
            return by_tensor(_valid_index(torch.as_tensor(indices, dtype=torch.int64), n).to(device, non_blocking=True))

        on_device.on_device = True  # type: ignore[attr-defined]
        return on_device
    getitems = getattr(dataset, "__getitems__", None)
    if callable(getitems):
        return lambda indices: default_collate(getitems(indices))
    return None


def _tensor_fetcher(
    dataset: Any, fetching: Fetching | None = None,
) -> tuple[Callable[[torch.Tensor], list[torch.Tensor]], list[torch.Tensor]] | None:
    """For a TensorDataset, or a Subset of one, that keeps torch's indexing: a function giving
    the batch as default_collate gives it (a list, one stacked tensor per field) from an index
    tensor (on ``fetching``'s device, if it has one, and then with no negative index), and the
    dataset's tensors it reads."""
    if isinstance(dataset, TensorDataset) and _keeps(dataset, TensorDataset, "__getitem__", "__getitems__"):
        tensors = dataset.tensors if fetching is None else fetching.on_device(dataset, lambda: list(dataset.tensors))
        return (lambda idx: [_rows(t, idx) for t in tensors]), list(dataset.tensors)
    if isinstance(dataset, Subset) and _keeps(dataset, Subset, "__getitem__", "__getitems__"):
        found = _tensor_fetcher(dataset.dataset, fetching)
        if found is None:
            return None
        inner, tensors = found
        if fetching is None:
            mapping = torch.as_tensor(dataset.indices, dtype=torch.int64)
        else:
            n = len(dataset.dataset)
            (mapping,) = fetching.on_device(
                dataset, lambda: [_valid_index(torch.as_tensor(dataset.indices, dtype=torch.int64), n)]
            )
        return (lambda idx: inner(_rows(mapping, idx))), tensors
    return None


def _valid_index(idx: torch.Tensor, n: int) -> torch.Tensor:
    """``idx`` checked against a dataset of ``n`` and with negative indices counted from the
    end, as indexing does: on a GPU an index out of range would be a device-side assert,
    which ends the process, not an IndexError."""
    if idx.numel():
        lo, hi = idx.min().item(), idx.max().item()
        if lo < -n or hi >= n:
            raise IndexError(f"index {hi if hi >= n else lo} is out of range for a dataset of {n} samples")
        if lo < 0:
            idx = idx.remainder(n)
    return idx


def _rows(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``t[idx]`` for a 1-d index tensor. ``index_select`` copies whole rows, 2x to 3.5x faster
    than indexing's element-wise gather (a batch of 30 sequences of 100 x 10: 6 us against
    21 us), into the contiguous layout that ``default_collate``'s stack gives too. It refuses
    a negative index, which indexing (and ``dataset[i]``) counts from the end."""
    try:
        return t.index_select(0, idx)
    except IndexError:
        return t[idx]


def _keeps(dataset: Any, base: type, *methods: str) -> bool:
    return all(getattr(type(dataset), m, None) is getattr(base, m, None) for m in methods)
