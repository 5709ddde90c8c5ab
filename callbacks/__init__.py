"""Hooks into the training loop, and the callbacks that ship with the trainer.

Learning rates need no callback of their own: ``TensorBoardLogger`` (on by default) writes
``lr`` (``lr/group<i>`` per param group) at every logging step.
"""

from .base import Callback
from .early_stopping import EarlyStopping
from .lambda_callback import LambdaCallback
from .model_checkpoint import ModelCheckpoint
from .model_summary import ModelSummary
from .nan_guard import NaNGuard
from .progress import ProgressBar
from .tensorboard import TensorBoardLogger
from .timer import Timer
from .toolbox import BasePredictionWriter, BatchSizeFinder, LearningRateFinder

__all__ = [
    "BasePredictionWriter", "BatchSizeFinder", "Callback", "EarlyStopping", "LambdaCallback", "LearningRateFinder", "ModelCheckpoint", "ModelSummary", "NaNGuard", "ProgressBar",
    "TensorBoardLogger", "Timer",
]
