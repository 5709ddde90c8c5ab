"""Loggers: where a run's metrics and hyperparameters go (TensorBoard by default, CSV, MLflow, W&B, Comet, your own)."""

# comet.py, mlflow.py and wandb.py import their tracking client only when needed: `import loggers` stays cheap.
from .comet import CometLogger
from .csv_logs import CSVLogger, ExperimentWriter
from .logger import DummyExperiment, DummyLogger, Logger, rank_zero_experiment, rank_zero_only
from .mlflow import MLFlowLogger
from .tensorboard import TensorBoardLogger
from .wandb import WandbLogger

__all__ = [
    "CSVLogger", "CometLogger", "DummyExperiment", "DummyLogger", "ExperimentWriter", "Logger", "MLFlowLogger",
    "TensorBoardLogger", "WandbLogger", "rank_zero_experiment", "rank_zero_only",
]
