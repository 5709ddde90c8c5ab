"""fit's training and validation loaders: where they come from, checked, seeded and prepared
by the strategy; again every ``reload_dataloaders_every_n_epochs`` epochs."""

from __future__ import annotations

import collections.abc
import math
import warnings
from typing import TYPE_CHECKING, Any

from trainer.core.seed import seeded_workers
from trainer.data.batches import check_same_length, loader_length
from trainer.data.loaders import (
    LOADER_METHOD, Loaders, check_train_mode, defines, overfit_loader, overfit_loaders, stage_loader,
    train_combined, warn_spawned_workers,
)
from trainer.loops.evaluation import limited

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.loops.run import Run, StageData
    from trainer.trainer import Trainer


class FitLoaders:
    """The loaders passed to fit, a DataModule's or the model's hooks', loaded when Lightning
    loads them: the training loader as fit starts (``load_train``), the validation loaders when
    the first validation (or the sanity check) needs them (``load_val``). Each load records in
    the run what Lightning code reads of them (``train_dataloader``, ``num_training_batches``,
    ``val_dataloaders``, ``num_val_batches``)."""

    def __init__(self, trainer: Trainer, run: Run, model: TrainModule, data: StageData) -> None:
        self.trainer, self.run, self.model, self.data = trainer, run, model, data
        # Whether fit validates: a validation_step and somewhere to get its data (Lightning's enable_validation)
        steps = callable(getattr(model, "validation_step", None))
        source = data.val_loader is not None or defines(data.datamodule or model, LOADER_METHOD["validate"])
        if trainer.is_global_zero and source != steps:  # Lightning's two warnings
            warnings.warn(
                "You passed in a `val_dataloader` but have no `validation_step`. Skipping val loop. (Define "
                f"{type(model).__name__}.validation_step(self, batch, batch_idx) to validate, or leave the "
                "validation loader out.)" if source else "You defined a `validation_step` but have no "
                "`val_dataloader`. Skipping val loop.", UserWarning, stacklevel=5,
            )
        self.validates = run.enable_validation = steps and source and trainer.limit_val_batches != 0
        self._train: Any = None
        self._train_loaded_at: int | None = None
        self._val: Loaders | None = None
        self._val_loaded_at: float | None = None  # None: not loaded yet; -inf: loaded by a sanity check off schedule

    def train_now(self) -> Any:
        """The training loader for the current epoch: loaded the first time (as the loop starts,
        or when ``trainer.estimated_stepping_batches`` is read before), and again every
        ``reload_dataloaders_every_n_epochs`` epochs (loaders passed to fit are the same objects)."""
        self.run.load_train = None
        every, epoch = self.trainer.reload_dataloaders_every_n_epochs, self.trainer.current_epoch
        if self._train_loaded_at is None or every and epoch - self._train_loaded_at >= every:
            self._train, self._train_loaded_at = self.load_train(), epoch
        return self._train

    def load_train(self) -> Any:
        """The training loader; several (or a CombinedLoader) as one CombinedLoader, each of its
        loaders overfit, seeded and prepared by the strategy as one loader is (Lightning's)."""
        trainer, run, strategy, data = self.trainer, self.run, self.trainer.strategy, self.data
        # The model's or DataModule's loader is checked where it is made; sequential is refused below, counted.
        train = stage_loader("train", data.loader, self.model, data.datamodule, checked=True)
        combined = train_combined(train)
        loaders = [train] if combined is None else combined.flattened
        if trainer.overfit_batches:
            loaders = overfit_loaders(loaders, "train", trainer.overfit_batches)
        for loader in loaders:
            seeded_workers(loader, strategy.global_rank)  # seed_everything(workers=True)
        loaders = [strategy.process_dataloader(loader, "train") for loader in loaders]
        if trainer.is_global_zero:
            warn_spawned_workers(loaders, "train_dataloader")
        lengths = [loader_length(loader) for loader in loaders]
        if 0 in lengths:
            raise ValueError(
                "train_dataloaders has no batches (len 0). Check the dataset size, batch_size and drop_last."
            )
        limits = [limited(n, trainer.limit_train_batches, "train") for n in lengths]
        if combined is None:
            train, run.num_training_batches = loaders[0], limits[0]
        else:  # each loader's limit counts, in the mode's way (max_size_cycle: the longest)
            combined.flattened, combined.limits = loaders, limits
            train, run.num_training_batches = combined, limited(loader_length(combined), None)
        if combined is not None:
            check_train_mode(combined)
        if self.validates:
            check_val_interval(trainer)
        run.train_dataloader = train if combined is None else combined.iterables  # Lightning's: the collection
        check_same_length(strategy.gather_objects(run.num_training_batches))
        return train

    def val_now(self, epoch_validates: bool) -> Loaders | None:
        """The validation loaders for a validation now: loaded by the first validation (or the
        sanity check), and again by the first one ``reload_dataloaders_every_n_epochs`` epochs
        after the last load. A sanity check's load counts only when its epoch validates
        (``epoch_validates``), as in Lightning."""
        trainer, every, epoch = self.trainer, self.trainer.reload_dataloaders_every_n_epochs, self.trainer.current_epoch
        if not self.validates:
            return None
        if self._val_loaded_at is None or every and epoch - self._val_loaded_at >= every:
            self._val = self.load_val()
            self._val_loaded_at = epoch if epoch_validates or not trainer.sanity_checking else -math.inf
        return self._val

    def load_val(self) -> Loaders | None:
        """The validation loaders (None if the source gives none)."""
        trainer, run, strategy, data = self.trainer, self.run, self.trainer.strategy, self.data
        found = stage_loader("validate", data.val_loader, self.model, data.datamodule)
        val = None if found is None or found == [] else Loaders(found)
        if val is not None:
            if trainer.overfit_batches:
                val = val.map(lambda x: overfit_loader(x, "val", trainer.overfit_batches))
            for loader in val.each():
                seeded_workers(loader, strategy.global_rank)
            val = val.map(lambda x: strategy.process_dataloader(x, "validate"))
            if trainer.is_global_zero:
                warn_spawned_workers(val.each(), "val_dataloader")
        run.val_dataloaders = None if val is None else val.as_given()  # callbacks read it
        counts = [] if val is None else val.counts(lambda n: limited(n, trainer.limit_val_batches, "val"))[1]
        run.num_val_batches = counts
        return val


def no_batches(loader: Any, epoch: int, endless: bool) -> None:
    """A training loader that yielded nothing in ``epoch``: Lightning skips the epoch, and so do
    we, with a warning; an error when fit has no epoch limit (``endless``), which would never end."""
    once = isinstance(loader, collections.abc.Iterator) and epoch > 0
    message = f"train_dataloaders yielded no batches in epoch {epoch}. " + (
        "It is an iterator (e.g. a generator), which runs out after one pass: pass a DataLoader "
        "or another object that can be iterated again." if once else "Check the dataset and sampler.")
    if endless:
        raise ValueError(f"{message} With no max_epochs, fit would never end.")
    warnings.warn(f"{message} The epoch is skipped (Lightning's).", UserWarning, stacklevel=4)


def val_check_batch(trainer: Trainer, validates: bool) -> int:
    """Lightning's ``val_check_batch`` for fit's current epoch: validate after every n-th training
    batch (0: none in this epoch's batches; an unsized loader's epoch validates at its end)."""
    every, interval, batches = trainer.check_val_every_n_epoch, trainer.val_check_interval, trainer.num_training_batches
    if not validates or (every is not None and (trainer.state.current_epoch + 1) % every != 0):
        return 0
    if every is None and interval is None:  # no schedule at all (Lightning refuses this pair)
        return 0
    if isinstance(interval, int):
        return interval
    return 0 if batches == math.inf else max(1, int(batches * (1.0 if interval is None else interval)))


def check_val_interval(trainer: Trainer) -> None:
    """``val_check_interval`` against the epoch's length, once fit knows it (Lightning's checks)."""
    interval, batches = trainer.val_check_interval, trainer.num_training_batches
    if trainer.limit_val_batches == 0:
        return
    if isinstance(interval, float) and interval != 1.0 and batches == math.inf:
        raise ValueError(
            f"val_check_interval={interval!r} is a fraction of an epoch, and the training loader has no length "
            "(an IterableDataset or a stream), so the fraction is unknown. Pass a number of batches instead, "
            "e.g. val_check_interval=1000, with check_val_every_n_epoch=None for a stream that never ends."
        )
    if isinstance(interval, int) and interval > batches and trainer.check_val_every_n_epoch is not None:
        raise ValueError(
            f"`val_check_interval` ({interval}) must be less than or equal to the number of the training batches "
            f"({batches}). val_check_interval={interval!r} is more batches than an epoch has "
            f"({batches} training batches"
            + (f", with limit_train_batches={trainer.limit_train_batches!r}"
               if trainer.limit_train_batches is not None else "")
            + "), so validation would never run within an epoch. Pass at most "
            f"{batches}, a fraction such as 0.5, or check_val_every_n_epoch=None to validate every "
            f"{interval} batches of a run whose epochs never end."
        )
