"""What the Trainer writes to its loggers, and when: global rank 0 only, off the training steps."""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from loggers import Logger, TensorBoardLogger
from trainer.core.checks import instances_of
from trainer.core.hparams import is_plain

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer

log = logging.getLogger("trainer")
_SAVE_GAP_S = 1.0  # the least time between saves at epoch ends and validations


class LogWriter(Callback):
    """Drives ``trainer.loggers`` from the loop's hooks (it sits after every callback, so
    that what they log at an epoch's end is in that epoch's values).

    At each logging step (every ``log_every_n_steps`` optimizer steps) one ``log_metrics``
    call gets the step's logged values, ``lr`` (``lr/group<i>``, ``lr/optimizer<i>``),
    ``grad_norm`` when clipping, ``epoch``, and ``throughput/steps_per_sec`` and
    ``throughput/samples_per_sec`` (training time only; samples over all processes). Epoch
    means (``<name>_epoch``) and validation and test means come at their ends, where each
    logger's ``save`` runs too, at most once a second: epochs of a few milliseconds then
    neither each wake a writer's thread nor each pay for a file write.
    """

    def __init__(self, loggers: list[Logger]) -> None:
        self.loggers = loggers
        self._clock: tuple[float, int, int] | None = None  # (time, step, samples) at the last log step
        self._paused_at: float | None = None
        self._saved = 0.0
        self._failed = False

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        self._failed = False

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._saved = time.perf_counter()  # the first save a second in: a short fit's is its teardown's
        hparams = _hparams(trainer, module)
        for logger in self.loggers:
            getattr(logger, "_resume_at", lambda step: None)(trainer.global_step)  # a resumed fit drops what came after
            if isinstance(logger, TensorBoardLogger):
                logger.log_hyperparams(hparams)
            else:
                logger.log_hyperparams({k: v for k, v in hparams.items() if not k.startswith("trainer/")})
            logger.log_graph(module)

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        steps, every = trainer.estimated_stepping_batches, trainer.log_every_n_steps
        if self.loggers and trainer.num_training_batches < every and not trainer.fast_dev_run:
            warnings.warn(
                f"The number of training batches ({trainer.num_training_batches}) is smaller than the logging interval "
                f"Trainer(log_every_n_steps={every}). Set a lower value for log_every_n_steps if you want to see logs for "
                "the training epoch.", UserWarning, stacklevel=2,
            )
        if self.loggers and trainer.global_step == 0 and 2 <= steps < every:
            log.info(
                "This fit makes %d optimizer steps, fewer than log_every_n_steps=%d: its per-step curves get "
                "the first step and each epoch's last. Trainer(log_every_n_steps=%d) gives about 10 points.",
                steps, every, max(1, math.ceil(steps / 10)),
            )
        self._clock = (time.perf_counter(), trainer.global_step, trainer.samples_seen)
        if getattr(trainer, "compile", None) is not None:  # the first steps compile: throughput starts at the first log step
            self._clock = None

    def on_train_log(self, trainer: Trainer, module: TrainModule, metrics: dict[str, float]) -> None:
        step, samples, now = trainer.state.global_step, trainer.samples_seen, time.perf_counter()
        values = dict(metrics)
        for i, opt in enumerate(trainer.optimizers):  # lr, lr/group1, lr/optimizer1, lr/optimizer1/group1
            prefix = "lr" if len(trainer.optimizers) == 1 else f"lr/optimizer{i}"
            groups = opt.param_groups
            for j, group in enumerate(groups):  # float(): schedulers update tensors in place
                values[prefix if len(groups) == 1 else f"{prefix}/group{j}"] = float(group["lr"])
        if trainer.grad_norm is not None:
            values["grad_norm"] = float(trainer.grad_norm)
        values["epoch"] = trainer.state.current_epoch
        if self._clock is not None and now > self._clock[0]:
            t0, s0, n0 = self._clock
            values["throughput/steps_per_sec"] = (step - s0) / (now - t0)
            values["throughput/samples_per_sec"] = (samples - n0) * trainer.world_size / (now - t0)
        self._clock = (now, step, samples)
        for logger in self.loggers:
            logger.log_metrics(values, step)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        # "<name>_epoch" (a name logged with on_step and on_epoch is called so already)
        means = {n if n.endswith("_epoch") else f"{n}_epoch": v for n, v in trainer.train_epoch_metrics.items()}
        if means:
            for logger in self.loggers:
                logger.log_metrics(means, trainer.global_step)
        self._save_if_due()

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._paused_at = time.perf_counter()

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._paused_at is not None and self._clock is not None and trainer.state.fn == "fit":
            # Throughput measures training: move the clock's start past the validation.
            t0, s0, n0 = self._clock
            self._clock = (t0 + time.perf_counter() - self._paused_at, s0, n0)
        self._paused_at = None
        self._write_eval(trainer)

    def on_test_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._write_eval(trainer)

    def _write_eval(self, trainer: Trainer) -> None:
        # After fit, global_step is where training ended: a later validate/test lands at the
        # end of the curves, where the weights it evaluated belong.
        if trainer.logged_metrics:
            for logger in self.loggers:
                logger.log_metrics(dict(trainer.logged_metrics), trainer.global_step)
        self._save_if_due()

    def _save_if_due(self) -> None:
        now = time.perf_counter()
        if now - self._saved >= _SAVE_GAP_S:
            self._saved = now
            for logger in self.loggers:
                logger.save()

    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        self._failed = True
        for logger in self.loggers:
            logger.finalize("failed")

    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if not self._failed:
            for logger in self.loggers:
                logger.finalize("success")


def _hparams(trainer: Trainer, module: TrainModule) -> dict[str, Any]:
    """The Trainer's options (``trainer/<option>``, those left at None left out, so that a
    column keeps one type across runs) and the model's (and datamodule's) hparams."""
    params = {f"trainer/{k}": v for k, v in trainer.hparams().items() if v is not None}
    datamodule = getattr(trainer, "datamodule", None)
    for owner in (datamodule, module):
        if owner is not None and getattr(owner, "_log_hyperparams", True):  # save_hyperparameters(logger=False)
            params.update({k: v for k, v in (getattr(owner, "hparams", None) or {}).items() if is_plain(v)})
    return params


# --- the run folder ------------------------------------------------------------------------
def resolve_run_dir(trainer: Trainer, resume_path: str | None, fit: bool) -> tuple[str | None, str | None, list[Any]]:
    """On global rank 0, before a stage: (the run folder, where checkpoints go under;
    ``trainer.log_dir``; the loggers' versions). A fit picks each file logger's version
    folder: the resumed run's own when ``resume_path`` lies in one, else the next free one
    (the Trainer's default logger takes a new one at each fit). The run folder is Lightning's
    ``<save_dir>/<name>/<version>`` of the first logger; without a logger, ``log_dir``."""
    root = trainer.default_root_dir
    if not trainer.loggers:
        return None if root is None else os.path.abspath(root), root, []
    if fit:
        for lg in trainer.loggers:
            start = getattr(lg, "_start_fit", None)
            if start is not None:
                start(resume_path, lg._made_by_trainer)
    first = trainer.loggers[0]
    version = first.version
    folder = version if isinstance(version, str) else f"version_{version}"
    save_dir = first.save_dir or root or os.getcwd()
    run_dir = os.path.abspath(os.path.join(save_dir, first.name or "", folder))
    return run_dir, first.log_dir or first.save_dir or root or run_dir, logger_versions(trainer)


def logger_versions(trainer: Trainer) -> list[Any]:
    return [getattr(lg, "_version", None) for lg in trainer.loggers]


def set_logger_versions(trainer: Trainer, versions: list[Any]) -> None:
    for lg, version in zip(trainer.loggers, versions):
        if version is not None and hasattr(lg, "_version"):
            lg._version = version


class LoggerAccess:
    """The Trainer's ``logger``, ``loggers`` and ``log_dir``, as Lightning names them."""

    _loggers: list[Logger]
    _log_dir: str | None
    default_root_dir: str | None

    @property
    def logger(self) -> Logger | None:
        """The first logger (None with ``logger=False``)."""
        return self._loggers[0] if self._loggers else None

    @logger.setter
    def logger(self, value: Logger | None) -> None:
        self._loggers = [] if value is None else logger_list([value])

    @property
    def loggers(self) -> list[Logger]:
        return self._loggers

    @loggers.setter
    def loggers(self, value: list[Logger] | None) -> None:
        self._loggers = [] if value is None else logger_list(value)

    @property
    def log_dir(self) -> str | None:
        """The first logger's folder (TensorBoard's ``<log_dir>/<name>/version_<n>``); without
        a logger, the Trainer's ``log_dir`` option."""
        if self._log_dir is not None:
            return self._log_dir
        if not self._loggers:
            return self.default_root_dir
        first = self._loggers[0]
        return first.log_dir or first.save_dir


# --- Trainer(logger=...) -------------------------------------------------------------------
def make_loggers(logger: Any, legacy: list[Logger], root: str | None, name: str) -> list[Logger]:
    """``Trainer(logger=...)``: True -> a TensorBoardLogger under ``<log_dir>/<name>`` (none
    with ``log_dir=None``), False -> none, a logger or a list of them -> those. Loggers made
    without a ``save_dir`` write under ``log_dir`` (the working directory if None)."""
    if logger is None:
        logger = True
    if isinstance(logger, bool):
        if not logger or root is None:
            return []
        # TensorBoardLogger(flush_secs=...) passed in callbacks, as before the loggers package, replaces the default.
        chosen = legacy or [TensorBoardLogger(root, name=name, default_hp_metric=False)]
        for lg in chosen:
            lg._made_by_trainer = True  # a new version folder for each fit, as the run folder always had
    else:
        chosen = [logger] if isinstance(logger, Logger) else logger_list(logger)
    for lg in chosen:
        adopt = getattr(lg, "_adopt", None)
        if adopt is not None:
            adopt(root if root is not None else os.getcwd(), name)
    return chosen


def split_loggers(callbacks: Any) -> tuple[Any, list[Logger]]:
    """Loggers passed in ``callbacks`` (``callbacks.TensorBoardLogger(flush_secs=...)`` was a
    callback before the loggers package) are taken out: they replace the default logger."""
    if callbacks is None or isinstance(callbacks, (Callback, str, bytes)) or not hasattr(callbacks, "__iter__"):
        return callbacks, []
    callbacks = list(callbacks)
    return [cb for cb in callbacks if not isinstance(cb, Logger)], [cb for cb in callbacks if isinstance(cb, Logger)]


def logger_list(value: Any) -> list[Logger]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(
            f"logger={value!r:.80} must be True (TensorBoard under log_dir), False (no logging), a loggers.Logger "
            "such as loggers.CSVLogger('logs'), or a list of them."
        )
    value = list(value)
    instances_of("logger", value, Logger, "loggers.Logger", "save_dir", " (subclass it, or pass a list of loggers)")
    return value
