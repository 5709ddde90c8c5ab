"""One stage (fit, validate, test or predict) inside each process, and the hand-off back.

``Trainer.fit`` and friends call ``strategy.launch(run_stage, trainer, stage, ...)``. In the
caller's process (single, dp, or a rank that torchrun started) that is a plain call. Under a
spawning strategy it runs in every worker, and global rank 0 returns a picklable summary that
``run.absorb`` copies into the caller's model and Trainer. In between, each stage's entry point
runs: ``fit.fit_stage``, ``evaluation.validate_stage`` and ``test_stage``, ``prediction.predict_stage``.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from trainer.core.seed import deterministic_algorithms
from trainer.loops.evaluation import test_stage, validate_stage
from trainer.loops.fit import fit_stage
from trainer.checkpoint.background_save import wait_for_writes
from trainer.loops.prediction import predict_stage
from trainer.loops.run import StageData, report
from trainer.checkpoint.folder_lock import unlock_checkpoint_folders
from trainer.core.state import TrainerStatus

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


# Each stage's work in one process, one function each (its file says what it does).
ENTRY_POINTS: dict[str, Callable[..., Any]] = {
    "fit": fit_stage, "validate": validate_stage, "test": test_stage, "predict": predict_stage,
}


def run_stage(trainer: Trainer, stage: str, model: TrainModule, data: StageData, ckpt_path: Any) -> Any:
    """Set the process up, run ``stage``'s entry point, tear down; returns what the caller gets back."""
    strategy = trainer.strategy
    strategy.setup_environment()
    try:
        # The caller's settings come back after: deterministic kernels, cuDNN autotuning, anomaly detection.
        with deterministic_algorithms(trainer.deterministic), torch_flags(trainer.benchmark, trainer.detect_anomaly):
            output = ENTRY_POINTS[stage](trainer, model, data, ckpt_path)
        trainer.state.status = TrainerStatus.FINISHED
        # For the caller's model: gathered on every rank while the group is up (fsdp shards them).
        weights = strategy.module_state_dict() if strategy.spawned else None
    except BaseException:
        # A checkpoint handed to the writer thread before the failure is complete and due: it is on
        # disk (or has failed) before the error reaches the caller, as before on_train_end.
        wait_for_writes()
        raise
    finally:
        trainer.state.stage = None  # fn stays: the entry point that ran last, as in Lightning
        unlock_checkpoint_folders(trainer)  # however the stage ended, its checkpoint folders are free
        strategy.teardown()
    if not strategy.spawned:
        return output
    # A spawned worker: rank 0 sends back what the caller's model and trainer need.
    if not strategy.is_global_zero:
        return None
    return report(trainer, output, weights)


@contextlib.contextmanager
def torch_flags(benchmark: bool | None, detect_anomaly: bool) -> Iterator[None]:
    """``Trainer(benchmark=...)`` (cuDNN autotuning; None leaves the process's setting) and
    ``detect_anomaly`` (autograd's anomaly mode) for the stage; the previous values come back after."""
    previous = torch.backends.cudnn.benchmark
    if benchmark is not None:
        torch.backends.cudnn.benchmark = benchmark
    try:
        with torch.autograd.set_detect_anomaly(detect_anomaly) if detect_anomaly else contextlib.nullcontext():
            yield
    finally:
        torch.backends.cudnn.benchmark = previous
