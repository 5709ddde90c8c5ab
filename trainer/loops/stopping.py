"""When fit stops: max_epochs, max_steps, stop requests (should_stop, signals), min_epochs/min_steps
and a NaN/Inf loss.

:class:`StopRules` is held by :class:`~trainer.loops.fit.FitLoop` (``loop.stops``): its rules
run at step boundaries that already checked for a reason to stop, at the logging cadence and at
each epoch's end; never on every step.
"""

from __future__ import annotations

import logging
import math
import signal
from typing import TYPE_CHECKING

import torch

from trainer.core.checks import non_finite_loss
from trainer.core.signals import Interrupted

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.loops.run import Run
    from trainer.trainer import Trainer

log = logging.getLogger("trainer")
STOP_SYNC_EVERY = 8  # optimizer steps between cross-rank checks of stop requests (DDP)


class StopRules:
    """One fit's rules for stopping, asked by the fit loop."""

    def __init__(self, trainer: Trainer, run: Run, model: TrainModule) -> None:
        self.trainer, self.run, self.model = trainer, run, model
        self._told_min = False  # the min_epochs/min_steps message is said once

    def check_loss(self, loss: torch.Tensor | None) -> None:
        """At the logging cadence (the loss is read then anyway): stop on a NaN/Inf loss, on every
        rank. A skipped step's loss was judged already (NaNGuard); a step with no loss has none."""
        if loss is None or self.run.step_skipped:
            return
        if self.trainer.strategy.any_rank(not math.isfinite(loss.item())):  # item(): one read, no tensor op
            raise non_finite_loss(self.trainer.state.global_step, self.trainer.state.current_epoch)

    def stopping_now(self) -> bool:
        """True at a step boundary where fit must end. On several processes, stop requests
        (should_stop, SIGTERM/SIGINT) are agreed every few steps, so all ranks stop together."""
        trainer = self.trainer
        state, strategy, signals = trainer.state, trainer.strategy, self.run.signals
        if strategy.world_size > 1:
            if state.global_step % STOP_SYNC_EVERY:
                return self._reached_max_steps()
            flags = torch.tensor([float(signals.received is not None), float(state.should_stop)])
            signalled, stop = (strategy.all_reduce_sum(flags) > 0).tolist()
            state.should_stop = bool(stop)
        else:
            signalled = signals.received is not None
        if signalled:
            self._interrupt()
        return (state.should_stop and self.can_stop_early()) or self._reached_max_steps()

    def _reached_max_steps(self) -> bool:
        trainer = self.trainer
        if trainer.max_steps in (None, -1) or trainer.state.global_step < trainer.max_steps:
            return False
        trainer.state.stop_reason = trainer.state.stop_reason or "max_steps"
        return True

    def _interrupt(self) -> None:
        trainer = self.trainer
        signum = self.run.signals.received or signal.SIGTERM
        trainer.state.stop_reason = "signal"
        checkpoint = trainer.checkpoint_callback
        path = None if checkpoint is None else checkpoint.write_last(trainer, self.model)
        where = f"; last checkpoint: {path}" if path else ""
        raise Interrupted(
            f"Training stopped by {signal.Signals(signum).name} at step {trainer.state.global_step} "
            f"(epoch {trainer.state.current_epoch}){where}. Resume with fit(..., ckpt_path='last').",
            signum,
        )

    def done(self) -> bool:
        t, s = self.trainer, self.trainer.state  # max_epochs and max_steps are -1 (or None: no limit) or >= 1
        return (
            (s.should_stop and self.can_stop_early())
            or s.current_epoch >= _limit(t.max_epochs) or s.global_step >= _limit(t.max_steps)
        )

    def can_stop_early(self) -> bool:
        """A stop request (should_stop: EarlyStopping, Timer, a callback) waits for min_epochs
        completed epochs and min_steps steps, as in Lightning; max_epochs and max_steps do not."""
        t, s = self.trainer, self.trainer.state
        if (t.min_epochs or 0) <= s.current_epoch and (t.min_steps or 0) <= s.global_step:
            return True
        if not self._told_min:
            self._told_min = True
            if t.is_global_zero:
                log.info(  # Lightning's sentence, then where the run is
                    "Trainer was signaled to stop but the required `min_epochs=%r` or `min_steps=%r` has not been met. "
                    "Training will continue... (epoch %d, step %d)",
                    t.min_epochs, t.min_steps, s.current_epoch, s.global_step,
                )
        return False


def _limit(value: int | None) -> float:
    """A loop limit as a number to compare with: Lightning's -1 (and None, and 0 as before) is none."""
    return math.inf if not value or value == -1 else value
