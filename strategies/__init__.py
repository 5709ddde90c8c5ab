"""How a batch is split across devices, where the loss is computed, how gradients sync."""

# The strategies use trainer.data and friends, and trainer.trainer uses the strategies:
# load trainer first, so that `import strategies` before `import trainer` works too.
import trainer  # noqa: F401

from ._select import select_strategy
from ._spawn import WorkerError
from .base import Strategy
from .data_parallel import DataParallelStrategy
from .ddp import DDPStrategy
from .single_device import SingleDeviceStrategy

__all__ = [
    "DDPStrategy",
    "DataParallelStrategy",
    "SingleDeviceStrategy",
    "Strategy",
    "WorkerError",
    "select_strategy",
]
