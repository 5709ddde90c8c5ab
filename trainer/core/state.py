"""The loop's counters and where a run is, kept on one object that users read and never write.

``TrainerFn``, ``TrainerStatus`` and ``RunningStage`` are Lightning's (``lightning.pytorch.trainer.states``):
``trainer.state.fn`` is the entry point that runs or ran (``fit``, ``validate``, ...),
``state.status`` whether it is running, finished or was interrupted, and ``state.stage`` what
runs inside it right now (training, the sanity check, a validation run, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class _StrEnum(str, Enum):
    """A string enum that equals its value, in any case: ``TrainerFn.FITTING == "fit"``."""

    def __eq__(self, other: object) -> bool:
        other = other.value if isinstance(other, Enum) else other
        return isinstance(other, str) and self.value.lower() == other.lower()

    def __ne__(self, other: object) -> bool:  # str's own __ne__ would compare case-sensitively
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self.value.lower())

    def __str__(self) -> str:
        return self.value


class TrainerStatus(_StrEnum):
    """Whether the Trainer's last entry point is running, finished or was interrupted."""

    INITIALIZING = "initializing"  # built, nothing run yet
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"  # ended by an exception (a stop signal, Ctrl+C, an error)

    @property
    def stopped(self) -> bool:
        return self in (TrainerStatus.FINISHED, TrainerStatus.INTERRUPTED)


class TrainerFn(_StrEnum):
    """The entry point: ``trainer.fit``, ``validate``, ``test`` or ``predict``."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(_StrEnum):
    """What runs inside the entry point: fit runs TRAINING, SANITY_CHECKING and VALIDATING in turn;
    validate VALIDATING, test TESTING, predict PREDICTING."""

    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"

    @property
    def evaluating(self) -> bool:
        return self in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)

    @property
    def dataloader_prefix(self) -> str:
        """The name its loaders have on a module or DataModule: ``val``, ``train``, ``test``, ``predict``."""
        return "val" if self in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING) else self.value


@dataclass
class TrainerState:
    """Where the run is. The Trainer owns it; callbacks and users only read it.

    ``status``, ``fn`` and ``stage`` are Lightning's (``stage`` is None between entry points and
    ``fn`` keeps the last one's). ``global_step`` counts optimizer steps: under manual
    optimization every ``optimizer.step()``, so two optimizers stepping once a batch make two
    (Lightning's). ``batches_stepped`` is Lightning's ``_batches_that_stepped`` where it differs
    from ``global_step``: under manual optimization, the training batches run, which is the step
    the loggers see and the one ``log_every_n_steps`` counts (None: ``global_step``, as under
    automatic optimization). ``batch_in_epoch`` counts training batches already consumed in
    ``current_epoch``; a checkpoint taken mid-epoch stores it, so that a resumed run skips
    exactly those batches.
    """

    status: TrainerStatus = TrainerStatus.INITIALIZING
    fn: TrainerFn | None = None
    stage: RunningStage | None = None
    global_step: int = 0
    current_epoch: int = 0
    batches_stepped: int | None = None
    batch_in_epoch: int = 0
    should_stop: bool = False
    # Why the run stopped early, if it did: "early_stopping", "timer", "signal", ...
    stop_reason: str | None = None

    @property
    def log_step(self) -> int:
        """The step the loggers write and ``log_every_n_steps`` counts (Lightning's ``_batches_that_stepped``)."""
        return self.global_step if self.batches_stepped is None else self.batches_stepped

    @property
    def finished(self) -> bool:
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        return self.status.stopped
