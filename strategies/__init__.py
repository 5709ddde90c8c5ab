"""How a batch is split across devices, where the loss is computed, how gradients sync."""

from ._select import select_strategy
from ._spawn import WorkerError
from .base import Strategy
from .data_parallel import DataParallelStrategy
from .ddp import DDPStrategy
from .fsdp import FSDPStrategy
from .single_device import SingleDeviceStrategy

__all__ = [
    "DDPStrategy",
    "DataParallelStrategy",
    "FSDPStrategy",
    "SingleDeviceStrategy",
    "Strategy",
    "WorkerError",
    "select_strategy",
]
