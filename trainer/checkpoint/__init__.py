"""Checkpoints: atomic files, saving beside training, state dicts, exact resume and the run folder."""

from trainer.checkpoint import from_checkpoint  # noqa: F401 - installs load_from_checkpoint's reader (core/hparams.py)
from trainer.checkpoint.files import CheckpointError, load, save_atomic

__all__ = ["CheckpointError", "load", "save_atomic"]
