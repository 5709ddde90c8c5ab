"""``LearningRateFinder`` and ``BatchSizeFinder``: the Tuner's searches as callbacks.

Given to ``Trainer(callbacks=[...])``, each runs its search when ``fit`` is called, before the
fit builds its loaders and optimizer, so the fit trains with the value found. The search
itself is ``trainer.tuner`` (it leaves the weights, RNG and counters as they were).
"""

from __future__ import annotations

from typing import Any

from trainer.core.exceptions import MisconfigurationException

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

    def tune_before_stage(self, tuner: Any, stage: str, model: Any, loaders: Any, val: Any, datamodule: Any) -> None:
        """The Trainer's call (see ``Callback``): this search, before ``stage`` builds its loaders."""
        if stage == "fit":
            self.lr_find(tuner, model, loaders, val, datamodule)


class BatchSizeFinder(Callback):
    """Runs ``Tuner.scale_batch_size`` at the start of each ``fit``, ``validate``, ``test`` and
    ``predict`` (with that method), as Lightning's; ``optimal_batch_size`` is the size found
    (also set on the model's or DataModule's ``batch_arg_name``)."""

    def __init__(
        self, mode: str = "power", steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
        batch_arg_name: str = "batch_size", margin: float = 0.05, max_val: int = 8192,
    ) -> None:
        mode = mode.lower() if isinstance(mode, str) else mode
        if mode not in ("power", "binsearch"):
            raise ValueError(f"`mode` should be either of ('power', 'binsearch'); BatchSizeFinder(mode={mode!r}).")
        self._options = dict(
            mode=mode, steps_per_trial=steps_per_trial, init_val=init_val, max_trials=max_trials,
            batch_arg_name=batch_arg_name, margin=margin, max_val=max_val,
        )
        self.optimal_batch_size: int | None = init_val

    def scale_batch_size(self, tuner: Any, model: Any, train: Any = None, val: Any = None, datamodule: Any = None,
                         method: str = "fit", dataloaders: Any = None) -> int | None:
        self.optimal_batch_size = tuner.scale_batch_size(
            model, train, val, dataloaders, datamodule=datamodule, method=method, **self._options
        )
        return self.optimal_batch_size

    def setup(self, trainer: Any, pl_module: Any, stage: str | None = None) -> None:
        if trainer.world_size > 1 or (getattr(trainer.strategy, "num_processes", None) or 1) > 1:
            raise MisconfigurationException(
                "The Batch size finder is not supported with distributed strategies: search with one device "
                "(Tuner(Trainer(devices=1)).scale_batch_size(model)), then train with several."
            )

    def tune_before_stage(self, tuner: Any, stage: str, model: Any, loaders: Any, val: Any, datamodule: Any) -> None:
        """The Trainer's call (see ``Callback``): this search, before ``stage`` builds its loaders."""
        if stage == "fit":
            self.scale_batch_size(tuner, model, loaders, val, datamodule)
        else:
            self.scale_batch_size(tuner, model, datamodule=datamodule, method=stage, dataloaders=loaders)
