"""One pass over a loader, as fit, validate, test and predict iterate it: the one place that calls
``iter(loader)`` for a loop.

The order, for each pass::

    set_epoch(loader, epoch)                    # a sampler that shuffles per epoch
    resumed mid-epoch (a StartPoint from the checkpoint): the interrupted epoch's order made
        again, its consumed batches skipped at the batch sampler, then the save-time RNG put back
    iter(loader), each batch fetched in one call where it can be (fetch.py)
    in lockstep across ranks (an unsized training loader), cut at the stage's limit
    the precision's dtype (a true-precision run), then copied ahead to a CUDA device
    per batch, in the loop: the transfer hooks (``on_before_batch_transfer``,
        ``transfer_batch_to_device``, ``on_after_batch_transfer``), else the strategy's
        ``batch_to_device`` when it runs the step

A checkpoint hands a resumed epoch its :class:`StartPoint` (a position and RNG states); it
never iterates the loader itself.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from trainer.core.datamodule import DataModule
from trainer.core.exceptions import PossibleUserWarning
from trainer.core.module import overridden
from trainer.data.batches import SkipBatches, in_lockstep, loader_length, rebuild_loader
from trainer.data.fetch import Fetching, batches
from trainer.data.rng import (
    check_resumable, epoch_start_state, seeded_sampler, set_epoch, set_epoch_start_state, set_generator_states,
    set_rng_state, stateful,
)

log = logging.getLogger("trainer")
Timer = Callable[[str, Iterator[Any]], Iterator[Any]]


@dataclass(frozen=True)
class StartPoint:
    """Where a resumed epoch starts, as its checkpoint recorded it.

    ``batch``: the batches the interrupted epoch consumed (skipped, never loaded);
    ``epoch_start``: the RNG just before its ``iter(loader)``, which re-creates its order;
    ``rng``: the RNG at the save, put back once the skip is done (None across a change of
    world size: then the order and the random numbers cannot line up, and are drawn afresh);
    ``sampler_seed``: a DistributedSampler's seed; ``then``: runs once the RNG is back, before
    the next batch (the validation a checkpoint was saved before)."""

    batch: int = 0
    epoch_start: dict[str, Any] | None = None
    rng: dict[str, Any] | None = None
    sampler_seed: int | None = None
    then: Callable[[], Any] | None = None


class BatchPipeline:
    """A stage's batches: what each pass over a loader goes through on its way to the step.

    ``strategy`` places batches on its device, ``precision`` converts them, ``fetching`` says
    how they are fetched, ``timer`` (a profiler's) times each fetch under a name."""

    def __init__(
        self, strategy: Any, precision: Any, fetching: bool | Fetching = True, *, timer: Timer | None = None,
    ) -> None:
        self.strategy, self.precision, self.fetching, self.timer = strategy, precision, fetching, timer
        self.epoch_start: dict[str, Any] | None = None  # the RNG before the last iter(loader): checkpoints keep it

    def open(
        self, loader: Any, epoch: int, *, start: StartPoint | None = None, limit: int | float = math.inf,
        lockstep: bool = False, drawn: Any = None, timed_as: str | None = None, as_given: bool = False,
    ) -> Iterator[Any]:
        """The batches of one pass over ``loader`` in ``epoch``, up to ``limit`` (resumed at ``start``);
        ``as_given``: not converted nor moved (a ``dataloader_iter`` step's, which does that itself)."""
        it = self._first(loader, epoch, start, drawn)
        if lockstep and self.strategy.world_size > 1:
            it = in_lockstep(it, self.strategy)
        if self.timer is not None and timed_as is not None:  # without a profiler, nothing changes
            it = self.timer(timed_as, it)  # inside the limit: a stop at the limit draws (and times) no batch more
        if limit != math.inf:
            it = itertools.islice(it, int(limit))
        if not as_given:
            it = self.strategy.device_batches(self.precision.convert_batches(it))
        return it

    def feed(self, loaders: Any, counts: list[int | float], epoch: int, timed_as: str | None = None) -> DataLoaderIter:
        """What a ``dataloader_iter`` evaluation step gets: each of ``loaders``' batches in turn, up to its count."""
        def opener(loader: Any) -> Callable[[], Iterator[Any]]:
            return lambda: self.open(loader, epoch, timed_as=timed_as, as_given=True)

        return DataLoaderIter([(opener(loader), n) for loader, n in zip(loaders, counts)])

    def _first(self, loader: Any, epoch: int, start: StartPoint | None, drawn: Any) -> Iterator[Any]:
        """``iter(loader)`` for the pass, after ``set_epoch``; resumed: at the checkpoint's batch."""
        if start is not None and start.sampler_seed is not None:
            self._restore_sampler_seed(loader, start.sampler_seed)
        set_epoch(loader, epoch)
        if start is None:
            self.epoch_start = epoch_start_state(loader)
            return batches(loader, self.fetching, drawn)
        check_resumable(loader, start.batch, epoch)
        if start.rng is None:  # another world size: no exact RNG to put back
            self.epoch_start = epoch_start_state(loader)
            return skip(loader, start.batch, fetch=self.fetching)
        rng = start.rng

        def put_back_rng() -> None:
            set_rng_state(rng)
            set_generator_states(loader, rng.get("loader", []))
            if start.then is not None:
                start.then()

        own_state = rng.get("loader_state")
        if start.batch == 0 or own_state is not None:  # a Stateful loader goes on from the state it saved
            if start.batch:
                loader.load_state_dict(own_state)
            put_back_rng()
            self.epoch_start = epoch_start_state(loader) if not start.batch else start.epoch_start
            return batches(loader, self.fetching)
        # Re-create the interrupted epoch's order, skip what it consumed, then continue its RNG.
        set_epoch_start_state(loader, start.epoch_start)
        self.epoch_start = start.epoch_start
        return skip(loader, start.batch, after=put_back_rng, fetch=self.fetching)

    def _restore_sampler_seed(self, loader: Any, seed: int) -> None:
        """A DistributedSampler shuffles by seed + epoch: use the checkpoint's seed, whatever this run set."""
        sampler = seeded_sampler(loader)
        if sampler is None:
            return
        if sampler.seed != seed and self.strategy.global_rank == 0:
            log.warning(
                "The DistributedSampler's seed is %d in this run but %d in the checkpoint; using %d so "
                "that the resumed run sees the same data order.", sampler.seed, seed, seed,
            )
        sampler.seed = seed


def skip(loader: Any, n: int, after: Callable[[], None] | None = None, fetch: bool | Fetching = True) -> Iterator[Any]:
    """``iter(loader)`` without its first ``n`` batches, skipped at the batch sampler so that
    their data is never loaded. ``after`` runs once the sampler has drawn its order."""
    if n == 0:
        it = batches(loader, fetch)
        if after is not None:
            after()
        return it
    stream = isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset)
    if getattr(loader, "batch_sampler", None) is not None and not stream:
        try:
            skipping = SkipBatches(loader.batch_sampler, n, after_skip=after)
            return batches(rebuild_loader(loader, batch_sampler=skipping), fetch)
        except TypeError:  # a DataLoader subclass we cannot re-create
            pass
    if stream:  # its order is the dataset's own: the same batches come again, and are dropped
        log.info("Resuming mid-epoch: drawing the %d consumed batches of the IterableDataset again, and dropping them.",
                 n)
    elif n < (loader_length(loader) or math.inf) and stateful(loader):  # a checkpoint of another loader
        warnings.warn(
            f"The checkpoint holds no state of this {type(loader).__name__}, which has state_dict/load_state_dict "
            f"(was it saved with another loader?): its {n} consumed batches are loaded again and dropped.",
            stacklevel=3,
        )
    elif n < (loader_length(loader) or math.inf):  # (a checkpoint saved at the epoch's end leaves nothing to skip)
        warnings.warn(
            "You're resuming from a checkpoint that ended before the epoch ended and your dataloader is not "
            "resumable. This can cause unreliable results if further training is done. Consider using an "
            "end-of-epoch checkpoint or make your dataloader resumable by implementing the `state_dict` / "
            f"`load_state_dict` interface. (The {n} consumed batches of this {type(loader).__name__} are loaded "
            "again and dropped: the same ones only if it yields the same batches each pass. A torch DataLoader "
            "resumes exactly.)", PossibleUserWarning, stacklevel=3,
        )
    it = iter(loader)
    for _ in range(n):
        next(it, None)
    if after is not None:
        after()
    return it


def batch_transfer(model: Any, strategy: Any, datamodule: Any = None) -> Callable[[Any, int], Any] | None:
    """``on_before_batch_transfer``, ``transfer_batch_to_device`` and ``on_after_batch_transfer``
    as one function ``(batch, dataloader_idx) -> batch``, or None when neither the model nor the
    DataModule overrides any of them (the strategy moves the batch, as always). Each hook is the
    DataModule's where it overrides it (Lightning's rule, with its warning when both do), else
    the model's."""
    names = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")
    dm_own = {n for n in names if datamodule is not None and _dm_overrides(datamodule, n)}
    if not dm_own and not any(overridden(model, name) for name in names):
        return None
    for name in dm_own:
        if overridden(model, name):
            warnings.warn(
                f"You have overridden `{name}` in both `LightningModule` and `LightningDataModule`. It will use the "
                f"implementation from `LightningDataModule` instance ({type(datamodule).__name__}.{name}).",
                UserWarning, stacklevel=2,
            )
    before, move, after = (getattr(datamodule if name in dm_own else model, name) for name in names)
    device = strategy.root_device

    def transfer(batch: Any, dataloader_idx: int) -> Any:
        return after(move(before(batch, dataloader_idx), device, dataloader_idx), dataloader_idx)

    return transfer


def _dm_overrides(datamodule: Any, name: str) -> bool:
    base = getattr(DataModule, name)
    return getattr(type(datamodule), name, base) is not base


def takes_dataloader_iter(model: Any, step_name: str) -> bool:
    """Whether ``model``'s ``step_name`` (``training_step``, ``validation_step``, ...) takes a
    parameter named ``dataloader_iter``: then it gets a :class:`DataLoaderIter`, not a batch,
    and fetches its batches itself (Lightning's experimental flavour, with Lightning's warning)."""
    step = getattr(type(model), step_name, None)  # the class's: the loops may adapt the instance's (no batch_idx)
    try:
        found = step is not None and "dataloader_iter" in inspect.signature(step).parameters
    except (TypeError, ValueError):  # a builtin or a C function: no signature to read
        return False
    if found:
        warnings.warn(
            f"Found `dataloader_iter` argument in the `{step_name}`. Note that the support for "
            "this signature is experimental and the behavior is subject to change.", UserWarning, stacklevel=2,
        )
    return found


_END = object()


class DataLoaderIter:
    """What a ``*_step(self, dataloader_iter)`` receives: an iterator over the stage's batches
    that the step draws from itself, as many as it wants. ``next`` gives ``(batch, batch_idx,
    dataloader_idx)``, the batch as the loader gave it (no transfer hooks, not moved to the
    device: that is the step's to do), ``batch_idx`` counted per loader. It raises
    StopIteration once the stage's batches (up to its limit, over every loader in turn) are
    used up: ``done`` says so beforehand where the lengths are known.

    ``passes``: for each loader in turn, a function that opens its batches and how many to
    take (inf: until it runs out). ``batch``, ``batch_idx`` and ``dataloader_idx`` are the
    last fetched (None, 0, 0 before the first): the loops hand them to the batch hooks."""

    def __init__(self, passes: list[tuple[Callable[[], Iterator[Any]], int | float]]) -> None:
        self._passes, self._pass, self._it, self._in_pass = passes, 0, None, 0
        self.length = sum(n for _, n in passes)
        self.fetched = 0
        self.done = self.length == 0
        self.batch: Any = None
        self.batch_idx = self.dataloader_idx = 0

    def steps(self, dataloader_idx: int) -> Iterator[tuple[int, Any]]:
        """For the loop: ``(batch_idx, batch)`` of the last fetch before each step, while batches are
        left and the last came from loader ``dataloader_idx`` (so a loop per loader goes on to the next)."""
        while not self.done and self.dataloader_idx == dataloader_idx:
            yield self.batch_idx, self.batch

    def __iter__(self) -> DataLoaderIter:
        return self

    def __next__(self) -> tuple[Any, int, int]:
        if self.done:
            raise StopIteration
        while True:
            if self._pass >= len(self._passes):
                self.done = True
                raise StopIteration
            open_pass, n = self._passes[self._pass]
            if self._in_pass < n:
                if self._it is None:
                    self._it = open_pass()
                batch = next(self._it, _END)
                if batch is not _END:
                    break
            self._pass, self._it, self._in_pass = self._pass + 1, None, 0
        self._in_pass += 1
        self.fetched += 1
        self.batch, self.batch_idx, self.dataloader_idx = batch, self._in_pass - 1, self._pass
        if self.length != math.inf:
            self.done = self.fetched >= self.length
        return batch, self.batch_idx, self.dataloader_idx
