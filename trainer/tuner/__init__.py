"""The Tuner: find a learning rate (``lr_find``) and the largest batch size that fits
(``scale_batch_size``) before training, as Lightning's ``lightning.pytorch.tuner.Tuner`` does.

A search leaves no trace: it runs on a throwaway copy of the Trainer (no progress bar, logger,
checkpoint or validation), and puts back the model's weights, every RNG and the loaders'
generators. The Trainer's counters, optimizers and callbacks are never touched. A ``fit`` that
follows is the run you would get by setting the value found by hand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.tuner.batch_size import scale_batch_size
from trainer.tuner.lr_finder import LRFinder, lr_find

if TYPE_CHECKING:
    from trainer.trainer import Trainer

__all__ = ["LRFinder", "Tuner", "tune_before"]


class Tuner:
    """``Tuner(trainer)``; its searches use the Trainer's strategy, precision and accumulation."""

    def __init__(self, trainer: Trainer) -> None:
        if not hasattr(trainer, "fit") or not hasattr(trainer, "strategy"):
            raise TypeError(f"Tuner(trainer={trainer!r:.80}) needs a trainer.Trainer.")
        self._trainer = trainer
        self._for_callbacks = False  # the Tuner that tune_before hands the finder callbacks

    def lr_find(
        self, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None, dataloaders: Any = None,
        datamodule: Any = None, method: str = "fit", min_lr: float = 1e-8, max_lr: float = 1.0,
        num_training: int = 100, mode: str = "exponential", early_stop_threshold: float | None = 4.0,
        update_attr: bool = True, attr_name: str = "",
    ) -> LRFinder | None:
        """Train ``num_training`` steps with the learning rate rising from ``min_lr`` to
        ``max_lr`` (``"exponential"`` or ``"linear"``), stopping early once the smoothed loss
        exceeds ``early_stop_threshold`` x its best (None: never). Returns an :class:`LRFinder`
        (``results``, ``suggestion()``, ``plot()``). With ``update_attr``, the suggestion is set
        on ``attr_name``, else ``lr`` or ``learning_rate``: on the model, its ``hparams`` or the
        DataModule, wherever it is."""
        if method != "fit":
            raise ValueError(
                f"lr_find(method={method!r}): the learning rate is searched by training; only method='fit'."
            )
        if dataloaders is not None:
            raise ValueError("lr_find trains: pass train_dataloaders= (and val_dataloaders=), not dataloaders=.")
        if not self._for_callbacks and any(type(cb).__name__ == "LearningRateFinder" for cb in self._trainer.callbacks):
            raise ValueError(
                "Trainer is already configured with a `LearningRateFinder` callback."
                "Please remove it if you want to use the Tuner. "
                "(The callback runs its own search when fit starts: keep one of the two.)"
            )
        return lr_find(
            self._trainer, model, train_dataloaders, val_dataloaders, datamodule, min_lr, max_lr, num_training, mode,
            early_stop_threshold, update_attr, attr_name,
        )

    def scale_batch_size(
        self, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None, dataloaders: Any = None,
        datamodule: Any = None, method: str = "fit", mode: str = "power", steps_per_trial: int = 3,
        init_val: int = 2, max_trials: int = 25, batch_arg_name: str = "batch_size", margin: float = 0.05,
        max_val: int = 8192,
    ) -> int | None:
        """Run ``steps_per_trial`` steps of ``method`` at growing batch sizes, from ``init_val``:
        doubling until one runs out of memory (``"power"``), then bisecting (``"binsearch"``,
        whose result loses ``margin``), never beyond the dataset's length or ``max_val``, at most
        ``max_trials`` trials, as Lightning's. Sets the size found on ``batch_arg_name`` (model,
        its ``hparams`` or the DataModule), leaves the Trainer's loaders built with it, and
        returns it."""
        if not self._for_callbacks and any(type(cb).__name__ == "BatchSizeFinder" for cb in self._trainer.callbacks):
            raise ValueError(
                "Trainer is already configured with a `BatchSizeFinder` callback."
                "Please remove it if you want to use the Tuner. "
                "(The callback runs its own search when fit starts: keep one of the two.)"
            )
        return scale_batch_size(
            self._trainer, model, train_dataloaders, val_dataloaders, dataloaders, datamodule, method, mode,
            steps_per_trial, init_val, max_trials, batch_arg_name, margin, max_val,
        )


def tune_before(trainer: Trainer, stage: str, model: Any, loaders: Any, val_dataloaders: Any, datamodule: Any) -> None:
    """``callbacks.BatchSizeFinder`` and ``callbacks.LearningRateFinder`` in ``trainer.callbacks``:
    their searches, in the callbacks' order, before ``stage`` ("fit", "validate", "test" or
    "predict"; the learning rate only for fit) starts, so that it builds its loaders and
    optimizer with the values found. ``loaders`` are fit's train_dataloaders or an evaluation's
    dataloaders."""
    tuner = Tuner(trainer)
    tuner._for_callbacks = True
    for cb in trainer.callbacks:
        if getattr(type(cb), "tune_before_stage", None) is not None:  # (a Mock(spec=Callback) has none)
            cb.tune_before_stage(tuner, stage, model, loaders, val_dataloaders, datamodule)
