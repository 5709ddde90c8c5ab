"""How a batch is split across devices, where the loss is computed, how gradients sync."""

from typing import Any

from ._select import select_strategy
from ._spawn import WorkerError
from .base import ParallelStrategy, Strategy
from .data_parallel import DataParallelStrategy
from .ddp import DDPStrategy
from .single_device import SingleDeviceStrategy

__all__ = [
    "DDPStrategy",
    "DataParallelStrategy",
    "FSDPStrategy",
    "ParallelStrategy",
    "SingleDeviceStrategy",
    "Strategy",
    "WorkerError",
    "select_strategy",
]


def __getattr__(name: str) -> Any:
    if name == "FSDPStrategy":  # imported on first use: torch.distributed.checkpoint and DTensor cost 0.8 s
        from .fsdp import FSDPStrategy

        return FSDPStrategy
    raise AttributeError(f"module 'strategies' has no attribute {name!r}")
