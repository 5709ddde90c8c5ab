"""What the Trainer writes to its loggers, and when: off the training steps, on every rank, as Lightning's
(the built-in loggers' methods are ``rank_zero_only``: they write on global rank 0; a user's own logger may write on
each rank)."""

from __future__ import annotations

import logging
import math
from time import perf_counter  # bound at import: a test that patches time.perf_counter sees only its own calls
import warnings
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from loggers import Logger
from trainer.core.exceptions import PossibleUserWarning
from trainer.core.hparams import is_plain, plain_hparams

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.loops.run import Run
    from trainer.trainer import Trainer

log = logging.getLogger("trainer")
_SAVE_GAP_S = 1.0  # the least time between saves at epoch ends and validations


class LogWriter(Callback):
    """Drives ``trainer.loggers`` from the loop's hooks (it sits after every callback, so
    that what they log at an epoch's end is in that epoch's values).

    At each logging step (every ``log_every_n_steps`` optimizer steps) one ``log_metrics``
    call gets the step's logged values and ``epoch``, as Lightning's: no gradient norm (``trainer.grad_norm`` is
    there for a user to ``self.log``), no throughput (Lightning's ``ThroughputMonitor`` callback logs it, when
    asked for) and no learning rate: a user's ``lr`` curve is the user's, and ``LearningRateMonitor`` logs it. Epoch
    means (``<name>_epoch``) and validation and test means come at their ends, where each
    logger's ``save`` runs too, at most once a second: epochs of a few milliseconds then
    neither each wake a writer's thread nor each pay for a file write.
    """

    def __init__(self, loggers: list[Logger], run: Run) -> None:
        self.loggers, self.run = loggers, run  # the call's run: its eval_metrics
        self._saved = 0.0
        self._failed = False
        self._held: OSError | None = None  # a log write that failed before the epoch's checkpoint was saved

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        self._failed, self._held = False, None

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._saved = perf_counter()  # the first save a second in: a short fit's is its teardown's
        hparams = _hparams(trainer, module)
        options = {f"trainer/{k}": v for k, v in trainer.hparams().items() if v is not None}
        for logger in self.loggers:
            # a resumed fit drops what came after its step, on rank 0 (an object that logs like a Logger may lack it)
            drop = getattr(type(logger), "drop_after_step", None)
            if drop is not None and trainer.is_global_zero:
                drop(logger, row_step(trainer))
            if hparams is not None:  # Lightning's: called only for what save_hyperparameters recorded
                # (a logger that overrides log_fit_hyperparams, as TensorBoard's: else Lightning's call)
                log_fit = getattr(type(logger), "log_fit_hyperparams", Logger.log_fit_hyperparams)
                if log_fit is Logger.log_fit_hyperparams:
                    logger.log_hyperparams(hparams)
                else:
                    log_fit(logger, hparams, options)
            logger.log_graph(module)

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        steps, every = trainer.estimated_stepping_batches, trainer.log_every_n_steps
        if self.loggers and trainer.num_training_batches < every and not trainer.fast_dev_run:
            warnings.warn(
                f"The number of training batches ({trainer.num_training_batches}) is smaller than the logging interval "
                f"Trainer(log_every_n_steps={every}). "
                "Set a lower value for log_every_n_steps if you want to see logs for the training epoch.",
                PossibleUserWarning, stacklevel=2,
            )
        if self.loggers and trainer.global_step == 0 and 2 <= steps < every:
            log.info(
                "This fit makes %d optimizer steps, fewer than log_every_n_steps=%d: its per-step curves get "
                "no point, only the epoch values do. Trainer(log_every_n_steps=%d) gives about 10 points.",
                steps, every, max(1, math.ceil(steps / 10)),
            )

    def on_train_log(self, trainer: Trainer, module: TrainModule, metrics: dict[str, float]) -> None:
        if not metrics:  # nothing logged in the step: no row, as in Lightning
            return
        self._send(trainer, dict(metrics))

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        held, self._held = self._held, None
        if held is not None:  # the epoch's checkpoint went to its writer just before (ModelCheckpoint comes first)
            raise held
        # Lightning's names: "<name>_epoch" for a name logged with on_step and on_epoch, else "<name>"
        means = trainer.train_epoch_metrics
        if means:
            self._send(trainer, dict(means))
        self._save_if_due()

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.sanity_checking:  # writes nothing
            return
        try:
            self._write_eval(trainer)
        except OSError as err:  # a full log disk: the epoch's checkpoint, due after this, is saved first
            # The epoch's end follows: this validation runs in it (an unsized loader) or after its last batch.
            last = trainer.at_epoch_end or trainer.state.batch_in_epoch >= trainer.num_training_batches
            if not (trainer.state.fn == "fit" and last):
                raise
            self._held = err

    def on_test_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._write_eval(trainer)

    def _write_eval(self, trainer: Trainer) -> None:
        # After fit, at the step count where training ended: a later validate/test lands at the
        # end of the curves, where the weights it evaluated belong.
        values = self.run.eval_metrics
        if values:
            self._send(trainer, dict(values))
        self._save_if_due()

    def _send(self, trainer: Trainer, values: dict[str, Any]) -> None:
        """One row to every logger, as Lightning's logger connector sends it: a value logged as
        ``step`` is the row's step (and no ``epoch`` is added); else the row is at Lightning's
        step (:func:`row_step`) with ``epoch``."""
        step = values.pop("step", None)
        if step is None:
            values.setdefault("epoch", trainer.state.current_epoch)
            step = row_step(trainer)
        for logger in self.loggers:
            logger.log_metrics(metrics=values, step=int(step))  # by keyword, as Lightning calls it

    def _save_if_due(self) -> None:
        now = perf_counter()
        if now - self._saved >= _SAVE_GAP_S:
            self._saved = now
            for logger in self.loggers:
                logger.save()

    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        self._failed, self._held = True, None
        for logger in self.loggers:
            try:
                logger.finalize("failed")
            except OSError as err:  # the disk that ended the fit, again: the fit's own error is the one to see
                log.warning("%s could not finish its files: %s", type(logger).__name__, err)

    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if not self._failed:
            for logger in self.loggers:
                logger.finalize("success")


def _hparams(trainer: Trainer, module: TrainModule) -> dict[str, Any] | None:
    """The model's and DataModule's hparams, Lightning's: None when neither recorded any with
    ``save_hyperparameters()`` (or both with ``logger=False``). A key the two record with
    different values is Lightning's error. (TensorBoard also gets the Trainer's options, as
    ``trainer/<option>``, those left at None left out, so that a column keeps one type.)"""
    datamodule = getattr(trainer, "datamodule", None)
    owners = [o for o in (module, datamodule) if o is not None and getattr(o, "_log_hyperparams", False)]
    if not owners:
        return None
    recorded = [plain_hparams(getattr(o, "hparams_initial", None) or getattr(o, "hparams", None) or {}) for o in owners]
    if len(recorded) == 2:
        clash = [k for k in recorded[0].keys() & recorded[1].keys() if k != "_class_path" and (
            type(recorded[0][k]) is not type(recorded[1][k])
            or recorded[0][k] is not recorded[1][k] and recorded[0][k] != recorded[1][k])]
        if clash:
            raise RuntimeError(
                f"Error while merging hparams: the keys {clash} are present in both the LightningModule's and "
                "LightningDataModule's hparams but have different values."
            )
    params: dict[str, Any] = {}
    for values in recorded:
        params.update((k, v) for k, v in values.items() if k != "_class_path" and is_plain(v))
    return params


def row_step(trainer: Trainer) -> int:
    """The step a row is written at, Lightning's (``_batches_that_stepped``): during fit, that of the
    step just taken (step n's row is at n - 1: the first row of log_every_n_steps=50 is at 49),
    the epoch's values at its last step's; outside fit (validate, test), the steps taken."""
    step = trainer.state.log_step
    return max(step - 1, 0) if trainer.state.fn == "fit" else step
