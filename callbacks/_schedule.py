"""When a fit validates: what monitoring callbacks need to know before they judge a metric."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer import Trainer


def fit_validates(trainer: Trainer) -> bool:
    """Whether the running fit will ever run its validation loop.

    False without a validation loader, with ``limit_val_batches=0``, or with neither
    ``check_val_every_n_epoch`` nor a ``val_check_interval`` that can fire (a fraction of an
    epoch of unknown length never does). Then a monitored metric must come from training,
    and is due at each epoch's end; otherwise it is due once validation has run.
    """
    if trainer.val_dataloaders is None or trainer.limit_val_batches == 0:
        return False
    if trainer.check_val_every_n_epoch is not None:
        return True
    interval = trainer.val_check_interval
    return isinstance(interval, int) or (interval is not None and trainer.num_training_batches != math.inf)
