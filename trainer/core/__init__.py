"""The bottom room, which every other part may import: the module, the DataModule, the run state, metric logging, seeding and argument checks."""

from trainer.core.datamodule import DataModule
from trainer.core.module import TrainModule
from trainer.core.seed import seed_everything
from trainer.core.signals import Interrupted
from trainer.core.state import TrainerState

__all__ = ["DataModule", "Interrupted", "TrainModule", "TrainerState", "seed_everything"]
