"""``LearningRateFinder`` and ``BatchSizeFinder``: the Tuner's searches as callbacks.

Given to ``Trainer(callbacks=[...])``, each runs its search when ``fit`` is called, before the
fit builds its loaders and optimizer, so the fit trains with the value found. The search
itself is ``trainer.tuner`` (it leaves the weights, RNG and counters as they were).
"""

from __future__ import annotations

from typing import Any

from .base import Callback


class LearningRateFinder(Callback):
    """Runs ``Tuner.lr_find`` at the start of each ``fit``; ``optimal_lr`` is the result (an
    ``LRFinder``: ``optimal_lr.suggestion()``, ``optimal_lr.results``)."""

    def __init__(
        self, min_lr: float = 1e-8, max_lr: float = 1.0, num_training_steps: int = 100, mode: str = "exponential",
        early_stop_threshold: float | None = 4.0, update_attr: bool = True, attr_name: str = "",
    ) -> None:
        if mode not in ("exponential", "linear"):
            raise ValueError(f"LearningRateFinder(mode={mode!r}): use 'exponential' or 'linear'.")
        self._options = dict(
            min_lr=min_lr, max_lr=max_lr, num_training=num_training_steps, mode=mode,
            early_stop_threshold=early_stop_threshold, update_attr=update_attr, attr_name=attr_name,
        )
        self.optimal_lr: Any = None

    def lr_find(self, tuner: Any, model: Any, train: Any = None, val: Any = None, datamodule: Any = None) -> Any:
        self.optimal_lr = tuner.lr_find(model, train, val, datamodule=datamodule, **self._options)
        return self.optimal_lr

    _search_before_fit = lr_find


class BatchSizeFinder(Callback):
    """Runs ``Tuner.scale_batch_size`` at the start of each ``fit``; ``optimal_batch_size`` is
    the size found (also set on the model's or DataModule's ``batch_arg_name``)."""

    def __init__(
        self, mode: str = "power", steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
        batch_arg_name: str = "batch_size",
    ) -> None:
        if mode not in ("power", "binsearch"):
            raise ValueError(f"BatchSizeFinder(mode={mode!r}): use 'power' or 'binsearch'.")
        self._options = dict(
            mode=mode, steps_per_trial=steps_per_trial, init_val=init_val, max_trials=max_trials,
            batch_arg_name=batch_arg_name,
        )
        self.optimal_batch_size: int | None = None

    def scale_batch_size(self, tuner: Any, model: Any, train: Any = None, val: Any = None, datamodule: Any = None) -> int | None:
        self.optimal_batch_size = tuner.scale_batch_size(model, train, val, datamodule=datamodule, **self._options)
        return self.optimal_batch_size

    _search_before_fit = scale_batch_size
