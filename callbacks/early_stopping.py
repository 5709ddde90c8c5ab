"""EarlyStopping: end fit when a monitored metric stops improving."""

from __future__ import annotations

import logging
import math
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch

from trainer.core.checks import flag, one_of, positive_int, suggest

from ._schedule import fit_validates
from .base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

log = logging.getLogger("trainer")


class EarlyStoppingReason(Enum):
    """Why EarlyStopping stopped fit (``early_stopping.stopping_reason``), Lightning's values."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class EarlyStopping(Callback):
    """Stop fit once ``monitor`` has not improved for ``patience`` checks in a row.

    A check happens after each validation during fit or, when fit never validates (no
    validation loader, ``limit_val_batches=0``, or no validation schedule), at the
    end of each training epoch (monitor a training value then, e.g. ``"train_loss"``, whose
    epoch mean is used). ``check_on_train_epoch_end=True`` always checks at the training
    epoch's end, ``False`` only after validations. Improving means beating the best value so
    far by more than ``min_delta`` (down for ``mode="min"``, up for ``mode="max"``).

    Fit also stops at once, in this order of precedence: with ``check_finite`` on a NaN or
    infinite value; when the value reaches ``stopping_threshold`` (below it in ``min`` mode,
    above in ``max``: good enough); when it crosses ``divergence_threshold`` (above in
    ``min`` mode: hopeless). The reason goes to the log and to ``stopping_reason_message``
    (``trainer.early_stopping_callback.stopping_reason_message``). ``verbose`` also logs
    each improvement. ``strict=False`` skips a check whose monitor was not logged, instead
    of the error that lists the logged names.

    The values come from ``trainer.callback_metrics``, which are already reduced across
    processes, so under DDP every rank takes the same decision and all stop at the same step.
    Messages come from global rank 0 (``log_rank_zero_only=False``: from each rank, prefixed
    with it). The wait count and best score ride in checkpoints, so a resumed run keeps its patience.

    Example: ``EarlyStopping("val_loss", patience=5, stopping_threshold=0.05)``.
    """

    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 3,
        verbose: bool = False,
        mode: str = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_on_train_epoch_end: bool | None = None,
        log_rank_zero_only: bool = False,
    ) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise TypeError(f"EarlyStopping(monitor={monitor!r}) must be the name of a logged metric, e.g. 'val_loss'.")
        if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)) or not min_delta >= 0:
            raise ValueError(f"EarlyStopping(min_delta={min_delta!r}) must be a number >= 0 "
                             "(the margin an improvement must beat).")
        self.monitor = monitor
        self.mode = one_of("EarlyStopping(mode)", mode, ("min", "max"), lightning=f"`mode` can be min, max, got {mode}")
        self.patience = positive_int("EarlyStopping(patience)", patience, minimum=0)
        self.min_delta = float(min_delta)
        self.verbose = flag("EarlyStopping(verbose)", verbose)
        self.strict = flag("EarlyStopping(strict)", strict)
        self.check_finite = flag("EarlyStopping(check_finite)", check_finite)
        self.stopping_threshold = _threshold("stopping_threshold", stopping_threshold)
        self.divergence_threshold = _threshold("divergence_threshold", divergence_threshold)
        if check_on_train_epoch_end is not None:
            flag("EarlyStopping(check_on_train_epoch_end)", check_on_train_epoch_end)
        self.check_on_train_epoch_end = check_on_train_epoch_end
        self.log_rank_zero_only = flag("EarlyStopping(log_rank_zero_only)", log_rank_zero_only)
        self._reset()

    def _reset(self) -> None:
        self.wait_count = 0
        self.best_score = math.inf if self.mode == "min" else -math.inf
        self.stopped_epoch = 0  # the epoch in which fit was told to stop (Lightning's 0: not stopped)
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, mode=self.mode)  # Lightning's key

    @property
    def legacy_state_key(self) -> str:  # the key of our files before Lightning's layout
        return f"EarlyStopping[monitor={self.monitor},mode={self.mode}]"

    # --- hooks -------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if stage == "fit":
            self._reset()  # a checkpoint being resumed loads its state after this

    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking and not self._at_epoch_end(trainer):
            self._check(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._at_epoch_end(trainer):
            self._check(trainer)

    def _at_epoch_end(self, trainer: Trainer) -> bool:
        if self.check_on_train_epoch_end is not None:
            return self.check_on_train_epoch_end
        return not fit_validates(trainer)  # e.g. a validation loader with no schedule: it never runs

    # --- the decision ------------------------------------------------------------------
    def _check(self, trainer: Trainer) -> None:
        if trainer.fast_dev_run:  # Lightning's: a development run judges nothing (its metric may not exist yet)
            return
        metrics = trainer.callback_metrics.numbers()
        if self.monitor not in metrics:
            if not self.strict:
                return
            raise ValueError(
                f"EarlyStopping(monitor={self.monitor!r}) found no metric of that name. Logged metrics: "
                f"{sorted(metrics) or 'none'}.{suggest(self.monitor, metrics)} Log it with "
                f"self.log({self.monitor!r}, value) in validation_step (or in training_step when fit has no "
                "validation), fix the name, or pass strict=False to skip checks without it."
            )
        current = float(metrics[self.monitor])
        before = self.best_score
        reason, why = self._judge(current)
        if self.verbose and self.best_score != before:
            self._say(trainer, f"Metric {self.monitor} improved" + (
                f" by {abs(before - current):.6g} >= min_delta = {self.min_delta}" if math.isfinite(before) else ""
            ) + f". New best score: {current:.6g}")
        if reason is not None:
            trainer.should_stop = True
            trainer.state.stop_reason = "early_stopping"
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason, self.stopping_reason_message = why, reason
            self._say(trainer, f"{reason} Stopping at epoch {trainer.current_epoch}, step {trainer.global_step}.")

    def _say(self, trainer: Trainer, message: str) -> None:
        if trainer.world_size > 1 and not self.log_rank_zero_only:
            log.info("[rank: %d] EarlyStopping: %s", trainer.strategy.global_rank, message)
        elif trainer.is_global_zero:
            log.info("EarlyStopping: %s", message)

    def _judge(self, current: float) -> tuple[str | None, EarlyStoppingReason]:
        """Update the best score and wait count; returns why to stop (None to go on), and the reason's kind."""
        better = "<" if self.mode == "min" else ">"
        if self.check_finite and not math.isfinite(current):
            return (f"Monitored metric {self.monitor} = {current} is not finite. Previous best value was "
                    f"{self.best_score:.6g}.", EarlyStoppingReason.NON_FINITE_METRIC)
        if self.stopping_threshold is not None and self._beats(current, self.stopping_threshold):
            return (f"Stopping threshold reached: {self.monitor} = {current:.6g} {better} {self.stopping_threshold}.",
                    EarlyStoppingReason.STOPPING_THRESHOLD)
        if self.divergence_threshold is not None and self._beats(self.divergence_threshold, current):
            worse = ">" if self.mode == "min" else "<"
            threshold = self.divergence_threshold
            return (f"Divergence threshold reached: {self.monitor} = {current:.6g} {worse} {threshold}.",
                    EarlyStoppingReason.DIVERGENCE_THRESHOLD)
        if self._improves(current):
            self.best_score, self.wait_count = current, 0
            return None, EarlyStoppingReason.NOT_STOPPED
        self.wait_count += 1
        if self.wait_count >= self.patience:
            return (
                f"Monitored metric {self.monitor} did not improve by more than {self.min_delta} in the last "
                f"{self.wait_count} check(s). Best score: {self.best_score:.6g}.",
                EarlyStoppingReason.PATIENCE_EXHAUSTED,
            )
        return None, EarlyStoppingReason.NOT_STOPPED

    def _beats(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b

    def _improves(self, current: float) -> bool:
        if self.mode == "min":
            return current < self.best_score - self.min_delta
        return current > self.best_score + self.min_delta

    # --- state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        # Lightning's shape, which its EarlyStopping loads: a tensor score, epoch 0 for "not stopped".
        return {
            "wait_count": self.wait_count, "stopped_epoch": self.stopped_epoch,
            "best_score": torch.tensor(self.best_score, dtype=torch.float64), "patience": self.patience,
            "stopping_reason": self.stopping_reason.value, "stopping_reason_message": self.stopping_reason_message,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.wait_count = int(state_dict.get("wait_count", 0))
        self.best_score = float(state_dict.get("best_score", self.best_score))
        self.stopped_epoch = int(state_dict.get("stopped_epoch") or 0)
        reason = state_dict.get("stopping_reason", EarlyStoppingReason.NOT_STOPPED.value)
        self.stopping_reason = EarlyStoppingReason(reason)
        self.stopping_reason_message = state_dict.get("stopping_reason_message")



def _threshold(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(f"EarlyStopping({name}={value!r}) must be a number (the monitored value's bound), or None.")
    return float(value)
