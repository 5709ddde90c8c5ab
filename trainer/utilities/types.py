"""Lightning's ``lightning.pytorch.utilities.types``: what the Trainer keeps for each scheduler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["LRSchedulerConfig"]


@dataclass
class LRSchedulerConfig:
    """One scheduler of ``configure_optimizers`` and when the Trainer steps it, as Lightning's
    (``trainer.lr_scheduler_configs`` holds one per scheduler, equal to Lightning's with the same
    values): at every ``frequency``-th ``interval`` ("epoch" or "step"); one that
    ``reduce_on_plateau`` steps on the value logged under ``monitor``, and ``strict=False`` skips
    that step, with a warning, when it was not logged. ``name`` is LearningRateMonitor's key."""

    scheduler: Any
    name: str | None = None
    interval: str = "epoch"
    frequency: int = 1
    reduce_on_plateau: bool = False
    monitor: str | None = None
    strict: bool = True
