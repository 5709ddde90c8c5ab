"""Which steps the PyTorch profiler records: a ``torch.profiler.schedule`` counted per kind of step.

torch's profiler counts ``profiler.step()`` calls; a fit interleaves training and validation
steps, each of which steps it. ``ScheduleWrapper`` keeps one count per kind of step (training,
validation, test, predict) and asks the user's schedule about the count of the kind that just
ran, so that ``schedule(wait=1, warmup=1, active=3)`` records three training steps and three
validation steps, and each kind stops at its own ``RECORD_AND_SAVE``.
"""

from __future__ import annotations

from typing import Callable

from torch.profiler import ProfilerAction

_KINDS = ("training_step", "validation_step", "test_step", "predict_step")


class ScheduleWrapper:
    """A ``torch.profiler`` schedule that counts each kind of step apart (see the module's docstring)."""

    def __init__(self, schedule: Callable[[int], ProfilerAction]) -> None:
        self._schedule = schedule
        self.reset()

    def reset(self) -> None:
        """A new stage: no step counted, none finished (e.g. after a ``fast_dev_run``)."""
        self._counts = dict.fromkeys(_KINDS, 0)
        self._finished = dict.fromkeys(_KINDS, False)
        self._current_action: str | None = None
        self._prev_schedule_action: ProfilerAction | None = None
        self._start_action_name: str | None = None

    def setup(self, start_action_name: str) -> None:
        self._start_action_name = start_action_name

    def pre_step(self, current_action: str) -> None:
        """The step action that is about to call ``profiler.step()``."""
        self._current_action = current_action

    @property
    def _kind(self) -> str | None:
        action = self._current_action
        return next((k for k in _KINDS if action is not None and action.endswith(k)), None)

    @property
    def is_training(self) -> bool:
        return self._kind == "training_step"

    @property
    def is_validating(self) -> bool:
        return self._kind == "validation_step"

    @property
    def is_testing(self) -> bool:
        return self._kind == "test_step"

    @property
    def is_predicting(self) -> bool:
        return self._kind == "predict_step"

    @property
    def num_step(self) -> int:
        kind = self._kind
        return 0 if kind is None else self._counts[kind]

    @property
    def has_finished(self) -> bool:
        kind = self._kind
        return kind is not None and self._finished[kind]

    def _step(self) -> None:
        kind = self._kind
        if kind is None:
            return
        # validation steps of a fit's sanity check (before the first training step) are not counted
        starts_at_fit = self._start_action_name is not None and self._start_action_name.endswith("on_fit_start")
        if kind == "validation_step" and starts_at_fit and self._counts["training_step"] == 0:
            return
        self._counts[kind] += 1

    def __call__(self, num_step: int) -> ProfilerAction:
        # torch's own count is ignored: each kind of step keeps its own
        if self._current_action is None or self.has_finished:
            return ProfilerAction.NONE
        self._step()
        action = self._schedule(max(self.num_step, 0))
        if self._prev_schedule_action == ProfilerAction.RECORD and action == ProfilerAction.WARMUP:
            # a validation that starts while training records: torch refuses RECORD -> WARMUP
            action = ProfilerAction.RECORD
        if action == ProfilerAction.RECORD_AND_SAVE and self._kind is not None:
            self._finished[self._kind] = True
        self._prev_schedule_action = action
        return action
