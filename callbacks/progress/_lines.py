"""The tqdm bar's words: why fit stopped, the time left, durations as its lines show them, and the line itself."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer import Trainer


def _stop_reason(trainer: Trainer) -> str | None:
    """Why fit ends at this epoch's end ("max_steps=60", "early_stopping", "timer", ...), or None
    when it goes on or ends at max_epochs."""
    reason = trainer.state.stop_reason
    if reason is not None and reason != "max_steps":  # a callback's reason, even if max_steps was also reached
        return reason
    if trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps:
        return f"max_steps={trainer.max_steps}"
    return "should_stop" if trainer.should_stop else None  # set by the user's code, with no reason given


def _time_left(trainer: Trainer, batches_done: int, rate: float) -> str:
    """'; about 45 s per epoch, 40 s left in this one' at ``rate`` batches/s, when the epoch's
    length is known; the time left is to max_steps when that ends the epoch first."""
    total = trainer.num_training_batches
    if total == float("inf") or rate <= 0:
        return ""
    left, until = total - batches_done, "in this one"
    if trainer.max_steps not in (None, -1):
        accumulate = trainer.accumulate_grad_batches  # the current group's micro-batches count towards its step
        to_stop = (trainer.max_steps - trainer.global_step) * accumulate - batches_done % accumulate
        if to_stop < left:
            left, until = max(to_stop, 0), f"to max_steps={trainer.max_steps}"
    return f"; about {_duration(total / rate, whole=True)} per epoch, {_duration(left / rate, whole=True)} left {until}"


def _line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _duration(seconds: float, whole: bool = False) -> str:
    """'42 ms' under a second, '12.3 s' ('12 s' if ``whole``) under a minute, then '4 min 05 s'."""
    if round(seconds * 1e3) < 1000:  # compared as shown: 0.9996 s is "1.0 s", not "1000 ms"
        return f"{round(seconds * 1e3)} ms"
    if round(seconds, 1) < 60:
        return f"{round(seconds)} s" if whole else f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"
