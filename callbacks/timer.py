"""Timer: a wall-clock budget for fit."""

from __future__ import annotations

import logging
import re
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from trainer.core.checks import one_of
from trainer.core.exceptions import misconfigured

from .base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

log = logging.getLogger("trainer")
_DHMS = re.compile(r"^(\d+):(\d+):(\d+):(\d+)$")


class Timer(Callback):
    """Stop fit once it has run for ``duration``: seconds, a ``datetime.timedelta``, a dict of
    its arguments (``dict(hours=12)``), or a ``"DD:HH:MM:SS"`` string (``"00:12:00:00"`` is 12
    hours); None (the default): no budget, the Timer only measures. ``Trainer(max_time=...)``
    adds one. As Lightning's, it also measures each stage: ``time_elapsed("validate")``,
    ``start_time("test")``, ``end_time("train")``, ``time_remaining()``.

    The budget's clock is the ``train`` stage's: from ``on_train_start`` to ``on_train_end``,
    validation and checkpointing included. With ``interval="step"`` fit stops at the next step
    boundary past the budget; with ``"epoch"`` only at an epoch's end. The time used rides in
    checkpoints, so a resumed run spends what is left of the budget rather than a new one.

    Under DDP, global rank 0's clock decides; the Trainer's stop agreement (every few steps
    and at each epoch's end) brings every rank to the same step, so the Timer adds no
    collective of its own.

    Example: ``Timer("00:01:30:00")`` (an hour and a half), ``Timer(600)``.
    """

    def __init__(self, duration: float | timedelta | str | dict[str, int] | None = None, interval: str = "step",
                 verbose: bool = True) -> None:
        self._duration = None if duration is None else _seconds(duration)
        self.interval = one_of(
            "Timer(interval)", interval, ("step", "epoch"),
            lightning=f"Unsupported parameter value `Timer(interval={interval})`. Possible values are: step, epoch.",
        )
        self._verbose = verbose
        self._start: dict[str, float | None] = dict.fromkeys(_STAGES)
        self._end: dict[str, float | None] = dict.fromkeys(_STAGES)
        self._offset = 0.0  # the train stage's seconds from earlier runs (restored from a checkpoint)

    @property
    def duration(self) -> float | None:
        """The budget in seconds (None: no budget)."""
        return self._duration

    def start_time(self, stage: str = "train") -> float | None:
        """When ``stage`` ("train", "validate" or "test") last started (``time.monotonic()``), or None."""
        return self._start[str(stage)]

    def end_time(self, stage: str = "train") -> float | None:
        return self._end[str(stage)]

    def time_elapsed(self, stage: str = "train") -> float:
        """Seconds spent in ``stage``; for "train", of the budget used so far (earlier runs' included)."""
        start, end = self._start[str(stage)], self._end[str(stage)]
        offset = self._offset if str(stage) == "train" else 0.0
        if start is None:
            return offset
        return offset + (time.monotonic() if end is None else end) - start

    def time_remaining(self, stage: str = "train") -> float | None:
        if self._duration is None:
            return None
        return self._duration - self.time_elapsed(stage)

    # --- hooks -------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if stage == "fit":
            self._offset = 0.0  # a checkpoint being resumed loads its state after this

    def _begin(self, stage: str) -> None:
        self._start[stage], self._end[stage] = time.monotonic(), None

    def _finish(self, stage: str) -> None:
        self._end[stage] = time.monotonic()

    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._begin("train")

    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._finish("train")

    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._begin("validate")

    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._finish("validate")

    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._begin("test")

    def on_test_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._finish("test")

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._check(trainer)  # Lightning's: a budget already spent (a resumed timer, duration 0) trains nothing

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.interval == "step":
            self._check(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._check(trainer)

    def _check(self, trainer: Trainer) -> None:
        if self._duration is None or not trainer.is_global_zero or trainer.should_stop:
            return
        if self.time_elapsed() < self._duration:
            return
        trainer.should_stop = True
        trainer.state.stop_reason = "timer"
        if self._verbose:
            log.info(
                "Time limit reached. Elapsed time is %s. Signaling Trainer to stop. (The budget of %s is used up; "
                "epoch %d, step %d.)", timedelta(seconds=int(self.time_elapsed())),
                timedelta(seconds=round(self._duration)), trainer.current_epoch, trainer.global_step,
            )

    # --- state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {stage: self.time_elapsed(stage) for stage in _STAGES}}  # Lightning's layout

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        elapsed = state_dict.get("time_elapsed", 0.0)  # Lightning's per-stage dict, or this project's earlier float
        self._offset = float(elapsed.get("train", 0.0) if isinstance(elapsed, dict) else elapsed)
        if self._start["train"] is not None and self._end["train"] is None:
            self._start["train"] = time.monotonic()


_STAGES = ("train", "sanity_check", "validate", "test", "predict")  # Lightning's RunningStage values


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
        raise misconfigured(
            f"Timer(duration={duration!r}): give seconds, a datetime.timedelta, a dict such as dict(hours=12), "
            "or a 'DD:HH:MM:SS' string such as '00:12:00:00' (12 hours).",
            f"`Timer(duration={duration!r})` is not a valid duration. Expected a string in the format DD:HH:MM:SS."
            if isinstance(duration, str) else "",
        )
    if not seconds >= 0 or seconds == float("inf"):
        raise misconfigured(f"Timer(duration={duration!r}) must be a finite time >= 0.")
    return seconds
