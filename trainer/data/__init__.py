"""Where batches come from: a stage's loaders (several combined), batched fetching, and copies to the device."""

from trainer.data.batches import apply_to_tensors, move_to_device
from trainer.data.combined_loader import CombinedLoader
from trainer.data.loaders import Loaders

__all__ = ["CombinedLoader", "Loaders", "apply_to_tensors", "move_to_device"]
