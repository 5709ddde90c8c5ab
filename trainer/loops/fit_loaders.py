"""fit's training and validation loaders: where they come from, checked, seeded and prepared
by the strategy; again every ``reload_dataloaders_every_n_epochs`` epochs."""

from __future__ import annotations

import collections.abc
import warnings
from typing import TYPE_CHECKING, Any

from trainer.core.seed import seeded_workers
from trainer.data.batches import check_same_length, loader_length
from trainer.data.loaders import Loaders, check_train_loader, overfit_loaders, stage_loader
from trainer.loops.evaluation import check_val_interval, limited

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.loops.run import Run, StageData
    from trainer.trainer import Trainer


class FitLoaders:
    """The loaders passed to fit, a DataModule's or the model's hooks'. ``load()`` gives the
    pair the loop iterates, and records in the run what Lightning code reads of them
    (``train_dataloader``, ``num_training_batches``, ``val_dataloaders``, ``num_val_batches``)."""

    def __init__(self, trainer: Trainer, run: Run, model: TrainModule, data: StageData) -> None:
        self.trainer, self.run, self.model, self.data = trainer, run, model, data
        self._warned = False  # the missing validation_step is said once, not at each reload

    def load(self) -> tuple[Any, Loaders | None]:
        trainer, run, strategy = self.trainer, self.run, self.trainer.strategy
        train, val = self._from_sources()
        train = strategy.process_dataloader(train, "train")
        val = None if val is None else val.map(lambda x: strategy.process_dataloader(x, "validate"))
        n = loader_length(train)
        if n == 0:
            raise ValueError("train_dataloaders has no batches (len 0). Check the dataset size, batch_size and drop_last.")
        run.num_training_batches = limited(n, trainer.limit_train_batches, "train")
        if val is not None:
            check_val_interval(trainer)
        run.train_dataloader = train
        run.val_dataloaders = None if val is None else val.as_given()  # callbacks read it
        run.num_val_batches = [] if val is None else [limited(length, trainer.limit_val_batches, "val") for length in val.lengths()]
        check_same_length(strategy.gather_objects(run.num_training_batches))
        return train, val

    def _from_sources(self) -> tuple[Any, Loaders | None]:
        trainer, model, data = self.trainer, self.model, self.data
        train = stage_loader("train", data.loader, model, data.datamodule)
        if data.loader is None:  # the model's or DataModule's: checked here, where they were made
            check_train_loader(train)
        val = stage_loader("validate", data.val_loader, model, data.datamodule)
        steps = callable(getattr(model, "validation_step", None))
        if trainer.is_global_zero and not self._warned and (val is None) == steps:  # Lightning's two warnings
            warnings.warn(
                "You passed in a `val_dataloader` but have no `validation_step`. Skipping val loop. (Define "
                f"{type(model).__name__}.validation_step(self, batch, batch_idx) to validate, or leave the "
                "validation loader out.)" if steps is False else "You defined a `validation_step` but have no "
                "`val_dataloader`. Skipping val loop.", UserWarning, stacklevel=4,
            )
            self._warned = True
        if not steps:
            val = None
        val = None if val is None else Loaders(val)
        if trainer.overfit_batches:
            train, val = overfit_loaders(train, val, trainer.overfit_batches)
        for loader in [train, *(val or [])]:  # seed_everything(workers=True)
            seeded_workers(loader, trainer.strategy.global_rank)
        return train, val


def no_batches(loader: Any, epoch: int) -> ValueError:
    """The error for a training loader that yielded nothing in ``epoch``."""
    once = isinstance(loader, collections.abc.Iterator) and epoch > 0
    return ValueError(
        f"train_dataloaders yielded no batches in epoch {epoch}. "
        + ("It is an iterator (e.g. a generator), which runs out after one pass: pass a DataLoader "
           "or another object that can be iterated again." if once else "Check the dataset and sampler.")
    )
