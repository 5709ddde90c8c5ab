"""The bottom room, imported by every other part: the module, DataModule, run state, metric logging, seeding, checks."""

from trainer.core.datamodule import DataModule
from trainer.core.exceptions import MisconfigurationException
from trainer.core.module import TrainModule
from trainer.core.seed import seed_everything
from trainer.core.signals import Interrupted
from trainer.core.state import RunningStage, TrainerFn, TrainerState, TrainerStatus

__all__ = [
    "DataModule", "Interrupted", "MisconfigurationException", "RunningStage", "TrainModule", "TrainerFn",
    "TrainerState", "TrainerStatus", "seed_everything",
]
