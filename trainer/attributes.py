"""What Lightning code reads on the Trainer: ranks, stages, counters, callbacks and the run's objects.

A mixin of read-only properties over the Trainer's state, so that ``trainer.py`` keeps to the
options and the entry points. Each reads what is already there: nothing here runs per step.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import TYPE_CHECKING, Any

from callbacks import EarlyStopping, GradientAccumulationScheduler, ModelCheckpoint, ProgressBar
from strategies import Strategy

if TYPE_CHECKING:
    from trainer.core.module import TrainModule


class TrainerAttributes:
    """Lightning's Trainer properties. The Trainer sets ``state``, ``_strategy``, ``callbacks``,
    ``_module``, ``_opt``, ``_phase``, ``num_training_batches``, ``_ckpt_path`` and the options these read."""

    _ckpt_path: str | None
    _ckpt_user_managed: bool

    # --- where this process stands ------------------------------------------------------
    @property
    def strategy(self) -> Strategy:
        return self._strategy

    @property
    def is_global_zero(self) -> bool:
        return self._strategy.is_global_zero

    @property
    def global_rank(self) -> int:
        return self._strategy.global_rank

    @property
    def local_rank(self) -> int:
        return self._strategy.local_rank

    @property
    def node_rank(self) -> int:
        """The machine's index: torchrun's GROUP_RANK, Lightning's NODE_RANK or SLURM's SLURM_NODEID; 0 on one machine."""
        for name in ("GROUP_RANK", "NODE_RANK", "SLURM_NODEID"):
            if os.environ.get(name, "").isdigit():
                return int(os.environ[name])
        return 0

    @property
    def world_size(self) -> int:
        return self._strategy.world_size

    @property
    def num_devices(self) -> int:
        """Devices per machine: DDP's processes on this node, DataParallel's GPUs, else 1."""
        processes = getattr(self._strategy, "num_processes", None)
        if processes is None:
            return self._strategy.num_devices
        return max(1, processes // self.num_nodes)

    @property
    def device_ids(self) -> list[int]:
        ids = getattr(self._strategy, "device_ids", None)
        return list(ids) if ids else [self._strategy.root_device.index or 0]

    # --- the stage ----------------------------------------------------------------------
    @property
    def training(self) -> bool:
        """True while fit trains (not during its validation runs or sanity check)."""
        return self.state.stage == "fit" and self._phase == "train" and not self.sanity_checking

    @property
    def validating(self) -> bool:
        """True during a validation run: fit's, or ``trainer.validate``'s (not the sanity check)."""
        return self._phase == "validation" and not self.sanity_checking

    @property
    def testing(self) -> bool:
        return self._phase == "test"

    @property
    def predicting(self) -> bool:
        return self._phase == "predict"

    @property
    def evaluating(self) -> bool:
        return self._phase in ("validation", "test")

    @property
    def global_step(self) -> int:
        return self.state.global_step

    @property
    def current_epoch(self) -> int:
        return self.state.current_epoch

    @property
    def should_stop(self) -> bool:
        return self.state.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        """Set it to end fit at the next step boundary (agreed across ranks), once min_epochs and min_steps are met."""
        self.state.should_stop = bool(value)

    @property
    def interrupted(self) -> bool:
        return self.state.stop_reason == "signal"

    @property
    def estimated_stepping_batches(self) -> int | float:
        """The optimizer steps ``fit`` makes in all (from step 0, a resumed run included):
        ``max_steps``, or ``max_epochs`` epochs of this process's batches (its shard under DDP,
        after ``limit_train_batches``) in groups of ``accumulate_grad_batches``, the epoch's
        last short group counting as a step (a GradientAccumulationScheduler's groups per epoch);
        whichever is fewer. ``math.inf`` for an unsized
        loader without ``max_steps``. Known from ``configure_optimizers`` on."""
        if self.state.stage != "fit" and self._opt is None:
            raise RuntimeError(
                "trainer.estimated_stepping_batches is known once fit has its loaders: read it in "
                "configure_optimizers (e.g. for OneCycleLR's total_steps) or later during fit."
            )
        batches, epochs = self.num_training_batches, range(self.max_epochs or 0)
        scheduler = next((cb for cb in self.callbacks if isinstance(cb, GradientAccumulationScheduler)), None)
        groups = [self.accumulate_grad_batches if scheduler is None else scheduler.get_accumulate_grad_batches(e) for e in epochs]
        by_epochs = math.inf if self.max_epochs is None or batches == math.inf else sum(math.ceil(batches / g) for g in groups)
        return min(math.inf if self.max_steps is None else self.max_steps, by_epochs)

    # --- the run's objects --------------------------------------------------------------
    @property
    def module(self) -> TrainModule | None:
        return self._module

    @property
    def lightning_module(self) -> TrainModule | None:
        """The module being run (Lightning's name)."""
        return self._module

    @property
    def model(self) -> Any:
        """The module as the strategy wraps it while a stage runs (DistributedDataParallel under ddp), else the module."""
        wrapped = getattr(self._strategy, "_ddp", None)
        return wrapped if wrapped is not None else self._module

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        """One config per scheduler (``.scheduler``, ``.interval``, ``.monitor``), as configure_optimizers gave them."""
        return [] if self._opt is None else list(self._opt.schedulers)

    @property
    def ckpt_path(self) -> str | None:
        """The checkpoint the last ``fit`` resumed from, or ``validate``/``test``/``predict``
        evaluated ("last" and "best" resolved to the file); None if none. Set it to have the next
        calls load that file without passing ``ckpt_path=`` (Lightning's stateful use; set it
        back to None when done): a ``ckpt_path`` passed to a call wins, with a warning."""
        return self._ckpt_path

    @ckpt_path.setter
    def ckpt_path(self, path: str | os.PathLike | None) -> None:
        self._ckpt_path = None if path is None else os.fspath(path)
        self._ckpt_user_managed = bool(path)

    def _select_ckpt_path(self, given: Any) -> Any:
        """The ``ckpt_path`` a call uses: the one given, else the one set on ``trainer.ckpt_path``."""
        if not self._ckpt_user_managed:
            return given
        if given is None:
            return self._ckpt_path
        warnings.warn(
            f"`trainer.ckpt_path = {self._ckpt_path!r}` was called but then you passed `ckpt_path={given!r}`. "
            "The latter will be loaded.", stacklevel=3,
        )
        self._ckpt_path, self._ckpt_user_managed = None, False
        return given

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        return next(iter(self.checkpoint_callbacks), None)

    @property
    def checkpoint_callbacks(self) -> list[ModelCheckpoint]:
        return [cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint)]

    @property
    def early_stopping_callback(self) -> EarlyStopping | None:
        return next(iter(self.early_stopping_callbacks), None)

    @property
    def early_stopping_callbacks(self) -> list[EarlyStopping]:
        return [cb for cb in self.callbacks if isinstance(cb, EarlyStopping)]

    @property
    def progress_bar_callback(self) -> ProgressBar | None:
        return next((cb for cb in self.callbacks if isinstance(cb, ProgressBar)), None)

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """The values logged with ``prog_bar=True``: the latest of each (a step's, or an epoch's mean)."""
        shown = {k: v for k, v in self.callback_metrics.items() if k in self.prog_bar_names}
        shown.update(self.step_metrics(prog_bar_only=True))
        return shown
