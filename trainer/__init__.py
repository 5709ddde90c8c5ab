"""trainer: a small PyTorch training loop with pluggable strategies and exact resume."""

import logging as _logging

__version__ = "0.1.0"

from .checkpoint import CheckpointError  # noqa: E402
from ._signals import Interrupted  # noqa: E402
from .module import TrainModule  # noqa: E402
from .seed import seed_everything  # noqa: E402
from .state import TrainerState  # noqa: E402
from .trainer import Trainer  # noqa: E402

# Rank 0's one-line summaries (strategy, resume) show by default, like a progress bar does;
# configure the "trainer" logger to change that.
_log = _logging.getLogger("trainer")
if not _log.handlers:
    _handler = _logging.StreamHandler()
    _handler.setFormatter(_logging.Formatter("[trainer] %(message)s"))
    _log.addHandler(_handler)
    _log.setLevel(_logging.INFO)
    _log.propagate = False

__all__ = ["CheckpointError", "Interrupted", "TrainModule", "Trainer", "TrainerState", "seed_everything", "__version__"]
