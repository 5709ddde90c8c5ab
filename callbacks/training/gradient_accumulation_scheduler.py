"""GradientAccumulationScheduler: how many batches each optimizer step accumulates, by epoch."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from trainer.core.exceptions import misconfigured
from trainer.core.module import overridden

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
            raise TypeError(f"GradientAccumulationScheduler(scheduling={scheduling!r}) must be a non-empty dict "
                            "{epoch: batches}, e.g. {0: 8, 4: 4, 8: 1}.")
        for epoch, batches in scheduling.items():
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise misconfigured(
                    f"GradientAccumulationScheduler(scheduling={scheduling!r}): "
                    f"the epoch {epoch!r} must be an int >= 0.",
                    f"Epoch should be an int greater than or equal to 0. Got {list(scheduling.keys())}.",
                )
            if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
                raise misconfigured(
                    f"GradientAccumulationScheduler(scheduling={scheduling!r}): epoch {epoch} accumulates {batches!r} "
                    "batches, which must be an int >= 1.",
                    f"Accumulation factor should be an int greater than 0. Got {list(scheduling.values())}.",
                )
        self.scheduling = dict(sorted(scheduling.items()))
        if 0 not in self.scheduling:
            self.scheduling = {0: 1, **self.scheduling}
        self._given: int | None = None  # the Trainer's own accumulate_grad_batches, put back after fit

    def going_to_accumulate_grad_batches(self) -> bool:
        return any(v > 1 for v in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        return next(v for k, v in reversed(self.scheduling.items()) if k <= epoch)

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        self._given = trainer.accumulate_grad_batches

    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not getattr(pl_module, "automatic_optimization", True):  # Lightning's RuntimeError and sentence first
            raise RuntimeError(
                "Automatic gradient accumulation and the `GradientAccumulationScheduler` is not supported for manual "
                "optimization. Please remove the callback or switch to automatic optimization. (With "
                "automatic_optimization=False, training_step decides when each optimizer steps.)"
            )
        if self.going_to_accumulate_grad_batches() and any(
            overridden(pl_module, hook) for hook in ("optimizer_step", "optimizer_zero_grad")
        ):
            warnings.warn(
                "When using `Trainer(accumulate_grad_batches != 1)` and overriding "
                "`LightningModule.optimizer_{step,zero_grad}`, the hooks will not be called on every batch "
                "(rather, they are called on every optimization step).", stacklevel=2,
            )
        if self._given not in (None, 1) or (self._given is None and trainer.accumulate_grad_batches != 1):
            raise ValueError(
                "You have set `accumulate_grad_batches` and are using the `GradientAccumulationScheduler` callback. "
                "Either remove `accumulate_grad_batches` from the Trainer or remove the callback. "
                "(Trainer(accumulate_grad_batches="
                f"{trainer.accumulate_grad_batches}): keep it at 1 and put every epoch in the scheduling.)"
            )

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)

    def teardown(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if stage == "fit" and self._given is not None:
            trainer.accumulate_grad_batches, self._given = self._given, None

    def state_dict(self) -> dict[str, Any]:
        return {}
