"""Hooks into the training loop, and the callbacks that ship with the trainer.

Learning rates reach the loggers as in Lightning, through ``LearningRateMonitor`` (Lightning's
``lr-<Optimizer>`` names, to any logger); the Trainer writes no ``lr`` of its own into a run.
``callbacks.TensorBoardLogger`` is ``loggers.TensorBoardLogger`` (it was a callback before the
loggers had a package of their own), imported on first use: the loggers sit beside the callbacks.
"""

from typing import Any

from .base import Callback, LambdaCallback
from .early_stopping import EarlyStopping, EarlyStoppingReason
from .finders import BatchSizeFinder, LearningRateFinder
from .model_checkpoint import ModelCheckpoint
from .model_summary import ModelSummary, RichModelSummary
from .nan_guard import NaNGuard
from .lr_monitor import LearningRateMonitor
from .progress import ProgressBar, RichProgressBar, RichProgressBarTheme, TQDMProgressBar
from .prediction_writer import BasePredictionWriter
from .timer import Timer
from .training import BackboneFinetuning, BaseFinetuning, GradientAccumulationScheduler, StochasticWeightAveraging
from .training import EMAWeightAveraging, ModelPruning, WeightAveraging
from .monitors import DeviceStatsMonitor, SpikeDetection, ThroughputMonitor, TrainingSpikeException
from .monitors import Throughput, measure_flops

__all__ = [
    "BackboneFinetuning", "BaseFinetuning", "BasePredictionWriter", "BatchSizeFinder", "Callback", "EarlyStopping",
    "EarlyStoppingReason",
    "GradientAccumulationScheduler", "LambdaCallback", "LearningRateFinder", "LearningRateMonitor", "ModelCheckpoint",
    "ModelSummary", "NaNGuard", "ProgressBar", "RichModelSummary", "RichProgressBar", "RichProgressBarTheme",
    "StochasticWeightAveraging", "TQDMProgressBar", "TensorBoardLogger", "Timer", "Tqdm",
    "EMAWeightAveraging", "ModelPruning", "WeightAveraging",
    "DeviceStatsMonitor", "SpikeDetection", "Throughput", "ThroughputMonitor", "TrainingSpikeException",
    "measure_flops",
]


def __getattr__(name: str) -> Any:
    if name == "TensorBoardLogger":
        from loggers import TensorBoardLogger

        return TensorBoardLogger
    if name == "Tqdm":  # Lightning's tqdm subclass; made on first use (importing tqdm is not free)
        from .progress import tqdm_class

        return tqdm_class()
    raise AttributeError(f"module 'callbacks' has no attribute {name!r}")
