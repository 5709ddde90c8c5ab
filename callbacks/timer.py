"""Timer: a wall-clock budget for fit."""

from __future__ import annotations

import logging
import re
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from trainer.core.checks import one_of

from .base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

log = logging.getLogger("trainer")
_DHMS = re.compile(r"^(\d+):(\d+):(\d+):(\d+)$")


class Timer(Callback):
    """Stop fit once it has run for ``duration``: seconds, a ``datetime.timedelta``, a dict of
    its arguments (``dict(hours=12)``), or a ``"DD:HH:MM:SS"`` string (``"00:12:00:00"`` is 12
    hours). ``Trainer(max_time=...)`` adds one.

    The clock starts at ``on_train_start`` and includes validation and checkpointing. With
    ``interval="step"`` fit stops at the next step boundary past the budget; with
    ``"epoch"`` only at an epoch's end. The time used rides in checkpoints, so a resumed
    run spends what is left of the budget rather than a new one.

    Under DDP, global rank 0's clock decides; the Trainer's stop agreement (every few steps
    and at each epoch's end) brings every rank to the same step, so the Timer adds no
    collective of its own.

    Example: ``Timer("00:01:30:00")`` (an hour and a half), ``Timer(600)``.
    """

    def __init__(self, duration: float | timedelta | str, interval: str = "step") -> None:
        self.duration = _seconds(duration)
        self.interval = one_of("Timer(interval)", interval, ("step", "epoch"))
        self._offset = 0.0  # seconds used by earlier runs (restored from a checkpoint)
        self._start: float | None = None

    def time_elapsed(self) -> float:
        """Seconds of the budget used so far."""
        running = 0.0 if self._start is None else time.monotonic() - self._start
        return self._offset + running

    def time_remaining(self) -> float:
        return max(self.duration - self.time_elapsed(), 0.0)

    # --- hooks -------------------------------------------------------------------------
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if stage == "fit":
            self._offset, self._start = 0.0, None  # a checkpoint being resumed loads its state after this

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._start = time.monotonic()

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.interval == "step":
            self._check(trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._check(trainer)

    def on_fit_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._offset, self._start = self.time_elapsed(), None  # stop the clock

    def _check(self, trainer: Trainer) -> None:
        if not trainer.is_global_zero or trainer.should_stop or self.time_elapsed() < self.duration:
            return
        trainer.should_stop = True
        trainer.state.stop_reason = "timer"
        log.info(
            "Timer: the budget of %s is used up; stopping at epoch %d, step %d.",
            timedelta(seconds=round(self.duration)), trainer.current_epoch, trainer.global_step,
        )

    # --- state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": self.time_elapsed()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset = float(state_dict.get("time_elapsed", 0.0))
        if self._start is not None:
            self._start = time.monotonic()


def _seconds(duration: Any) -> float:
    if isinstance(duration, dict):  # datetime.timedelta's arguments, as Lightning's Timer takes them
        try:
            duration = timedelta(**duration)
        except TypeError:
            raise ValueError(
                f"Timer(duration={duration!r}): a dict holds datetime.timedelta's arguments, e.g. dict(hours=12)."
            ) from None
    if isinstance(duration, timedelta):
        seconds = duration.total_seconds()
    elif isinstance(duration, (int, float)) and not isinstance(duration, bool):
        seconds = float(duration)
    elif isinstance(duration, str) and _DHMS.match(duration.strip()):
        d, h, m, s = (int(x) for x in _DHMS.match(duration.strip()).groups())
        seconds = timedelta(days=d, hours=h, minutes=m, seconds=s).total_seconds()
    else:
        raise ValueError(
            f"Timer(duration={duration!r}): give seconds, a datetime.timedelta, a dict such as dict(hours=12), or a 'DD:HH:MM:SS' "
            "string such as '00:12:00:00' (12 hours)."
        )
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"Timer(duration={duration!r}) must be a finite time > 0.")
    return seconds
