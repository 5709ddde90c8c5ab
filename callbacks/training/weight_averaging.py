"""WeightAveraging and EMAWeightAveraging: an averaged copy of the model (``AveragedModel``) updated during fit."""

from __future__ import annotations

import copy
import itertools
import logging
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn

from trainer.core.checks import positive_int
from trainer.core.exceptions import misconfigured
from trainer.core.module import overridden

from ..base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

log = logging.getLogger("trainer")


class WeightAveraging(Callback):
    """Keeps an ``AveragedModel`` of the model during fit: after each optimizer step for which
    ``should_update(step_idx=...)`` says True (every step, by default) and after each
    training epoch for which ``should_update(epoch_idx=...)`` does. The keywords go to
    ``AveragedModel`` (``avg_fn`` or ``multi_avg_fn``; without them, an equal-weight average:
    SWA). ``device`` keeps the average elsewhere (``"cpu"`` saves GPU memory; default: the
    model's); ``use_buffers=True`` (unlike ``AveragedModel``'s default) averages BatchNorm's
    running statistics too.

    Validation runs on the averaged weights (swapped in at each validation epoch's start and
    back at its end), and when training ends the model keeps them. A checkpoint's
    ``state_dict`` holds the averaged weights, so it loads for inference as it is; the
    training weights ride along under ``current_model_state`` and the average's count under
    ``averaging_state``, and a fit resumed from it carries on exactly.
    """

    def __init__(self, device: torch.device | str | int | None = None, use_buffers: bool = True, **kwargs: Any) -> None:
        self._device = torch.device(device) if isinstance(device, str) else device
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average_model: AveragedModel | None = None
        # The optimizer steps taken at the last update: 0, so the first update comes after the first step
        # (after N batches under accumulate_grad_batches=N); and the epoch of the last epoch-end update.
        self._latest_update_step = 0
        self._latest_update_epoch = -1

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Whether to update the average after the optimizer step ``step_idx`` (counted from 0)
        or the epoch ``epoch_idx``; one of them is given. Override to choose; this default
        updates after every step and never at an epoch's end."""
        return step_idx is not None

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        if overridden(pl_module, "configure_model"):
            warnings.warn(
                "You're using the WeightAveraging callback with a model that overrides the configure_model "
                "callback. WeightAveraging doesn't support sharding model layers, so you may run out of memory.",
                UserWarning,
                stacklevel=2,
            )
            pl_module.configure_model()  # the layers must exist for the copy
        device = self._device if self._device is not None else pl_module.device
        self._average_model = AveragedModel(
            model=pl_module, device=device, use_buffers=self._use_buffers, **self._kwargs
        )

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step  # optimizer steps taken: unchanged by a batch that only accumulated
        if step > self._latest_update_step and self.should_update(step_idx=step - 1):
            self._update(pl_module)
            self._latest_update_step = step

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        epoch = trainer.current_epoch
        if epoch > self._latest_update_epoch and self.should_update(epoch_idx=epoch):
            self._update(pl_module)
            self._latest_update_epoch = epoch

    def _update(self, pl_module: TrainModule) -> None:
        if self._average_model is None:
            raise RuntimeError("WeightAveraging was not set up for fit: its average exists from setup('fit') on.")
        self._average_model.update_parameters(pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._average_model is not None:
            self._copy_average_to_current(pl_module)

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._average_model is not None:
            self._swap_models(pl_module)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._average_model is not None:
            self._swap_models(pl_module)

    # --- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"latest_update_step": self._latest_update_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._latest_update_step = state_dict["latest_update_step"]

    def on_save_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        if self._average_model is None:
            log.info(
                "You're using the WeightAveraging callback, but saving a checkpoint outside the 'fit' stage. The state "
                "of the WeightAveraging callback won't be saved in the checkpoint. If training has finished, the "
                "average model parameters will be saved to the state_dict in the checkpoint."
            )
            return
        average = self._average_model.state_dict()  # the copy's keys start with "module."
        checkpoint["current_model_state"] = checkpoint["state_dict"]
        checkpoint["state_dict"] = {k[len("module.") :]: v for k, v in average.items() if k.startswith("module.")}
        checkpoint["averaging_state"] = {k: v for k, v in average.items() if not k.startswith("module.")}

    def on_load_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        if self._average_model is None:
            warnings.warn(
                "You're using the WeightAveraging callback, but loading a checkpoint outside the 'fit' stage. The "
                "WeightAveraging state cannot be restored. If you're using the checkpoint for prediction or testing, "
                "you can ignore this warning. To disable the warning, remove the WeightAveraging callback.",
                UserWarning,
                stacklevel=2,
            )
        elif "current_model_state" in checkpoint and "averaging_state" in checkpoint:
            log.info("Found current_model_state in the checkpoint. This will be used to initialize the model.")
            average = {"module." + k: v for k, v in checkpoint["state_dict"].items()}
            average.update(checkpoint["averaging_state"])
            self._average_model.load_state_dict(average)
            # the model got "state_dict" (the average) already: give it back its training weights
            pl_module.load_state_dict(checkpoint["current_model_state"])
        else:
            warnings.warn(
                "The checkpoint was not created with WeightAveraging. Both the current and the average model will be "
                "initialized with state_dict.",
                UserWarning,
                stacklevel=2,
            )
            self._average_model.module.load_state_dict(copy.deepcopy(checkpoint["state_dict"]), strict=False)

    # --- the two sets of weights ---------------------------------------------------------
    def _pairs(self, pl_module: TrainModule) -> Any:
        average = self._average_model.module  # callers check that there is one
        return zip(
            itertools.chain(average.parameters(), average.buffers()),
            itertools.chain(pl_module.parameters(), pl_module.buffers()),
        )

    def _swap_models(self, pl_module: TrainModule) -> None:
        """Exchanges the values of the model's weights and the average's."""
        with torch.no_grad():
            for average, current in self._pairs(pl_module):
                kept = average.data.clone()
                average.data.copy_(current.data)
                current.data.copy_(kept)

    def _copy_average_to_current(self, pl_module: TrainModule) -> None:
        """Gives the model the averaged values."""
        with torch.no_grad():
            for average, current in self._pairs(pl_module):
                current.data.copy_(average.data)


class EMAWeightAveraging(WeightAveraging):
    """An exponential moving average of the weights, ``average = decay * average + (1 - decay) * weights``,
    updated every ``update_every_n_steps`` optimizer steps from step ``update_starting_at_step`` on
    (from the first, if None), and at the end of each epoch from ``update_starting_at_epoch`` on
    (never, if None). The rest is ``WeightAveraging``'s."""

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        use_buffers: bool = True,
        decay: float = 0.999,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 <= decay <= 1:
            raise misconfigured(f"EMAWeightAveraging(decay={decay!r}) must be a number in [0, 1], such as 0.999.")
        super().__init__(device=device, use_buffers=use_buffers, **kwargs, avg_fn=get_ema_avg_fn(decay=decay))
        self.update_every_n_steps = positive_int(
            "EMAWeightAveraging(update_every_n_steps)", update_every_n_steps, minimum=0
        )
        self.update_starting_at_step = positive_int(
            "EMAWeightAveraging(update_starting_at_step)", update_starting_at_step, allow_none=True, minimum=0
        )
        self.update_starting_at_epoch = positive_int(
            "EMAWeightAveraging(update_starting_at_epoch)", update_starting_at_epoch, allow_none=True, minimum=0
        )

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        if step_idx is not None:
            started = self.update_starting_at_step is None or step_idx >= self.update_starting_at_step
            if started and self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0:
                return True
        return (
            epoch_idx is not None
            and self.update_starting_at_epoch is not None
            and epoch_idx >= self.update_starting_at_epoch
        )
