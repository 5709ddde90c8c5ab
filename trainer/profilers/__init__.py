"""Profilers: where a stage's time goes (Lightning's ``lightning.pytorch.profilers``)."""

from __future__ import annotations

from typing import Any

from trainer.profilers.advanced import AdvancedProfiler
from trainer.profilers.base import PassThroughProfiler, Profiler
from trainer.profilers.simple import SimpleProfiler

__all__ = ["AdvancedProfiler", "PassThroughProfiler", "Profiler", "PyTorchProfiler", "SimpleProfiler"]


def __getattr__(name: str) -> Any:
    if name == "PyTorchProfiler":  # torch.profiler's machinery, imported when asked for
        from trainer.profilers.pytorch import PyTorchProfiler

        return PyTorchProfiler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
