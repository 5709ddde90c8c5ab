"""trainer: a small PyTorch training loop with pluggable strategies and exact resume.

The rooms, bottom to top; each imports only the ones before it (imports run one way)::

    trainer.core        the module, the DataModule, the run state, metric logging, seeding, checks
    trainer.data        loaders, batched fetching, device copies
    trainer.checkpoint  checkpoint files, background saving, state dicts, resume, the run folder
    strategies, callbacks   built on the three rooms above, never on the loops or the Trainer
    trainer.loops       the order of events: fit, evaluation, a stage, hooks, optimization, precision
    trainer.trainer     the Trainer: its options and its entry points
    trainer.utilities   Lightning's public utilities (parsing, memory, seeding, warnings, tied weights)
    trainer.tuner       the Tuner (lr_find, scale_batch_size), beside the Trainer it drives

``Trainer`` sits on top of strategies and callbacks, so this ``__init__`` hands it out on first
access (``__getattr__`` below, PEP 562) instead of importing it here: ``import strategies`` or
``import callbacks`` first works too, and no module imports this ``__init__`` back.
"""

import logging as _logging
from typing import Any as _Any

from trainer._version import __version__
from trainer.checkpoint.files import CheckpointError
from trainer.core.datamodule import DataModule
from trainer.core.exceptions import MisconfigurationException, PossibleUserWarning
from trainer.core.module import TrainModule
from trainer.core.seed import seed_everything
from trainer.core.signals import Interrupted
from trainer.core.state import RunningStage, TrainerFn, TrainerState, TrainerStatus
from trainer.core.hparams import AttributeDict
from trainer.core.distributed import rank_zero_debug, rank_zero_info, rank_zero_only, rank_zero_warn
from trainer.core.metrics import grad_norm
from trainer.utilities.warnings import honour_environment as _honour_environment

# Rank 0's one-line summaries (strategy, resume) show by default, like a progress bar does;
# configure the "trainer" logger to change that. As Lightning does with its logger: when the root
# logger has handlers (logging.basicConfig ran, or pytest's capture), the lines go to them instead.
_log = _logging.getLogger("trainer")
if not _log.handlers and not _logging.getLogger().hasHandlers():
    _handler = _logging.StreamHandler()
    _handler.setFormatter(_logging.Formatter("[trainer] %(message)s"))
    _log.addHandler(_handler)
    _log.propagate = False
_log.setLevel(_logging.INFO)
_honour_environment()  # POSSIBLE_USER_WARNINGS=0 silences PossibleUserWarning, as importing Lightning does

__all__ = [
    "AttributeDict", "CheckpointError", "CombinedLoader", "DataModule", "Interrupted", "LightningOptimizer",
    "MisconfigurationException",
    "PossibleUserWarning", "RunningStage", "TrainModule",
    "Trainer", "TrainerFn", "TrainerState", "TrainerStatus", "Tuner",
    "grad_norm", "rank_zero_debug", "rank_zero_info", "rank_zero_only", "rank_zero_warn", "seed_everything",
    "__version__",
]


def __getattr__(name: str) -> _Any:
    if name == "Trainer":  # imports strategies and callbacks, which import the rooms below
        from trainer.trainer import Trainer

        return Trainer
    if name == "Tuner":
        from trainer.tuner import Tuner

        return Tuner
    if name == "CombinedLoader":  # Lightning's lightning.pytorch.utilities.CombinedLoader; its home is trainer.data
        from trainer.data.combined_loader import CombinedLoader

        return CombinedLoader
    if name == "LightningOptimizer":  # Lightning's lightning.pytorch.core.optimizer.LightningOptimizer
        from trainer.loops.optimization.optimizer import LightningOptimizer

        return LightningOptimizer
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"CombinedLoader", "LightningOptimizer", "Trainer", "Tuner"})
