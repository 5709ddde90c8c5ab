"""Where batches come from: a stage's loaders, batched fetching, and copies to the device."""

from trainer.data.batches import apply_to_tensors, move_to_device
from trainer.data.loaders import Loaders

__all__ = ["Loaders", "apply_to_tensors", "move_to_device"]
