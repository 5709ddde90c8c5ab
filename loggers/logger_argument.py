"""The loggers ``Trainer(logger=...)`` makes (TensorBoard by default), and the check of a list of them."""

from __future__ import annotations

import os
from typing import Any

from trainer.core.checks import instances_of

from .logger import Logger
from .tensorboard import TensorBoardLogger


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
        chosen = [logger] if isinstance(logger, Logger) or _logs_like_one(logger) else logger_list(logger)
    for lg in chosen:
        # Looked up on the class: an object that logs like a Logger may lack it (a Mock answers any name)
        use_dir = getattr(type(lg), "use_trainer_dir", None)
        if use_dir is not None:
            use_dir(lg, root if root is not None else os.getcwd(), name)
    return chosen


def _logs_like_one(value: Any) -> bool:
    """An object that is not a Logger but has its methods, which Lightning takes as one (a mock,
    an adapter to a tracking service)."""
    methods = ("log_metrics", "log_hyperparams")
    return not hasattr(value, "__iter__") and all(callable(getattr(value, m, None)) for m in methods)


def logger_list(value: Any) -> list[Logger]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(
            f"logger={value!r:.80} must be True (TensorBoard under log_dir), False (no logging), a loggers.Logger "
            "such as loggers.CSVLogger('logs'), or a list of them."
        )
    value = list(value)
    instances_of("logger", value, Logger, "loggers.Logger", "save_dir", " (subclass it, or pass a list of loggers)")
    return value
