"""NaNGuard: on a NaN or infinite training loss, raise with the step number or skip the step."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from trainer.core.checks import one_of

from .base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

log = logging.getLogger("trainer")
_WARN_FIRST = 5  # skipped steps that get a log line each; the rest are only counted


class NaNGuard(Callback):
    """Checks every micro-batch's loss before its backward and, before each optimizer step:

    - ``action="raise"``: raises ``FloatingPointError`` naming the step (numbered as in
      TensorBoard: the ``global_step`` the update would have made), the epoch and the ranks;
    - ``action="skip"``: drops the update (the gradients are zeroed instead), keeps training,
      and appends the step to ``skipped_steps``. The backward of the bad loss still runs;
      skipping the update is what keeps the weights finite.

    Under DDP the ranks agree (one small all-reduce per optimizer step), so a NaN on any rank
    makes every rank raise or skip the same step. The check reads one flag off the device
    per optimizer step. Without this callback the Trainer still raises on a non-finite loss,
    but only at the logging cadence (``log_every_n_steps``).

    Example: ``NaNGuard(action="skip")``.
    """

    def __init__(self, action: str = "raise") -> None:
        self.action = one_of("NaNGuard(action)", action, ("raise", "skip"))
        self.skipped_steps: list[int] = []
        self._bad: torch.Tensor | None = None  # any non-finite loss since the last step, on the device

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if stage == "fit":
            self.skipped_steps = []
            self._bad = None

    def on_before_backward(self, trainer: Trainer, pl_module: TrainModule, loss: torch.Tensor) -> None:
        bad = ~torch.isfinite(loss.detach())  # stays on the device: no sync per micro-batch
        self._bad = bad if self._bad is None else self._bad | bad

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: TrainModule, optimizer: torch.optim.Optimizer
    ) -> None:
        bad, self._bad = self._bad, None
        if bad is None:
            return
        # One slot per rank: after the sum every rank knows which ranks saw a bad loss.
        flags = torch.zeros(trainer.world_size)
        flags[trainer.strategy.global_rank] = float(bad)
        if trainer.world_size > 1:
            flags = trainer.strategy.all_reduce_sum(flags)
        ranks = [r for r, f in enumerate(flags.tolist()) if f > 0]
        if not ranks:
            return
        step = trainer.global_step + 1
        where = f"at step {step} (epoch {trainer.current_epoch})"
        if trainer.world_size > 1:
            where += f" on rank(s) {ranks}"
        if self.action == "raise":
            raise FloatingPointError(
                f"The training loss is not finite (nan or inf) {where}. Lower the learning rate, clip "
                "gradients (gradient_clip_val=...), or use NaNGuard(action='skip') to skip such steps."
            )
        trainer.skip_optimizer_step()
        self.skipped_steps.append(step)
        if trainer.is_global_zero and len(self.skipped_steps) <= _WARN_FIRST:
            further = " Further skips are only counted in NaNGuard.skipped_steps."
            more = "" if len(self.skipped_steps) < _WARN_FIRST else further
            log.warning("NaNGuard: skipped the optimizer step: the loss was not finite %s.%s", where, more)

    def state_dict(self) -> dict[str, Any]:
        return {"skipped_steps": list(self.skipped_steps)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped_steps = list(state_dict.get("skipped_steps", []))
