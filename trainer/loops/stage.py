"""One stage (fit, validate, test or predict) inside each process, and the hand-off back.

``Trainer.fit`` and friends call ``strategy.launch(run_stage, trainer, stage, ...)``. In the
caller's process (single, dp, or a rank that torchrun started) that is a plain call. Under a
spawning strategy it runs in every worker, and global rank 0 returns a picklable summary that
:func:`absorb` copies into the caller's model and Trainer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple

from trainer.loops.hooks import Hooks
from trainer.checkpoint.resume import evaluate_checkpoint, resolve_path
from trainer.checkpoint.run_dir import run_dir
from trainer.loops.evaluation import evaluation_loop
from trainer.data.fetch import Fetching
from trainer.loops.fit import FitLoop
from trainer.data.loaders import Loaders, check_train_loader, overfit_loaders, prepare, stage_loader
from trainer.loops.precision import Precision
from trainer.loops.prediction import PredictLoop
from trainer.core.seed import deterministic_algorithms, seed_everything
from trainer.core.state import TrainerState
from trainer.checkpoint.state_dicts import load_plain_state_dict

log = logging.getLogger("trainer")

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


class StageData(NamedTuple):
    """What a stage's data comes from, as the caller passed it; resolved in each process."""

    loader: Any  # fit's train_dataloaders, or evaluation's dataloaders
    val_loader: Any  # fit's val_dataloaders
    datamodule: Any
    return_predictions: bool = True  # predict's: keep and return the outputs


def run_stage(trainer: Trainer, stage: str, model: TrainModule, data: StageData, ckpt_path: Any) -> Any:
    """Set the process up, run ``stage``, tear down; returns what the caller gets back."""
    strategy = trainer.strategy
    strategy.setup_environment()
    try:
        with deterministic_algorithms(trainer.deterministic):  # the caller's settings come back after
            output = _run(trainer, stage, model, data, ckpt_path)
        # For the caller's model: gathered on every rank while the group is up (fsdp shards them).
        weights = strategy.module_state_dict() if strategy.spawned else None
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
        "model": {k: v.detach().cpu() for k, v in weights.items()},
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
    on_meta = any(p.is_meta for p in model.parameters())  # built on the meta device: take the tensors
    load_plain_state_dict(model, result["model"], assign=on_meta)  # plain keys, also into compiled submodules
    trainer.state = TrainerState(**result["state"])
    trainer.callback_metrics, trainer.logged_metrics = result["callback_metrics"], result["logged_metrics"]
    trainer.run_dir = result["run_dir"]
    for cb, state in zip(trainer.callbacks, result["callbacks"]):
        cb.load_state_dict(state)
    return result["output"]


def _run(trainer: Trainer, stage: str, model: TrainModule, data: StageData, ckpt_path: Any) -> Any:
    strategy, datamodule = trainer.strategy, data.datamodule
    if trainer.seed is not None:
        seed_everything((trainer.seed + strategy.global_rank) % 2**32)
    trainer._precision = strategy.precision = Precision(trainer.precision, strategy.root_device)
    trainer._module = model
    model._trainer = trainer
    strategy.setup_module(model)
    if trainer.compile is not None:  # lazily: the first step compiles (the bar says so)
        strategy.compile(trainer.compile)
    trainer._hooks = hooks = Hooks(trainer.callbacks, model)
    if stage == "fit":  # a new run: nothing of an earlier fit's (counters, monitors) carries over
        trainer.state = TrainerState(stage="fit")  # from 0, or from the checkpoint's step
        trainer.callback_metrics, trainer.logged_metrics, trainer.train_epoch_metrics = {}, {}, {}
        trainer.prog_bar_names, trainer.samples_seen, trainer.grad_norm = set(), 0, None
        ckpt_path = resolve_path(trainer, ckpt_path)
    else:
        trainer.state.stage = stage  # evaluation never moves the training counters
    # predict logs nothing, so it gets no run folder; evaluation after fit writes into fit's.
    if trainer.log_dir is not None and stage != "predict" and (trainer.run_dir is None or stage == "fit"):
        trainer.run_dir = strategy.broadcast_object(
            run_dir(trainer.log_dir, trainer.name, ckpt_path if stage == "fit" else None) if strategy.is_global_zero else None
        )
    prepare(strategy, model, datamodule)  # prepare_data: once per machine, the others wait
    if datamodule is not None:
        datamodule.setup(stage)
    hooks.call("setup", trainer, model, stage)
    on_device = trainer.data_on_device and strategy.root_device.type != "cpu"
    trainer._fetching = Fetching(trainer.batched_fetching, strategy.root_device if on_device else None)
    counters = None
    try:
        if stage == "fit":
            train = stage_loader("train", data.loader, model, datamodule)
            if data.loader is None:  # the model's or DataModule's: checked here, where they were made
                check_train_loader(train)
            val = stage_loader("validate", data.val_loader, model, datamodule)
            val = None if val is None else Loaders(val)
            if trainer.overfit_batches:
                train, val = overfit_loaders(train, val, trainer.overfit_batches)
            FitLoop(trainer, model, train, val, ckpt_path).run()
            if trainer.fast_dev_run and strategy.is_global_zero:
                batches, n = trainer.num_training_batches, trainer.fast_dev_run
                log.info(
                    "fast_dev_run=%d: trained on %d batch(es) (%d optimizer step(s)) and validated on up to %d "
                    "batch(es) of each validation loader; wrote no logs and no checkpoints.",
                    n, batches, trainer.global_step, 0 if val is None else n,
                )
            return None
        counters = evaluate_checkpoint(trainer, ckpt_path)
        loaders = Loaders(stage_loader(stage, data.loader, model, datamodule))
        loaders = loaders.map(lambda loader: strategy.process_dataloader(loader, stage))
        if stage == "predict":
            trainer.predict_loop = PredictLoop(data.return_predictions, trainer.callbacks, len(loaders))
            try:
                outputs = evaluation_loop(trainer, "predict", loaders, trainer.limit_predict_batches)
                if not data.return_predictions:
                    return None
                return loaders.pack([strategy.gather_predictions(out) for out in outputs])
            finally:
                trainer.predict_loop.release()
        phase = "validation" if stage == "validate" else "test"
        limit = trainer.limit_val_batches if stage == "validate" else trainer.limit_test_batches
        evaluation_loop(trainer, phase, loaders, limit)
        return per_loader(trainer.logged_metrics, loaders)
    except BaseException as err:
        for fn in hooks.on_exception:
            fn(trainer, model, err)
        raise
    finally:
        trainer._fetching = Fetching(trainer.batched_fetching)  # the dataset copies on the device go
        if counters is not None:  # evaluated a checkpoint at its step: the trainer's own come back
            trainer.state.global_step, trainer.state.current_epoch = counters
        hooks.call("teardown", trainer, model, stage)
        if datamodule is not None:
            datamodule.teardown(stage)
        if trainer.compile is not None:  # hand the model back as it came: nn.Module.compile() undone
            model._compiled_call_impl = None


def per_loader(metrics: dict[str, float], loaders: Loaders) -> Any:
    """validate's and test's result: the means, or with several loaders one dict per loader
    (its own suffixed values and the unsuffixed ones an epoch-end hook logged), shaped as given."""
    if not loaders.several:
        return dict(metrics)
    suffixes = [loaders.suffix(i) for i in range(len(loaders))]
    shared = {k: v for k, v in metrics.items() if not any(k.endswith(sfx) for sfx in suffixes)}
    return loaders.pack([{**{k: v for k, v in metrics.items() if k.endswith(sfx)}, **shared} for sfx in suffixes])
