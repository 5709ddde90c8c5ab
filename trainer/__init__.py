"""trainer: a small PyTorch training loop with pluggable strategies and exact resume.

How the three packages depend on each other (imports run one way)::

    trainer's core modules  <-  strategies, callbacks  <-  trainer.trainer and its loops
    (module, data, metrics,     (a Strategy, the           (Trainer, stage, fit_loop,
     checkpoint, seed, ...)      Callbacks)                  evaluation_loop, _hooks)

The core modules import neither strategies nor callbacks. ``Trainer`` sits on top of both,
so this package's ``__init__`` hands it out on first access (``__getattr__`` below) instead
of importing it here: that is the one place that breaks the cycle the package layout would
otherwise make, so that ``import strategies`` or ``import callbacks`` works first too.
"""

import logging as _logging
from typing import Any as _Any

__version__ = "0.1.0"

from .checkpoint import CheckpointError  # noqa: E402
from ._signals import Interrupted  # noqa: E402
from .loaders import DataModule  # noqa: E402
from .module import TrainModule  # noqa: E402
from .seed import seed_everything  # noqa: E402
from .state import TrainerState  # noqa: E402

# Rank 0's one-line summaries (strategy, resume) show by default, like a progress bar does;
# configure the "trainer" logger to change that.
_log = _logging.getLogger("trainer")
if not _log.handlers:
    _handler = _logging.StreamHandler()
    _handler.setFormatter(_logging.Formatter("[trainer] %(message)s"))
    _log.addHandler(_handler)
    _log.setLevel(_logging.INFO)
    _log.propagate = False

__all__ = ["CheckpointError", "DataModule", "Interrupted", "TrainModule", "Trainer", "TrainerState", "seed_everything", "__version__"]


def __getattr__(name: str) -> _Any:
    if name == "Trainer":  # imports strategies and callbacks, which import this package's core
        from .trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"Trainer"})
