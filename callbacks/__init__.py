"""Hooks into the training loop, and the callbacks that ship with the trainer."""

from .base import Callback
from .model_checkpoint import ModelCheckpoint
from .progress import ProgressBar
from .tensorboard import TensorBoardLogger

__all__ = ["Callback", "ModelCheckpoint", "ProgressBar", "TensorBoardLogger"]
