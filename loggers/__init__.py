"""Loggers: where a run's metrics and hyperparameters go (TensorBoard by default, CSV, or your own)."""

from .csv_logs import CSVLogger, ExperimentWriter
from .logger import DummyExperiment, DummyLogger, Logger, rank_zero_experiment, rank_zero_only
from .tensorboard import TensorBoardLogger

__all__ = ["CSVLogger", "DummyExperiment", "ExperimentWriter", "DummyLogger", "Logger", "TensorBoardLogger", "rank_zero_experiment", "rank_zero_only"]
