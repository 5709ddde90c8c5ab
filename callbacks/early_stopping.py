"""EarlyStopping: end fit when a monitored metric stops improving."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from trainer.core.checks import flag, one_of, positive_int, suggest

from ._schedule import fit_validates
from .base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

log = logging.getLogger("trainer")


class EarlyStopping(Callback):
    """Stop fit once ``monitor`` has not improved for ``patience`` checks in a row.

    A check happens after each validation during fit or, when fit never validates (no
    validation loader, ``limit_val_batches=0``, or no validation schedule), at the
    end of each training epoch (monitor a training value then, e.g. ``"train_loss"``, whose
    epoch mean is used). Improving means beating the best value so far by more than
    ``min_delta`` (down for ``mode="min"``, up for ``mode="max"``). With ``check_finite``, a
    NaN or infinite value stops at once.

    The values come from ``trainer.callback_metrics``, which are already reduced across
    processes, so under DDP every rank takes the same decision and all stop at the same step.
    The wait count and best score ride in checkpoints, so a resumed run keeps its patience.

    Example: ``EarlyStopping("val_loss", patience=5)``.
    """

    def __init__(
        self,
        monitor: str,
        mode: str = "min",
        patience: int = 3,
        min_delta: float = 0.0,
        check_finite: bool = True,
    ) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise TypeError(f"EarlyStopping(monitor={monitor!r}) must be the name of a logged metric, e.g. 'val_loss'.")
        if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)) or not min_delta >= 0:
            raise ValueError(f"EarlyStopping(min_delta={min_delta!r}) must be a number >= 0 (the margin an improvement must beat).")
        self.monitor = monitor
        self.mode = one_of("EarlyStopping(mode)", mode, ("min", "max"))
        self.patience = positive_int("EarlyStopping(patience)", patience, minimum=0)
        self.min_delta = float(min_delta)
        self.check_finite = flag("EarlyStopping(check_finite)", check_finite)
        self._reset()

    def _reset(self) -> None:
        self.wait_count = 0
        self.best_score = math.inf if self.mode == "min" else -math.inf
        self.stopped_epoch: int | None = None  # the epoch in which fit was told to stop

    @property
    def state_key(self) -> str:
        return f"EarlyStopping[monitor={self.monitor},mode={self.mode}]"

    # --- hooks -------------------------------------------------------------------------
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if stage == "fit":
            self._reset()  # a checkpoint being resumed loads its state after this

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.state.stage == "fit":
            self._check(trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if not fit_validates(trainer):  # e.g. a validation loader with no schedule: it never runs
            self._check(trainer)

    # --- the decision ------------------------------------------------------------------
    def _check(self, trainer: Trainer) -> None:
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            raise ValueError(
                f"EarlyStopping(monitor={self.monitor!r}) found no metric of that name. Logged metrics: "
                f"{sorted(metrics) or 'none'}.{suggest(self.monitor, metrics)} Log it with "
                f"self.log({self.monitor!r}, value) in validation_step (or in training_step when fit has no "
                "validation), or fix the name."
            )
        current = float(metrics[self.monitor])
        reason = self._judge(current)
        if reason is not None:
            trainer.should_stop = True
            trainer.state.stop_reason = "early_stopping"
            self.stopped_epoch = trainer.current_epoch
            if trainer.is_global_zero:
                log.info("EarlyStopping: %s Stopping at epoch %d, step %d.", reason, trainer.current_epoch, trainer.global_step)

    def _judge(self, current: float) -> str | None:
        """Update the best score and wait count; returns why to stop, or None."""
        if self.check_finite and not math.isfinite(current):
            return f"{self.monitor} = {current} is not finite."
        if self._improves(current):
            self.best_score, self.wait_count = current, 0
            return None
        self.wait_count += 1
        if self.wait_count >= self.patience:
            return (
                f"{self.monitor} did not improve by more than {self.min_delta} for {self.wait_count} "
                f"check(s); best {self.best_score:.6g}."
            )
        return None

    def _improves(self, current: float) -> bool:
        if self.mode == "min":
            return current < self.best_score - self.min_delta
        return current > self.best_score + self.min_delta

    # --- state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"wait_count": self.wait_count, "best_score": self.best_score, "stopped_epoch": self.stopped_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.wait_count = int(state_dict.get("wait_count", 0))
        self.best_score = float(state_dict.get("best_score", self.best_score))
        self.stopped_epoch = state_dict.get("stopped_epoch")
