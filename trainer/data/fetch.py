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

import warnings
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, Subset, TensorDataset, default_collate
from torch.utils.data._utils.pin_memory import pin_memory

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
    fetcher = batch_fetcher(loader, fetching) if fetching.batched else None
    if fetching.device is not None and (fetcher is None or not getattr(fetcher, "on_device", False)):
        fetching.not_on_device(loader)
    it = iter(loader)
    if drawn is not None and hasattr(it, "_next_index"):
        it._next_index = _recording(it._next_index, drawn)
    if fetcher is None or not hasattr(it, "_next_index"):
        return it
    return _fetched(it, fetcher)


def _recording(next_index: Callable[[], Any], drawn: Any) -> Callable[[], Any]:
    def record() -> Any:
        indices = next_index()
        drawn.append(list(indices) if isinstance(indices, (list, tuple)) else indices)
        return indices

    return record


def _fetched(it: Any, fetch: Fetch) -> Iterator[Any]:
    next_index = it._next_index  # the loader's batch sampler, as its own iterator draws from it
    pin = getattr(it, "_pin_memory", False) and not getattr(fetch, "on_device", False)
    while True:
        try:
            indices = next_index()
        except StopIteration:
            return
        batch = fetch(indices)
        yield pin_memory(batch, it._pin_memory_device) if pin else batch


def batch_fetcher(loader: Any, fetching: Fetching | None = None) -> Fetch | None:
    """A function from a batch's indices to the batch, equal to what ``loader`` would
    yield for them; None where the loader must be iterated as it is."""
    if type(loader) is not DataLoader or loader.num_workers != 0 or loader.batch_sampler is None:
        return None
    if loader.collate_fn is not default_collate:
        return None
    dataset = loader.dataset
    device = None if fetching is None else fetching.device
    by_tensor = _tensor_fetcher(dataset, fetching if device is not None else None)
    if by_tensor is not None:
        if device is None:
            return lambda indices: by_tensor(torch.as_tensor(indices, dtype=torch.int64))
        n = len(dataset)

        def on_device(indices: list[int]) -> list[torch.Tensor]:
            return by_tensor(_valid_index(torch.as_tensor(indices, dtype=torch.int64), n).to(device, non_blocking=True))

        on_device.on_device = True  # type: ignore[attr-defined]
        return on_device
    getitems = getattr(dataset, "__getitems__", None)
    if callable(getitems):
        return lambda indices: default_collate(getitems(indices))
    return None


def _tensor_fetcher(dataset: Any, fetching: Fetching | None = None) -> Callable[[torch.Tensor], list[torch.Tensor]] | None:
    """For a TensorDataset, or a Subset of one, that keeps torch's indexing: the batch as
    default_collate gives it (a list, one stacked tensor per field) from an index tensor
    (on ``fetching``'s device, if it has one, and then with no negative index)."""
    if isinstance(dataset, TensorDataset) and _keeps(dataset, TensorDataset, "__getitem__", "__getitems__"):
        tensors = dataset.tensors if fetching is None else fetching.on_device(dataset, lambda: list(dataset.tensors))
        return lambda idx: [_rows(t, idx) for t in tensors]
    if isinstance(dataset, Subset) and _keeps(dataset, Subset, "__getitem__", "__getitems__"):
        inner = _tensor_fetcher(dataset.dataset, fetching)
        if inner is None:
            return None
        if fetching is None:
            mapping = torch.as_tensor(dataset.indices, dtype=torch.int64)
        else:
            n = len(dataset.dataset)
            (mapping,) = fetching.on_device(dataset, lambda: [_valid_index(torch.as_tensor(dataset.indices, dtype=torch.int64), n)])
        return lambda idx: inner(_rows(mapping, idx))
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
