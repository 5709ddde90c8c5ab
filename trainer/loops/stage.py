"""One stage (fit, validate, test or predict) inside each process, and the hand-off back.

``Trainer.fit`` and friends call ``strategy.launch(run_stage, trainer, stage, ...)``. In the
caller's process (single, dp, or a rank that torchrun started) that is a plain call. Under a
spawning strategy it runs in every worker, and global rank 0 returns a picklable summary that
:func:`absorb` copies into the caller's model and Trainer.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple

import torch

from trainer.loops.hooks import Hooks, adapt_steps, attach_model_callbacks, restore_steps
from trainer.checkpoint.paths import resolve_path
from trainer.checkpoint.resume import evaluate_checkpoint, read_for_fit
from trainer.loops.evaluation import evaluation_loop
from trainer.loops.log_writer import LogWriter, logger_versions, resolve_run_dir, set_logger_versions
from trainer.data.fetch import Fetching
from trainer.loops.fit import FitLoop
from trainer.data.loaders import Loaders, check_train_loader, overfit_loaders, prepare, stage_loader
from trainer.loops.precision import Precision
from trainer.loops.prediction import PredictLoop
from trainer.core.seed import deterministic_algorithms, seed_everything, seeded_workers
from trainer.core.state import TrainerState
from trainer.core.module import overridden
from trainer.core.utilities import rank_zero_only
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
    profiler = trainer.profiler
    if profiler is not None:
        profiler.start(stage)
    try:
        # The caller's settings come back after: deterministic kernels, cuDNN autotuning, anomaly detection.
        with deterministic_algorithms(trainer.deterministic), torch_flags(trainer.benchmark, trainer.detect_anomaly):
            try:
                output = _run(trainer, stage, model, data, ckpt_path)
            except BaseException:
                trainer.state.status = "interrupted"
                raise
        trainer.state.status = "finished"
        # For the caller's model: gathered on every rank while the group is up (fsdp shards them).
        weights = strategy.module_state_dict() if strategy.spawned else None
    finally:
        trainer.state.stage = "idle"
        strategy.teardown()
        if profiler is not None:
            profiler.stop()
            if strategy.is_global_zero:
                profiler.describe()
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
        "run_dir": (trainer.run_dir, trainer._log_dir, logger_versions(trainer)),
        "callbacks": [cb.state_dict() for cb in trainer.callbacks],
        "ckpt_path": trainer._ckpt_path,
        "profiler": trainer.profiler,
        "batches": (trainer.num_training_batches, trainer.num_val_batches, trainer.num_test_batches),
    }


def absorb(trainer: Trainer, model: TrainModule, result: Any) -> Any:
    """In the caller, after a spawned run: copy rank 0's results into ``model`` and ``trainer``."""
    if not trainer.strategy.spawned:
        return result
    on_meta = any(p.is_meta for p in model.parameters())  # built on the meta device: take the tensors
    load_plain_state_dict(model, result["model"], assign=on_meta)  # plain keys, also into compiled submodules
    trainer.state = TrainerState(**result["state"])
    trainer.callback_metrics, trainer.logged_metrics = result["callback_metrics"], result["logged_metrics"]
    trainer.run_dir, trainer._log_dir, versions = result["run_dir"]
    set_logger_versions(trainer, versions)  # the folders rank 0 picked
    attach_model_callbacks(trainer, model)  # as the workers did, so that the lists match
    for cb, state in zip(trainer.callbacks, result["callbacks"]):
        cb.load_state_dict(state)
    trainer._ckpt_path = result["ckpt_path"]
    trainer.profiler = result["profiler"]
    trainer.num_training_batches, trainer.num_val_batches, trainer.num_test_batches = result["batches"]
    return result["output"]


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


def _run(trainer: Trainer, stage: str, model: TrainModule, data: StageData, ckpt_path: Any) -> Any:
    strategy, datamodule = trainer.strategy, data.datamodule
    if trainer.seed is not None:
        seed_everything((trainer.seed + strategy.global_rank) % 2**32)
    trainer._precision = strategy.precision = Precision(trainer.precision, strategy.root_device)
    trainer._module = model
    model._trainer = trainer
    rank_zero_only.rank = strategy.global_rank
    if overridden(model, "configure_model"):  # lazily built layers: before the strategy wraps them
        model.configure_model()
    trainer._precision.convert_module(model)  # a true precision ("bf16-true", "64-true"): before any wrapper
    strategy.setup_module(model)
    if trainer.compile is not None:  # lazily: the first step compiles (the bar says so)
        strategy.compile(trainer.compile)
    attach_model_callbacks(trainer, model)
    # The loggers are written from the LogWriter, after every callback, on global rank 0 only. The
    # other ranks get one with no loggers: every rank must call the same epoch-end hooks (each agrees).
    logs = trainer.loggers if strategy.is_global_zero else []
    writer = [LogWriter(logs)] if trainer.loggers and stage != "predict" else []
    trainer._hooks = hooks = Hooks(trainer.callbacks + writer, model)
    if trainer.profiler is not None:
        trainer.profiler.wrap_hooks(hooks)
    trainer.datamodule = datamodule
    if stage == "fit":  # a new run: nothing of an earlier fit's (counters, monitors) carries over
        trainer.state = TrainerState(stage="fit", status="running")  # from 0, or from the checkpoint's step
        trainer.callback_metrics, trainer.logged_metrics, trainer.train_epoch_metrics = {}, {}, {}
        trainer.prog_bar_names, trainer.samples_seen, trainer.grad_norm = set(), 0, None
        ckpt_path = resolve_path(trainer, ckpt_path)
        trainer._ckpt_path = ckpt_path  # trainer.ckpt_path: the file resumed, "last" resolved
    else:
        trainer.state.stage, trainer.state.status = stage, "running"  # evaluation never moves the training counters
    # predict logs nothing, so it gets no run folder; evaluation after fit writes into fit's.
    if stage != "predict" and (trainer.run_dir is None or stage == "fit"):
        trainer.run_dir, trainer._log_dir, versions = strategy.broadcast_object(
            resolve_run_dir(trainer, ckpt_path if stage == "fit" else None, stage == "fit") if strategy.is_global_zero else None
        )
        set_logger_versions(trainer, versions)  # every rank's loggers name rank 0's folders
    if datamodule is not None:
        datamodule.trainer = trainer
    prepare(strategy, model, datamodule)  # prepare_data: once per machine, the others wait
    if datamodule is not None:
        datamodule.setup(stage)
    hooks.call("setup", trainer, model, stage)
    on_device = trainer.data_on_device and strategy.root_device.type != "cpu"
    trainer._fetching = Fetching(trainer.batched_fetching, strategy.root_device if on_device else None)
    counters = None
    adapted = adapt_steps(model)  # steps defined without batch_idx
    try:
        if stage == "fit":
            def fit_loaders() -> tuple[Any, Any]:  # again every n epochs with reload_dataloaders_every_n_epochs
                train = stage_loader("train", data.loader, model, datamodule)
                if data.loader is None:  # the model's or DataModule's: checked here, where they were made
                    check_train_loader(train)
                val = stage_loader("validate", data.val_loader, model, datamodule)
                if val is not None and not callable(getattr(model, "validation_step", None)):
                    if strategy.is_global_zero and not warned:
                        warnings.warn(
                            f"A validation loader was given but {type(model).__name__} has no validation_step: "
                            "training goes on without validation. Define validation_step(self, batch, batch_idx) "
                            "to validate, or leave the validation loader out to silence this.", UserWarning, stacklevel=2,
                        )
                        warned.append(True)
                    val = None
                val = None if val is None else Loaders(val)
                if trainer.overfit_batches:
                    train, val = overfit_loaders(train, val, trainer.overfit_batches)
                for loader in [train, *(val or [])]:  # seed_everything(workers=True)
                    seeded_workers(loader, strategy.global_rank)
                return train, val

            warned: list[bool] = []  # the missing validation_step is said once, not at each reload
            reload = fit_loaders if trainer.reload_dataloaders_every_n_epochs else None
            resume_from = read_for_fit(trainer, ckpt_path)  # the DataModule's state, before its loaders
            train, val = fit_loaders()
            FitLoop(trainer, model, train, val, resume_from, reload=reload).run()
            if trainer.fast_dev_run and strategy.is_global_zero:
                batches, n = trainer.num_training_batches, trainer.fast_dev_run
                log.info(
                    "fast_dev_run=%d: trained on %d batch(es) (%d optimizer step(s)) and validated on up to %d "
                    "batch(es) of each validation loader; wrote no logs and no checkpoints.",
                    n, batches, trainer.global_step, 0 if val is None else n,
                )
            return None
        trainer._ckpt_path = None
        counters = evaluate_checkpoint(trainer, ckpt_path)  # sets trainer.ckpt_path
        loaders = Loaders(stage_loader(stage, data.loader, model, datamodule))
        for loader in loaders:
            seeded_workers(loader, strategy.global_rank)
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
        if datamodule is not None:
            datamodule.on_exception(err)
        raise
    finally:
        restore_steps(model, adapted)
        trainer._fetching = Fetching(trainer.batched_fetching)  # the dataset copies on the device go
        if counters is not None:  # evaluated a checkpoint at its step: the trainer's own come back
            trainer.state.global_step, trainer.state.current_epoch = counters
        hooks.call("teardown", trainer, model, stage)
        if datamodule is not None:
            datamodule.teardown(stage)
        if trainer.compile is not None:  # hand the model back as it came: nn.Module.compile() undone
            model._compiled_call_impl = None


def per_loader(metrics: dict[str, float], loaders: Loaders) -> list[dict[str, float]]:
    """validate's and test's result, as Lightning's: a list with one dict per loader, in the
    order given (a dict's in its order). With several loaders each holds its own suffixed
    values; every one holds the unsuffixed ones that an epoch-end hook logged."""
    if not loaders.several:
        return [dict(metrics)]
    suffixes = [loaders.suffix(i) for i in range(len(loaders))]
    shared = {k: v for k, v in metrics.items() if not any(k.endswith(sfx) for sfx in suffixes)}
    return [{**{k: v for k, v in metrics.items() if k.endswith(sfx)}, **shared} for sfx in suffixes]
