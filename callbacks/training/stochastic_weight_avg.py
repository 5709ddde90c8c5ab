"""StochasticWeightAveraging: average the weights of the last epochs (torch.optim.swa_utils)."""

from __future__ import annotations

import copy
import logging
import os
import warnings
from typing import TYPE_CHECKING, Any

import torch

from trainer.core.checks import one_of, positive_int
from trainer.core.exceptions import misconfigured

from ..base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

log = logging.getLogger("trainer")


class StochasticWeightAveraging(Callback):
    """From epoch ``swa_epoch_start`` on (an int, or a fraction of ``max_epochs``), the
    learning rate anneals to ``swa_lrs`` over ``annealing_epochs`` epochs (``SWALR``, in place
    of the model's schedulers), and each epoch's end adds the weights to a running average
    (``AveragedModel``, kept on ``device``). When fit ends, the model gets the averaged
    weights, BatchNorm statistics are recomputed with one pass over the training data
    (``update_bn``, fed each batch's first element), and ``last.ckpt`` is written again with
    them. The average, its count and the SWALR state ride in checkpoints: a run resumed
    mid-SWA carries on exactly. One optimizer, automatic optimization.
    """

    def __init__(
        self,
        swa_lrs: float | list[float],
        swa_epoch_start: int | float = 0.8,
        annealing_epochs: int = 10,
        annealing_strategy: str = "cos",
        avg_fn: Any = None,
        device: torch.device | str | None = "cpu",
    ) -> None:
        lrs = swa_lrs if isinstance(swa_lrs, (list, tuple)) else [swa_lrs]
        if not lrs or any(not isinstance(x, float) or x <= 0 for x in lrs):  # Lightning's: floats only
            raise misconfigured(
                f"StochasticWeightAveraging(swa_lrs={swa_lrs!r}) must be a positive float, "
                "or a list of them (one per param group).",
                "The `swa_lrs` should a positive float, or a list of positive floats",
            )
        self._swa_lrs = swa_lrs
        ok_int = isinstance(swa_epoch_start, int) and not isinstance(swa_epoch_start, bool) and swa_epoch_start >= 1
        ok_float = isinstance(swa_epoch_start, float) and 0 < swa_epoch_start <= 1
        if not (ok_int or ok_float):
            raise misconfigured(
                f"StochasticWeightAveraging(swa_epoch_start={swa_epoch_start!r}) must be an int >= 1 (an epoch) "
                "or a float in (0, 1] (a fraction of max_epochs).",
                "swa_epoch_start should be a >0 integer or a float between 0 and 1.",
            )
        self._swa_epoch_start = swa_epoch_start
        self._annealing_epochs = positive_int("StochasticWeightAveraging(annealing_epochs)", annealing_epochs)
        self._annealing_strategy = one_of(
            "StochasticWeightAveraging(annealing_strategy)", annealing_strategy, ("cos", "linear")
        )
        self._avg_fn = avg_fn
        self._device = device
        self._average_model: torch.optim.swa_utils.AveragedModel | None = None
        self._scheduler: torch.optim.swa_utils.SWALR | None = None
        self._loaded: dict[str, Any] | None = None
        self.swa_start = self.swa_end = 0

    @property
    def swa_lrs(self) -> float | list[float]:
        return self._swa_lrs

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.max_epochs in (None, -1):
            raise ValueError("StochasticWeightAveraging needs Trainer(max_epochs=...): it averages the last epochs.")
        start = self._swa_epoch_start
        self.swa_start = start - 1 if isinstance(start, int) else int(trainer.max_epochs * start)  # an epoch index
        self.swa_end = trainer.max_epochs - 1
        self._average_model = torch.optim.swa_utils.AveragedModel(pl_module, device=self._device, avg_fn=self._avg_fn)
        self._scheduler, self._loaded = None, None

    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if len(trainer.optimizers) != 1 or not getattr(pl_module, "automatic_optimization", True):
            raise ValueError("StochasticWeightAveraging works with one optimizer under automatic optimization.")
        groups = len(trainer.optimizer.param_groups)
        if isinstance(self._swa_lrs, (list, tuple)) and len(self._swa_lrs) != groups:
            raise ValueError(
                f"StochasticWeightAveraging(swa_lrs={self._swa_lrs!r}) has {len(self._swa_lrs)} values "
                f"and the optimizer has {groups} param group(s): pass one float, or one per group."
            )
        if self._loaded is not None:  # resumed: the average so far
            self._average_model.load_state_dict(self._loaded["average_model"])

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        resumed = self._loaded is not None and self._loaded.get("scheduler") is not None
        if self._scheduler is None and (trainer.current_epoch == self.swa_start or resumed):
            optimizer = trainer.optimizer
            before = [g["lr"] for g in optimizer.param_groups]
            given = self._swa_lrs
            lrs = given if isinstance(given, (list, tuple)) else [given] * len(optimizer.param_groups)
            for group, lr in zip(optimizer.param_groups, lrs):  # Lightning's: each group's initial_lr is its SWA lr
                group["initial_lr"] = lr
            self._scheduler = torch.optim.swa_utils.SWALR(
                optimizer, swa_lr=self._swa_lrs, anneal_epochs=self._annealing_epochs,
                anneal_strategy=self._annealing_strategy,
                last_epoch=trainer.max_epochs if self._annealing_strategy == "cos" else -1,
            )
            for config in trainer.lr_scheduler_configs[:1]:  # the model's scheduler it replaces, as Lightning says
                if config.interval != "epoch" or config.frequency != 1:
                    warnings.warn(f"SWA is currently only supported every epoch. Found {config}",
                                  UserWarning, stacklevel=2)
                if trainer.is_global_zero:
                    log.info("Swapping scheduler `%s` for `SWALR`", type(config.scheduler).__name__)
            if resumed:  # SWALR's first step at creation happened in the run that saved it
                for group, lr in zip(optimizer.param_groups, before):
                    group["lr"] = lr
                self._scheduler.load_state_dict(self._loaded["scheduler"])
            # SWALR replaces the model's schedulers, which checkpoints then leave out: the lists the Trainer
            # steps and hands to the module's lr_schedulers(), changed in place (Lightning's: the strategy's list).
            trainer.lr_scheduler_configs.clear()
            trainer.lr_schedulers[:] = [self._scheduler]

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self.swa_start <= trainer.current_epoch <= self.swa_end and self._average_model is not None:
            self._average_model.update_parameters(pl_module)
        if self._scheduler is not None:
            self._scheduler.step()

    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        average = self._average_model
        if average is None or int(average.n_averaged) == 0:
            return
        with torch.no_grad():
            for mine, averaged in zip(pl_module.parameters(), average.module.parameters()):
                mine.copy_(averaged.to(mine.device))
        loader = trainer.train_dataloader
        if loader is not None and any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in pl_module.modules()
        ):
            torch.optim.swa_utils.update_bn(loader, pl_module, device=pl_module.device)
        checkpoint = trainer.checkpoint_callback
        if checkpoint is not None and getattr(checkpoint, "dirpath", None):
            checkpoint.wait_for_saves(trainer)
            path = os.path.join(checkpoint.dirpath, "last.ckpt")
            trainer.save_checkpoint(path)  # the averaged weights, in the run's final file
            checkpoint.last_model_path = path

    # --- state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._average_model is None:
            return {}
        return {
            "average_model": copy.deepcopy(self._average_model.state_dict()),
            "scheduler": None if self._scheduler is None else self._scheduler.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._loaded = state_dict or None
