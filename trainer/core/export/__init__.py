"""Turning a TrainModule into something that runs without this package: TorchScript (``to_torchscript``)."""

from trainer.core.export.torchscript import jit_tracing, to_torchscript

__all__ = ["jit_tracing", "to_torchscript"]
