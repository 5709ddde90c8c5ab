"""Loggers: where a run's metrics and hyperparameters go (TensorBoard by default, CSV, MLflow, W&B, or your own)."""

# mlflow.py and wandb.py import their tracking client only when a run starts: `import loggers` stays cheap.
from .csv_logs import CSVLogger, ExperimentWriter
from .logger import DummyExperiment, DummyLogger, Logger, rank_zero_experiment, rank_zero_only
from .mlflow import MLFlowLogger
from .tensorboard import TensorBoardLogger
from .wandb import WandbLogger

__all__ = [
    "CSVLogger", "DummyExperiment", "DummyLogger", "ExperimentWriter", "Logger", "MLFlowLogger", "TensorBoardLogger",
    "WandbLogger", "rank_zero_experiment", "rank_zero_only",
]
