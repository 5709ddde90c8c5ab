"""Several loaders iterated as one: Lightning's ``CombinedLoader`` and its four modes.

``iterables`` is one iterable or a collection of them: a dict, list or tuple (a namedtuple
too), nested as deep as you like. Each step of a pass gives a triple
``(batch, batch_idx, dataloader_idx)``:

- ``min_size``: a batch from every iterable, in the collection's shape; ends with the shortest.
- ``max_size_cycle``: as ``min_size``, but ends with the longest; a shorter one starts over
  when it runs out (what ``fit`` does with several training loaders).
- ``max_size``: ends with the longest; a finished iterable gives ``None``.
- ``sequential``: each iterable to its end in turn, one batch at a time (``batch_idx``
  counts within it, ``dataloader_idx`` is its place in :attr:`flattened`); what validation,
  test and predict do with several loaders.

A list, tuple or dict holding only numbers and strings is one iterable (its items are the
batches), not a collection of them, as in Lightning.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

MODES = ("min_size", "max_size_cycle", "max_size", "sequential")
_LENGTH = {"min_size": min, "max_size_cycle": max, "max_size": max, "sequential": sum}  # over the iterables' lengths


class CombinedLoader:
    """Iterate ``iterables`` (one, or a nested dict/list/tuple of them) together under ``mode``.

    ``len()`` needs ``iter()`` first, as in Lightning; an iterable without a length makes the
    combined one unsized (``len`` raises ``TypeError``) unless ``limits`` cap it. ``limits``
    (one number, or one per iterable) cap each iterable's batches: the length counts them, and
    ``sequential`` stops each iterable there.
    """

    def __init__(self, iterables: Any, mode: str = "min_size") -> None:
        if mode not in MODES:
            raise ValueError(f"Unsupported mode {mode!r}, please select one of: {list(MODES)}.")
        self._iterables = iterables
        self._flattened, self._spec = _flatten(iterables)
        self._mode = mode
        self._limits: list[int | float] | None = None
        self._pass: _Pass | None = None

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def iterables(self) -> Any:
        """The iterables as given (their collection)."""
        return self._iterables

    @property
    def flattened(self) -> list[Any]:
        """The iterables as one flat list, in the collection's order (a dict's keys in order)."""
        return self._flattened

    @flattened.setter
    def flattened(self, flattened: list[Any]) -> None:
        """Replace the iterables (e.g. each given its DistributedSampler), keeping the collection's shape."""
        if len(flattened) != len(self._flattened):
            raise ValueError(
                f"Mismatch in flattened length ({len(flattened)}) and existing length ({len(self._flattened)}): "
                "give one iterable for each of `flattened`."
            )
        self._flattened = list(flattened)
        self._iterables = _unflatten(self._flattened, self._spec)

    @property
    def limits(self) -> list[int | float] | None:
        return self._limits

    @limits.setter
    def limits(self, limits: int | float | list[int | float] | None) -> None:
        if isinstance(limits, (int, float)):
            limits = [limits] * len(self._flattened)
        elif limits is not None and len(limits) != len(self._flattened):
            raise ValueError(
                f"Mismatch in number of limits ({len(limits)}) and number of iterables ({len(self._flattened)}): "
                "give one number for all, or one per iterable."
            )
        self._limits = None if limits is None else list(limits)

    @property
    def sampler(self) -> Any:
        """Each iterable's ``sampler`` (None where it has none), in the collection's shape."""
        return _unflatten([getattr(x, "sampler", None) for x in self._flattened], self._spec)

    @property
    def batch_sampler(self) -> Any:
        """Each iterable's ``batch_sampler`` (None where it has none), in the collection's shape."""
        return _unflatten([getattr(x, "batch_sampler", None) for x in self._flattened], self._spec)

    def __iter__(self) -> CombinedLoader:
        self._pass = _Pass(self._mode, self._flattened, self._limits, iter)
        return self

    def __next__(self) -> tuple[Any, int, int]:
        if self._pass is None:
            raise TypeError("CombinedLoader is not an iterator until iter(combined_loader) is called.")
        batch, batch_idx, dataloader_idx = next(self._pass)
        return (batch if self._mode == "sequential" else _unflatten(batch, self._spec)), batch_idx, dataloader_idx

    def __len__(self) -> int:
        """The number of steps in a pass (``batch, batch_idx, dataloader_idx`` triples)."""
        if self._pass is None:
            raise RuntimeError("Please call `iter(combined_loader)` first: the length is known once iteration starts.")
        n = self._length()
        if n == math.inf:
            raise TypeError("This CombinedLoader has no length: one of its iterables has none (and no limit caps it).")
        return int(n)

    def _length(self) -> int | float:
        """The length without ``iter()`` first (inf if unsized): what the Trainer reads."""
        lengths = [_sized_len(x) for x in self._flattened]
        if self._limits is not None:
            lengths = [min(n, limit) for n, limit in zip(lengths, self._limits)]
        return _LENGTH[self._mode](lengths) if lengths else 0

    def _batches(self, open_: Callable[[Any], Iterator[Any]] = iter) -> Iterator[Any]:
        """A pass's batches alone (what a training step gets), each iterable opened with
        ``open_`` (the Trainer's batched fetching)."""
        self._pass = step = _Pass(self._mode, self._flattened, self._limits, open_)
        if self._mode == "sequential":
            return (batch for batch, _, _ in step)
        spec = self._spec
        return (_unflatten(batch, spec) for batch, _, _ in step)

    def reset(self) -> None:
        """End the current pass, and shut down the iterables' worker processes (a DataLoader's
        persistent workers start again at the next pass)."""
        self._pass = None
        for loader in self._flattened:
            if getattr(loader, "_iterator", None) is not None:
                loader._iterator = None  # a DataLoader's persistent workers stop when their iterator goes

    def __repr__(self) -> str:
        return f"CombinedLoader({self._iterables!r}, mode={self._mode!r})"


class _Pass:
    """One pass over the iterables under a mode; yields ``(batches, batch_idx, dataloader_idx)``
    where ``batches`` is a flat list (sequential: one batch). The iterables are opened when
    the pass starts, as Lightning's: sequential opens each when its turn comes."""

    def __init__(
        self, mode: str, iterables: list[Any], limits: list[int | float] | None, open_: Callable[[Any], Any],
    ) -> None:
        if limits is not None and len(limits) != len(iterables):
            raise ValueError(f"Mismatch in number of limits ({len(limits)}) and number of iterables ({len(iterables)})")
        self.mode, self.iterables, self.limits, self.open = mode, iterables, limits, open_
        self.idx = 0  # batch_idx
        self.which = 0  # sequential: dataloader_idx
        self.done = [False] * len(iterables)  # max_size_cycle: ran out once; max_size: ran out
        if mode == "sequential":
            self.iterators = [open_(iterables[0])] if iterables else []
        else:
            self.iterators = [open_(x) for x in iterables]

    def __iter__(self) -> _Pass:
        return self

    def __next__(self) -> tuple[Any, int, int]:
        if self.mode == "sequential":
            return self._sequential()
        if not self.iterators:
            raise StopIteration
        if self.mode == "min_size":
            out = [next(it) for it in self.iterators]
        elif self.mode == "max_size":
            out = [None if self.done[i] else self._next_or_done(i) for i in range(len(self.iterators))]
            if all(self.done):
                raise StopIteration
        else:
            out = [self._cycled(i) for i in range(len(self.iterators))]
        self.idx += 1
        return out, self.idx - 1, 0

    def _next_or_done(self, i: int) -> Any:
        try:
            return next(self.iterators[i])
        except StopIteration:
            self.done[i] = True
            return None

    def _cycled(self, i: int) -> Any:
        try:
            return next(self.iterators[i])
        except StopIteration:
            self.done[i] = True
            if all(self.done):
                raise
            self.iterators[i] = self.open(self.iterables[i])  # a shorter one starts over
            return next(self.iterators[i])

    def _sequential(self) -> tuple[Any, int, int]:
        while self.which < len(self.iterables):
            if self.limits is None or self.idx < self.limits[self.which]:
                try:
                    batch = next(self.iterators[0])
                except StopIteration:
                    pass
                else:
                    self.idx += 1
                    return batch, self.idx - 1, self.which
            self.which, self.idx = self.which + 1, 0  # the next iterable; only one is open at a time
            self.iterators = [self.open(self.iterables[self.which])] if self.which < len(self.iterables) else []
        raise StopIteration


def _sized_len(iterable: Any) -> int | float:
    try:
        return len(iterable)
    except (TypeError, NotImplementedError):
        return math.inf


def is_leaf(x: Any) -> bool:
    """An iterable, not a collection of them: anything but a dict, list or tuple, or one that
    holds only numbers and strings (its items are the batches)."""
    if not isinstance(x, (dict, list, tuple)):
        return True
    items = x.values() if isinstance(x, dict) else x
    return all(isinstance(item, (int, float, str)) for item in items)


def _flatten(tree: Any) -> tuple[list[Any], Any]:
    """The leaves in order, and a spec that :func:`_unflatten` rebuilds the collection from."""
    if is_leaf(tree):
        return [tree], None
    keys = list(tree) if isinstance(tree, dict) else None
    children = [tree[k] for k in keys] if keys is not None else list(tree)
    leaves: list[Any] = []
    specs = []
    for child in children:
        flat, spec = _flatten(child)
        leaves += flat
        specs.append((len(flat), spec))
    return leaves, (tree, keys, specs)


def _unflatten(leaves: list[Any], spec: Any) -> Any:
    if spec is None:
        return leaves[0]
    original, keys, specs = spec
    children, at = [], 0
    for n, child_spec in specs:
        children.append(_unflatten(leaves[at:at + n], child_spec))
        at += n
    if keys is not None:
        plain = dict(zip(keys, children))
        try:
            return plain if type(original) is dict else type(original)(plain)  # an OrderedDict: the same type back
        except TypeError:  # a mapping that cannot be built from one (a defaultdict): a dict
            return plain
    if hasattr(original, "_fields"):  # a namedtuple
        return type(original)(*children)
    return type(original)(children)
