"""When a fit validates: what monitoring callbacks need to know before they judge a metric."""

from __future__ import annotations

import datetime
import math
from typing import TYPE_CHECKING, Any

from trainer.core.checks import positive_int
from trainer.core.exceptions import misconfigured

if TYPE_CHECKING:
    from trainer import Trainer


def fit_validates(trainer: Trainer) -> bool:
    """Whether the running fit will ever run its validation loop.

    False without a validation loader, with ``limit_val_batches=0``, or with neither
    ``check_val_every_n_epoch`` nor a ``val_check_interval`` that can fire (a fraction of an
    epoch of unknown length never does). Then a monitored metric must come from training,
    and is due at each epoch's end; otherwise it is due once validation has run.
    """
    if not trainer.enable_validation:  # no validation_step or no data for it, or limit_val_batches=0
        return False
    if trainer.check_val_every_n_epoch is not None:
        return True
    interval = trainer.val_check_interval
    return isinstance(interval, int) or (interval is not None and trainer.num_training_batches != math.inf)


def triggers(
    every_n_train_steps: Any, train_time_interval: Any, every_n_epochs: Any
) -> tuple[int | None, datetime.timedelta | None, int | None]:
    """ModelCheckpoint's one trigger, checked (None: off; 0 is off too, as in Lightning). With
    none given, every epoch (``every_n_epochs=1``)."""
    steps = positive_int("ModelCheckpoint(every_n_train_steps)", every_n_train_steps, minimum=0, allow_none=True,
                         lightning=f"Invalid value for every_n_train_steps={every_n_train_steps}. Must be >= 0")
    epochs = positive_int("ModelCheckpoint(every_n_epochs)", every_n_epochs, minimum=0, allow_none=True,
                          lightning=f"Invalid value for every_n_epochs={every_n_epochs}. Must be >= 0")
    interval = train_time_interval
    if interval is not None and (not isinstance(interval, datetime.timedelta) or interval.total_seconds() < 0):
        raise TypeError(
            f"ModelCheckpoint(train_time_interval={interval!r}) must be a datetime.timedelta >= 0, "
            "e.g. timedelta(minutes=30), or None."
        )
    given = {"every_n_train_steps": steps, "train_time_interval": interval, "every_n_epochs": epochs}
    on = [f"{name}={value!r}" for name, value in given.items() if value not in (None, 0)]
    if len(on) > 1:
        raise misconfigured(
            f"ModelCheckpoint({', '.join(on)}) sets {len(on)} triggers; pass at most one of every_n_train_steps, "
            "train_time_interval and every_n_epochs (use one ModelCheckpoint per trigger to save on several).",
            f"Combination of parameters every_n_train_steps={steps}, every_n_epochs={epochs} and "
            f"train_time_interval={interval} should be mutually exclusive.",
        )
    if all(value is None for value in given.values()):
        epochs = 1  # Lightning's default: after each epoch's validation
    return steps or None, interval, epochs or None


def saves_at_epoch_end(trainer: Trainer, given: bool | None) -> bool:
    """``save_on_train_epoch_end``: as given, else Lightning's rule: at the train epoch's end
    when validation runs once an epoch (or never), else after each validation (several an
    epoch, or every n epochs)."""
    if given is not None:
        return given
    if not fit_validates(trainer):
        return True
    interval = trainer.val_check_interval
    every_epoch = interval is None or (isinstance(interval, float) and interval == 1.0)
    return trainer.check_val_every_n_epoch == 1 and every_epoch


def validation_next(trainer: Trainer, batch_idx: int) -> bool:
    """Whether the epoch-end validation runs right after this batch (its value is the fresh one)."""
    every = trainer.check_val_every_n_epoch
    return (
        batch_idx + 1 >= trainer.num_training_batches and every is not None
        and (trainer.current_epoch + 1) % every == 0 and fit_validates(trainer)
    )
