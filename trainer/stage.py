"""One stage (fit, validate, test or predict) inside each process, and the hand-off back.

``Trainer.fit`` and friends call ``strategy.launch(run_stage, trainer, stage, ...)``. In the
caller's process (single, dp, or a rank that torchrun started) that is a plain call. Under a
spawning strategy it runs in every worker, and global rank 0 returns a picklable summary that
:func:`absorb` copies into the caller's model and Trainer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._hooks import Hooks
from ._resume import resolve_path
from ._run_dir import run_dir
from .evaluation_loop import evaluation_loop
from .fit_loop import FitLoop
from .precision import Precision
from .seed import deterministic_algorithms, seed_everything
from .state import TrainerState

if TYPE_CHECKING:
    from .module import TrainModule
    from .trainer import Trainer


def run_stage(trainer: Trainer, stage: str, model: TrainModule, loader: Any, val_loader: Any, ckpt_path: Any) -> Any:
    """Set the process up, run ``stage``, tear down; returns what the caller gets back."""
    strategy = trainer.strategy
    strategy.setup_environment()
    try:
        with deterministic_algorithms(trainer.deterministic):  # the caller's settings come back after
            output = _run(trainer, stage, model, loader, val_loader, ckpt_path)
    finally:
        trainer.state.stage = "idle"
        strategy.teardown()
    if not strategy.spawned:
        return output
    # A spawned worker: rank 0 sends back what the caller's model and trainer need.
    if not strategy.is_global_zero:
        return None
    return {
        "output": output,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "state": vars(trainer.state),
        "callback_metrics": trainer.callback_metrics,
        "logged_metrics": trainer.logged_metrics,
        "run_dir": trainer.run_dir,
        "callbacks": [cb.state_dict() for cb in trainer.callbacks],
    }


def absorb(trainer: Trainer, model: TrainModule, result: Any) -> Any:
    """In the caller, after a spawned run: copy rank 0's results into ``model`` and ``trainer``."""
    if not trainer.strategy.spawned:
        return result
    model.load_state_dict(result["model"])
    trainer.state = TrainerState(**result["state"])
    trainer.callback_metrics, trainer.logged_metrics = result["callback_metrics"], result["logged_metrics"]
    trainer.run_dir = result["run_dir"]
    for cb, state in zip(trainer.callbacks, result["callbacks"]):
        cb.load_state_dict(state)
    return result["output"]


def _run(trainer: Trainer, stage: str, model: TrainModule, loader: Any, val_loader: Any, ckpt_path: Any) -> Any:
    strategy = trainer.strategy
    if trainer.seed is not None:
        seed_everything((trainer.seed + strategy.global_rank) % 2**32)
    trainer._precision = strategy.precision = Precision(trainer.precision, strategy.root_device)
    trainer._module = model
    model._trainer = trainer
    strategy.setup_module(model)
    trainer._hooks = hooks = Hooks(trainer.callbacks, model)
    if stage == "fit":  # a new run: nothing of an earlier fit's (counters, monitors) carries over
        trainer.state = TrainerState(stage="fit")  # from 0, or from the checkpoint's step
        trainer.callback_metrics, trainer.logged_metrics, trainer.train_epoch_metrics = {}, {}, {}
        trainer.prog_bar_names, trainer.samples_seen, trainer.grad_norm = set(), 0, None
    else:
        trainer.state.stage = stage  # evaluation never moves the training counters
    ckpt_path = resolve_path(trainer, ckpt_path)
    # predict logs nothing, so it gets no run folder; evaluation after fit writes into fit's.
    if trainer.log_dir is not None and stage != "predict" and (trainer.run_dir is None or stage == "fit"):
        trainer.run_dir = strategy.broadcast_object(
            run_dir(trainer.log_dir, trainer.name, ckpt_path) if strategy.is_global_zero else None
        )
    hooks.call("setup", trainer, model, stage)
    try:
        if stage == "fit":
            FitLoop(trainer, model, loader, val_loader, ckpt_path).run()
            return None
        loader = strategy.process_dataloader(loader, stage)
        if stage == "predict":
            return strategy.gather_predictions(evaluation_loop(trainer, "predict", loader, trainer.limit_predict_batches))
        if stage == "validate":
            evaluation_loop(trainer, "validation", loader, trainer.limit_val_batches)
        else:
            evaluation_loop(trainer, "test", loader, trainer.limit_test_batches)
        return dict(trainer.logged_metrics)
    except BaseException as err:
        for fn in hooks.on_exception:
            fn(trainer, model, err)
        raise
    finally:
        hooks.call("teardown", trainer, model, stage)
