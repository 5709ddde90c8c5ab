"""GradientAccumulationScheduler: how many batches each optimizer step accumulates, by epoch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule


class GradientAccumulationScheduler(Callback):
    """``scheduling={0: 8, 4: 4, 8: 1}``: accumulate 8 batches per step from epoch 0, 4 from
    epoch 4, 1 from epoch 8 (epochs before the first key accumulate 1). It sets
    ``trainer.accumulate_grad_batches`` at each epoch's start, and
    ``trainer.estimated_stepping_batches`` counts with it. Leave ``Trainer(accumulate_grad_batches)``
    at 1; manual optimization is refused, as in Lightning.
    """

    def __init__(self, scheduling: dict[int, int]) -> None:
        if not isinstance(scheduling, dict) or not scheduling:
            raise TypeError(f"GradientAccumulationScheduler(scheduling={scheduling!r}) must be a non-empty dict {{epoch: batches}}, e.g. {{0: 8, 4: 4, 8: 1}}.")
        for epoch, batches in scheduling.items():
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise ValueError(f"GradientAccumulationScheduler(scheduling={scheduling!r}): the epoch {epoch!r} must be an int >= 0.")
            if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
                raise ValueError(
                    f"GradientAccumulationScheduler(scheduling={scheduling!r}): epoch {epoch} accumulates {batches!r} "
                    "batches, which must be an int >= 1."
                )
        self.scheduling = dict(sorted(scheduling.items()))
        if 0 not in self.scheduling:
            self.scheduling = {0: 1, **self.scheduling}
        self._given: int | None = None  # the Trainer's own accumulate_grad_batches, put back after fit

    def going_to_accumulate_grad_batches(self) -> bool:
        return any(v > 1 for v in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        return next(v for k, v in reversed(self.scheduling.items()) if k <= epoch)

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.accumulate_grad_batches != 1:
            raise ValueError(
                f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) and GradientAccumulationScheduler "
                "both set the accumulation: keep accumulate_grad_batches=1 and put every epoch in the scheduling."
            )
        if not getattr(module, "automatic_optimization", True):
            raise ValueError(
                "GradientAccumulationScheduler needs automatic optimization: with automatic_optimization=False, "
                "training_step decides when each optimizer steps."
            )
        self._given = trainer.accumulate_grad_batches

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)

    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if stage == "fit" and self._given is not None:
            trainer.accumulate_grad_batches, self._given = self._given, None

    def state_dict(self) -> dict[str, Any]:
        return {}
