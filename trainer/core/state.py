"""The loop's counters, kept on one object that users read and never write."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainerState:
    """Where the run is. The Trainer owns it; callbacks and users only read it.

    ``global_step`` counts optimizer steps. ``batch_in_epoch`` counts training batches
    already consumed in ``current_epoch``; a checkpoint taken mid-epoch stores it, so
    that a resumed run skips exactly those batches.
    """

    stage: str = "idle"  # "fit", "validate", "test", "predict" or "idle"
    global_step: int = 0
    current_epoch: int = 0
    batch_in_epoch: int = 0
    should_stop: bool = False
    # Why the run stopped early, if it did: "early_stopping", "timer", "signal", ...
    stop_reason: str | None = None
    # The last entry point's: "initializing", "running", "finished" or "interrupted" (Lightning's TrainerStatus)
    status: str = "initializing"

    @property
    def finished(self) -> bool:
        """The last ``fit``/``validate``/``test``/``predict`` ran to its end (Lightning's ``state.finished``)."""
        return self.status == "finished"

    @property
    def stopped(self) -> bool:
        """It ended, whether finished or interrupted by an error or a signal."""
        return self.status in ("finished", "interrupted")
