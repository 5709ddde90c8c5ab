"""``trainer.predict`` in each process (its entry point), and what it keeps while it runs:
Lightning's ``trainer.predict_loop``.

Prediction writers (``callbacks.BasePredictionWriter``) read it: ``current_batch_indices``
in ``on_predict_batch_end``, ``predictions`` and ``epoch_batch_indices`` in
``on_predict_epoch_end``. Outputs are kept only when something needs them: the caller
(``return_predictions=True``) or a callback that asks for the epoch's predictions
(``wants_epoch_predictions``); with neither, each output is dropped after its batch's hooks,
so memory stays flat over any number of batches.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from torch.utils.data import IterableDataset

from trainer.checkpoint.paths import resolve_ckpt_path
from trainer.loops.evaluation import evaluation_loaders, evaluation_loop
from trainer.loops.run import start, stage_hooks

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.loops.run import StageData
    from trainer.trainer import Trainer


def predict_stage(trainer: Trainer, model: TrainModule, data: StageData, ckpt_path: Any) -> Any:
    """``trainer.predict`` in this process: the run set up (no run folder: predict logs nothing),
    then, between the ``setup`` and ``teardown`` hooks, the checkpoint's weights, the loaders and
    the loop. Returns the outputs, gathered to global rank 0 (None if not kept)."""
    run = start(trainer, "predict", model, data.datamodule)
    path = resolve_ckpt_path(trainer, ckpt_path, "predict")  # before any hook: a wrong "best" fails first
    with stage_hooks(trainer, run):
        loaders = evaluation_loaders(trainer, run, data, path)
        run.predict_loop = PredictLoop(data.return_predictions, trainer.callbacks, len(loaders))
        try:
            outputs = evaluation_loop(trainer, run, "predict", loaders, trainer.limit_predict_batches)
            if not data.return_predictions:
                return None
            outputs = [trainer.strategy.gather_predictions(out) for out in outputs]
            # Lightning's: one loader's list (one in a list or dict too), else a list per loader (a dict's too)
            return outputs[0] if len(loaders) == 1 else outputs
        finally:
            run.predict_loop.release()


class PredictLoop:
    """The state of one ``predict`` call (one per Trainer; replaced by the next call)."""

    def __init__(self, return_predictions: bool = True, callbacks: Any = (), num_dataloaders: int = 1) -> None:
        self.return_predictions = return_predictions
        epoch_writers = any(getattr(cb, "wants_epoch_predictions", False) for cb in callbacks)
        self.keep_outputs = return_predictions or epoch_writers
        self.keep_indices = epoch_writers
        self.track_indices = epoch_writers or any(getattr(cb, "wants_batch_indices", False) for cb in callbacks)
        self.num_dataloaders = num_dataloaders
        self._predictions: list[list[Any]] = [[] for _ in range(num_dataloaders)]
        self.epoch_batch_indices: list[list[Any]] = [[] for _ in range(num_dataloaders)]
        self.current_batch_indices: list[int] | None = None
        self._drawn: deque[Any] | None = None

    @property
    def predictions(self) -> list[Any]:
        """The kept outputs: a list (one per batch), or one such list per loader with several."""
        return self._predictions[0] if self.num_dataloaders == 1 else self._predictions

    @property
    def per_dataloader(self) -> list[list[Any]]:
        """The kept outputs, one list per loader (one list with one loader)."""
        return self._predictions

    def start_loader(self, loader: Any) -> deque[Any] | None:
        """Before a loader's first batch: where ``fetch.batches`` records the drawn indices."""
        self.current_batch_indices = None
        iterable = isinstance(getattr(loader, "dataset", None), IterableDataset)  # no indices to report
        self._drawn = deque() if self.track_indices and not iterable else None
        return self._drawn

    def on_batch(self, dataloader_idx: int) -> None:
        """Before the batch's step: its sample indices, in the dataset's numbering."""
        if self._drawn is not None and self._drawn:
            self.current_batch_indices = self._drawn.popleft()
            if self.keep_indices:
                self.epoch_batch_indices[dataloader_idx].append(self.current_batch_indices)

    def keep(self, dataloader_idx: int, output: Any) -> None:
        if self.keep_outputs:
            self._predictions[dataloader_idx].append(output)

    def release(self) -> None:
        """After predict: nothing is held unless the caller asked for the outputs."""
        self._drawn, self.current_batch_indices = None, None
        if not self.return_predictions:
            self._predictions = [[] for _ in range(self.num_dataloaders)]
            self.epoch_batch_indices = [[] for _ in range(self.num_dataloaders)]
