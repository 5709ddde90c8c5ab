"""``BasePredictionWriter``: ``predict``'s outputs written as they come, instead of kept.

Subclass it and override ``write_on_batch_end`` (``write_interval="batch"``), or
``write_on_epoch_end`` (``"epoch"``), or both (``"batch_and_epoch"``); then call
``trainer.predict(model, loader, return_predictions=False)``. With ``"batch"`` nothing is kept:
memory stays flat over any number of batches. ``"epoch"`` keeps this process's outputs until
the end of the pass.

``batch_indices`` are the batch's sample indices in the dataset (as the loader's sampler drew
them; None for an ``IterableDataset`` or a loader that is not a ``DataLoader``). Under
``strategy="ddp"`` each process predicts its own contiguous share and writes its own part:
saving ``batch_indices`` next to the predictions (with ``trainer.global_rank`` in the file
name) lets you put the parts back in the dataset's order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from trainer.core.exceptions import misconfigured

from .base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

INTERVALS = ("batch", "epoch", "batch_and_epoch")


class BasePredictionWriter(Callback):
    """Calls ``write_on_batch_end`` after each predict batch and/or ``write_on_epoch_end``
    after each predict pass, as ``write_interval`` says."""

    def __init__(self, write_interval: str = "batch") -> None:
        if write_interval not in INTERVALS:
            raise misconfigured(
                f"write_interval={write_interval!r}: use one of {', '.join(map(repr, INTERVALS))}.",
                f"`write_interval` should be one of {list(INTERVALS)}.",
            )
        self.write_interval = write_interval
        self.on_batch = write_interval in ("batch", "batch_and_epoch")
        self.on_epoch = write_interval in ("epoch", "batch_and_epoch")

    # Read by trainer.predict: what it must keep for this writer.
    @property
    def wants_batch_indices(self) -> bool:
        return True

    @property
    def wants_epoch_predictions(self) -> bool:
        return self.on_epoch

    def wants_hook(self, hook: str) -> bool:
        """The Trainer's question (see ``Callback``): only the hooks its ``write_interval`` writes in."""
        if hook == "on_predict_batch_end":
            return self.on_batch
        if hook == "on_predict_epoch_end":
            return self.on_epoch
        return True

    def write_on_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, prediction: Any, batch_indices: Sequence[int] | None,
        batch: Any, batch_idx: int, dataloader_idx: int,
    ) -> None:
        """Write one batch's ``prediction``."""
        raise NotImplementedError(
            f"{type(self).__name__}(write_interval={self.write_interval!r}) must override write_on_batch_end("
            "trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx)."
        )

    def write_on_epoch_end(
        self, trainer: Trainer, pl_module: TrainModule, predictions: Sequence[Any], batch_indices: Sequence[Any],
    ) -> None:
        """Write the whole pass: ``predictions`` is one list of batch outputs (one list per
        loader with several); ``batch_indices`` is one list per loader of each batch's indices."""
        raise NotImplementedError(
            f"{type(self).__name__}(write_interval={self.write_interval!r}) must override write_on_epoch_end("
            "trainer, pl_module, predictions, batch_indices)."
        )

    def on_predict_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        indices = trainer.predict_loop.current_batch_indices
        self.write_on_batch_end(trainer, pl_module, outputs, indices, batch, batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        loop = trainer.predict_loop
        self.write_on_epoch_end(trainer, pl_module, loop.predictions, loop.epoch_batch_indices)
