"""When a monitor writes to the loggers, and at which step: Lightning's rule, kept from the hooks' own counts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer import Trainer


class LogCadence:
    """Lightning's logger cadence for callbacks that write to the loggers themselves.

    During training a row is due when the optimizer steps taken before this batch, plus one,
    are a multiple of ``log_every_n_steps`` (so a batch that only accumulates gradients is
    judged as the one that will step); during a validation, test or predict run, when this
    run's batches so far are; and whenever ``should_stop`` is set. A training row is written
    at the steps taken before the batch, with ``epoch``; an evaluation row at the steps taken.
    The owner calls ``train_batch_start`` and ``eval_batch_start`` from those hooks.
    """

    def __init__(self) -> None:
        self.stepped = 0  # optimizer steps before the current training batch (Lightning's _batches_that_stepped)
        self.run_batches = 0  # batches of the current evaluation or predict run, over all its loaders
        self.totals: dict[tuple[str, str], int] = {}  # batches over every run, per (entry point, stage)

    def train_batch_start(self, trainer: Trainer) -> None:
        self.stepped = trainer.state.log_step

    def eval_start(self) -> None:
        self.run_batches = 0

    def eval_batch_start(self, trainer: Trainer) -> int:
        """Counts the batch; returns the batches of this loop over all its runs."""
        self.run_batches += 1
        key = (str(trainer.state.fn), str(trainer.state.stage))
        self.totals[key] = self.totals.get(key, 0) + 1
        return self.totals[key]

    def due(self, trainer: Trainer) -> bool:
        every = trainer.log_every_n_steps
        if not every:
            return False
        count = self.stepped + 1 if trainer.training else self.run_batches
        return count % every == 0 or trainer.should_stop

    def write(self, trainer: Trainer, metrics: dict[str, Any], step: int | None = None) -> None:
        """One row to every logger: at ``step``, or (None) at the training row's step, with ``epoch``."""
        if not metrics:
            return
        if step is None:
            metrics = {**metrics, "epoch": trainer.current_epoch}
            step = self.stepped
        for logger in trainer.loggers:
            logger.log_metrics(metrics=metrics, step=step)
