"""The Trainer: its options and its entry points.

``Trainer`` keeps the options (checked when it is built, ``options.py``), the counters, and a
reference to the current call's run (``loops/run.py``), which its properties read
(``trainer_properties.py``). The work happens in ``trainer/loops/``: ``stage.py`` runs a stage in each
process and hands a spawned run's results back, and each entry point has its file:
``fit.py`` (its loop's docstring is the order of events), ``evaluation.py`` (validate, test)
and ``prediction.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from datetime import timedelta
from typing import Any, Callable, Iterable

import torch
from torch import nn

from callbacks import Callback
from loggers import Logger
from strategies import Strategy
from strategies.precision import check_precision_available

from trainer.trainer_properties import RUN_SETTABLE, RUN_VALUES, LoggerAccess, TrainerProperties, forward, metrics_view
from trainer.checkpoint import layout
from trainer.checkpoint.background_save import snapshot, take_hand_off
from trainer.checkpoint.integrity import refuse_non_finite
from trainer.checkpoint.paths import check_ckpt_path
from trainer.checkpoint.training_state import capture
from trainer.core.checks import check_eval_model, check_model
from trainer.core.module import TrainModule
from trainer.core.state import TrainerState, TrainerStatus
from trainer.data.loaders import DataModule, check_loaders, check_sources, check_train_loader
from trainer.calls_without_model import fitted_sources
from trainer.profilers import Profiler
from trainer.loops.evaluation import results_table
from trainer.loops.hooks import refusing_logs
from trainer.loops.run import Run, StageData, absorb, caller_on_exception
from trainer.loops.stage import run_stage
from trainer.init_arguments import check_names, defaults_from_env_vars, named_signature
from trainer.options import WORKING_DIR, TrainerOptions, check_weights_only, configure, default_max_epochs
from trainer.tuner import tune_before
from trainer.utilities.compile import unwrap_compiled
from trainer.utilities.parsing import clean_namespace


class _NoModel(AttributeError, RuntimeError):
    """``save_checkpoint`` before any stage attached a model."""


class Trainer(TrainerProperties, LoggerAccess):
    """Runs ``fit``, ``validate``, ``test`` and ``predict`` for a ``TrainModule``.

    Every option is keyword-only, with Lightning's name and meaning: the API reference gives
    each in [a line][trainer-arguments-table], and docs/trainer-arguments.md says where this
    Trainer differs. ``fit`` ends at ``max_epochs`` or ``max_steps`` (whichever comes first;
    with neither, 1000 epochs, as in Lightning). ``default_root_dir`` (alias ``log_dir``; the
    working directory by default) is where the run folder goes: the default logger writes
    ``<default_root_dir>/lightning_logs/version_<n>`` (``name=`` changes ``lightning_logs``).
    Any other keyword is a ``TypeError`` that names it: a misspelt option gets the closest
    name, and a Lightning argument this Trainer does not take (``gpus``,
    ``resume_from_checkpoint``, ...) says what to pass instead; Lightning's defaults for those
    (``plugins=None``) are accepted.
    """

    @named_signature  # no **unknown in it, as in Lightning's
    @defaults_from_env_vars  # Lightning's PL_TRAINER_<ARGUMENT> environment variables, for arguments not passed
    def __init__(
        self,
        *,
        accelerator: str = "auto",
        strategy: str | Strategy = "auto",
        devices: str | int | list[int] = "auto",
        num_nodes: int = 1,
        precision: str | int = "32-true",
        callbacks: Iterable[Callback] | Callback | None = None,
        fast_dev_run: bool | int = False,
        max_epochs: int | None = None,
        min_epochs: int | None = None,
        max_steps: int = -1,
        min_steps: int | None = None,
        max_time: str | timedelta | dict[str, int] | None = None,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        overfit_batches: int | float = 0,
        val_check_interval: int | float | None = None,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int | None = None,
        log_every_n_steps: int | None = None,
        enable_checkpointing: bool | None = None,
        enable_progress_bar: bool | None = None,
        enable_model_summary: bool | None = None,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
        deterministic: bool | str | None = False,
        benchmark: bool | None = None,
        inference_mode: bool = True,
        use_distributed_sampler: bool = True,
        profiler: str | Profiler | None = None,
        detect_anomaly: bool = False,
        barebones: bool = False,
        sync_batchnorm: bool = False,
        reload_dataloaders_every_n_epochs: int = 0,
        default_root_dir: str | os.PathLike | None = None,
        logger: bool | Logger | Iterable[Logger] | None = None,
        # This trainer's own options:
        log_dir: str | os.PathLike | None = WORKING_DIR,
        name: str = "lightning_logs",
        seed: int | None = None,
        optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None,
        batched_fetching: bool = True,
        data_on_device: bool = False,
        compile: bool | dict[str, Any] = False,
        **unknown: Any,
    ) -> None:
        options = dict(locals())
        del options["self"], options["unknown"]
        check_names(unknown, options)  # Lightning's arguments we do not take, and typos
        # trainer/options.py: each checked, the strategy and callbacks built. trainer.<option> reads _options.
        self._options, self._strategy, self._loggers = configure(options)
        self.state = TrainerState()  # the counters users read
        self._run = Run()  # the current (or last) call's state: trainer/loops/run.py
        self._fitted: tuple[Any, Any, Any] | None = None  # fit's (model, datamodule, val_dataloaders)

    def _current_run(self) -> Run:
        """The current (or last) call's run: the one accessor through which the properties read it."""
        return self._run

    def step_metrics(self, prog_bar_only: bool = False) -> dict[str, float]:
        """The latest values logged in training_step, as floats (reads them off the device once per step)."""
        run = self._run
        sink = run.train_sink
        if sink is None:
            return {}
        if run.step_cache[0] != self.state.global_step:
            run.step_cache = (self.state.global_step, sink.latest_floats())
        values = run.step_cache[1]
        return {k: v for k, v in values.items() if k in sink.prog_bar} if prog_bar_only else values

    def hparams(self) -> dict[str, Any]:
        """The Trainer's options, as recorded in checkpoints and TensorBoard's HParams tab."""
        names = (
            "max_epochs", "max_steps", "precision", "accumulate_grad_batches", "gradient_clip_val",
            "gradient_clip_algorithm", "check_val_every_n_epoch", "val_check_interval", "log_every_n_steps",
            "limit_train_batches", "limit_val_batches", "seed", "deterministic",
        )
        # Lightning's -1 (no limit) is left out, as an option left unset is: one type a column
        options = {n: None if n in ("max_epochs", "max_steps") and getattr(self, n) == -1 else getattr(self, n)
                   for n in names}
        options["strategy"] = self._strategy.name
        options["world_size"] = self._strategy.world_size
        return options

    def skip_optimizer_step(self) -> None:
        """Called from ``on_before_optimizer_step``: drop this step's gradients instead of stepping.

        Under DDP every rank must make the same call (agree first, e.g. with
        ``strategy.all_reduce_sum``), as ``callbacks.NaNGuard`` does.
        """
        self._run.skip_step = True

    # --- entry points ------------------------------------------------------------------
    def fit(
        self, model: TrainModule, train_dataloaders: Any = None, val_dataloaders: Any = None,
        datamodule: DataModule | None = None, ckpt_path: str | os.PathLike | None = None,
        weights_only: bool | None = None,
    ) -> None:
        """Train ``model``; the order of events is in ``trainer.loops.fit.FitLoop``.

        The data comes from the loaders given, a ``datamodule``, or the model's own
        ``train_dataloader()`` and ``val_dataloader()``. ``val_dataloaders`` may be several
        loaders (a list or a dict). ``ckpt_path`` is where training starts: ``None`` (the model
        as it is), ``"last"`` (resume the latest run, or start afresh) or a checkpoint's path;
        [ckpt_path][ckpt-path] says what each does. ``weights_only`` is Lightning's: accepted,
        and it changes nothing, since checkpoints hold only tensors and plain data and are
        always loaded with ``torch.load(weights_only=True)``. ``model`` may be ``torch.compile(module)``:
        the module is trained, with its forward and steps compiled (trainer/utilities/compile.py)."""
        model = unwrap_compiled(model)
        check_model(model)
        if isinstance(train_dataloaders, DataModule) and datamodule is None:  # fit(model, dm), as Lightning allows
            train_dataloaders, datamodule = None, train_dataloaders
        sources = {"train_dataloaders": train_dataloaders, "val_dataloaders": val_dataloaders}
        check_sources("fit", model, sources, datamodule)
        if train_dataloaders is not None:
            check_train_loader(train_dataloaders)
        if val_dataloaders is not None:
            check_loaders(val_dataloaders, name="val_dataloaders", where="passed to `Trainer.fit(val_dataloaders=...)`")
        default_max_epochs(self)  # neither max_epochs nor max_steps: 1000 epochs, with Lightning's warning
        ckpt_path = self._select_ckpt_path(ckpt_path)
        check_ckpt_path(ckpt_path)
        check_weights_only(weights_only)
        self._fitted = (model, datamodule, val_dataloaders)  # for validate/test/predict without a model
        # LearningRateFinder, BatchSizeFinder
        tune_before(self, "fit", model, train_dataloaders, val_dataloaders, datamodule)
        self._launch("fit", model, train_dataloaders, val_dataloaders, ckpt_path, datamodule)

    def validate(
        self, model: TrainModule | None = None, dataloaders: Any = None, ckpt_path: str | os.PathLike | None = None,
        verbose: bool = True, datamodule: DataModule | None = None, weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """What ``validation_step`` and the validation hooks logged: one dict per loader, in a
        list, as Lightning returns it (each dict holds that loader's values, suffixed
        ``/dataloader_idx_<i>`` with several loaders, and what the epoch-end hooks logged).
        ``verbose`` prints them as a table (rank 0). ``ckpt_path`` picks the weights: ``None``
        (the model's own; with ``model=None``, the last fit's best checkpoint), ``"best"``,
        ``"last"`` or a checkpoint's path ([ckpt_path][ckpt-path]); the Trainer's counters stay
        as they are (Lightning's: a new Trainer logs them at step 0). ``model=None`` runs the module
        of the last fit. ``weights_only``: as in ``fit``."""
        return self._evaluate("validate", model, dataloaders, ckpt_path, datamodule, verbose, weights_only)

    def test(
        self, model: TrainModule | None = None, dataloaders: Any = None, ckpt_path: str | os.PathLike | None = None,
        verbose: bool = True, datamodule: DataModule | None = None, weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """What ``test_step`` and the test hooks logged, as ``validate`` returns them (its
        arguments, ``ckpt_path`` included)."""
        return self._evaluate("test", model, dataloaders, ckpt_path, datamodule, verbose, weights_only)

    def predict(
        self, model: TrainModule | None = None, dataloaders: Any = None, datamodule: DataModule | None = None,
        return_predictions: bool | None = None, ckpt_path: str | os.PathLike | None = None,
        weights_only: bool | None = None,
    ) -> Any:
        """``predict_step``'s outputs, in the loader's order (one list per loader with several).
        Under DDP, global rank 0 gets every rank's (on the CPU) and the other ranks get None.
        ``return_predictions=False`` keeps nothing, returns None: see ``callbacks.BasePredictionWriter``.
        ``ckpt_path`` picks the weights as in ``validate``."""
        if return_predictions is not None and not isinstance(return_predictions, bool):
            raise TypeError(f"return_predictions={return_predictions!r} must be True, False or None.")
        keep = return_predictions is not False
        return self._evaluate("predict", model, dataloaders, ckpt_path, datamodule, False, weights_only, keep)

    def _evaluate(
        self, stage: str, model: TrainModule | None, dataloaders: Any, ckpt_path: Any, datamodule: Any,
        verbose: bool, weights_only: bool | None, keep: bool = True,
    ) -> Any:
        ckpt_path = self._select_ckpt_path(ckpt_path)  # first, as Lightning: a trainer.ckpt_path set wins over "best"
        if model is None:  # after fit: its model and data, and the best checkpoint's weights
            model, dataloaders, datamodule, ckpt_path = fitted_sources(self, stage, dataloaders, datamodule, ckpt_path)
        model = unwrap_compiled(model)
        check_model(model, needs_training_step=False)
        check_weights_only(weights_only)
        if not isinstance(verbose, bool):
            raise TypeError(f"verbose={verbose!r} must be True or False.")
        check_eval_model(model, stage)  # the step it runs (Lightning's MisconfigurationException)
        if isinstance(dataloaders, DataModule) and datamodule is None:
            dataloaders, datamodule = None, dataloaders
        check_sources(stage, model, {"dataloaders": dataloaders}, datamodule)
        if dataloaders is not None:
            check_loaders(dataloaders, name="dataloaders", where=f"passed to `Trainer.{stage}(dataloaders=...)`")
        check_ckpt_path(ckpt_path, evaluating=True)  # "best", "last", a URL: each process of the stage resolves it
        tune_before(self, stage, model, dataloaders, None, datamodule)  # a BatchSizeFinder's search
        results = self._launch(stage, model, dataloaders, None, ckpt_path, datamodule, keep)
        if verbose and stage != "predict" and self.is_global_zero:
            print(results_table(stage, results), flush=True)
        return results

    def _launch(
        self, stage: str, model: TrainModule, loader: Any, val_loader: Any, ckpt_path: Any, datamodule: Any = None,
        keep: bool = True,
    ) -> Any:
        """Run ``stage`` in the strategy's processes (``stage.run_stage``) and take back its results."""
        check_precision_available(self.precision)  # here, not in each of several DDP workers
        clean_namespace(model.hparams)  # Lightning's: what cannot be pickled leaves hparams, with a warning
        data = StageData(loader, val_loader, datamodule, keep)
        try:
            # After a spawned stage, the caller's run records what rank 0 reported (trainer.lightning_module too).
            results = self._strategy.launch(run_stage, self, stage, model, data, ckpt_path)
            return absorb(self, model, datamodule, results)
        except KeyboardInterrupt:  # Lightning's: the hooks and teardown ran (run_stage); exit with status 1
            self.state.status = TrainerStatus.INTERRUPTED
            logging.getLogger("trainer").info("Detected KeyboardInterrupt, attempting graceful shutdown ...")
            sys.exit(1)
        except BaseException as err:  # a spawned stage's workers set theirs; the caller's says so too
            self.state.status = TrainerStatus.INTERRUPTED
            if self._strategy.spawned and self._strategy.on_exception_in_caller:
                caller_on_exception(self, model, datamodule, err)
            raise

    # --- checkpoints -------------------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike, weights_only: bool = False, storage_options: Any = None) -> None:
        """Write the full training state to ``path`` (rank 0 writes; every rank must call).

        ``weights_only=True`` writes the weights and hyperparameters only (no optimizer, RNG or
        loop state): ``load_from_checkpoint`` and ``validate/test(ckpt_path=...)`` read it, and
        ``fit(ckpt_path=...)`` refuses it. ``storage_options`` (Lightning's, for remote file
        systems) must stay None: paths are local files."""
        if not isinstance(weights_only, bool):
            raise TypeError(f"weights_only={weights_only!r} must be True or False.")
        if storage_options is not None:
            raise ValueError(
                f"save_checkpoint(storage_options={storage_options!r}): remote file systems are not supported; "
                "write to a local path and copy it."
            )
        run = self._run
        if run.opt is None:  # no fit ran in this process: its optimizer state is elsewhere, or nowhere
            after_spawn = self._strategy.spawned and self.global_step > 0
            why = f"trainer.save_checkpoint({os.fspath(path)!r}) needs a fit's full state (optimizer, RNG, loop), " + (
                "which stayed in the worker processes of strategy='ddp' and ended with them; only the weights came "
                "back. Save those with torch.save(model.state_dict(), path), use the checkpoint the run wrote "
                "(trainer.checkpoint_callback.best_model_path), or call save_checkpoint inside fit, from a callback."
                if after_spawn else "and no fit has run in this process. Call it during or after trainer.fit(...)."
            )
            if self.model is None and not after_spawn:  # Lightning's AttributeError, its sentence first
                raise _NoModel(
                    "Saving a checkpoint is only possible if a model is attached to the Trainer. Did you call "
                    f"`Trainer.save_checkpoint()` before calling `Trainer.{{fit,validate,test,predict}}`? {why}"
                )
            raise RuntimeError(why)
        ours = (type(self).save_checkpoint is Trainer.save_checkpoint and not self._strategy.sharded_checkpoints
                and type(self._strategy).save_checkpoint is Strategy.save_checkpoint)  # else theirs writes it
        job = take_hand_off() if ours else None
        if job is not None:  # ModelCheckpoint's: written in the background
            checkpoint = self.checkpoint_state(weights_only=weights_only)  # (it refused a NaN model already)
            if checkpoint is not None:
                job.submit(checkpoint, os.fspath(path))
            return
        refuse_non_finite(self, repr(os.fspath(path)))  # a NaN model never replaces a good file
        if self._strategy.sharded_checkpoints:  # one folder, each rank writing its shards, now
            meta = capture(self, run, tensors=False)
            if self.is_global_zero:
                meta = self._with_save_hooks(run, layout.to_file(meta), weights_only=False)
            meta = meta if self.is_global_zero else None
            self._strategy.save_sharded_checkpoint(meta, os.fspath(path), run.opt.optimizers)
            return
        # CPU copies: a file written on a GPU loads with plain torch.load on a machine without one.
        checkpoint = self.checkpoint_state(copy=True, weights_only=weights_only)
        if checkpoint is not None:
            self._strategy.save_checkpoint(checkpoint, path)
        self._strategy.barrier()

    def checkpoint_state(self, copy: bool = False, weights_only: bool = False) -> dict[str, Any] | None:
        """What ``save_checkpoint`` writes (Lightning's layout, ``trainer/checkpoint/layout.py``),
        after the ``on_save_checkpoint`` hooks, on global rank 0; None on the other ranks. Every
        rank must call it. Its tensors are the live model's and optimizer's, or with
        ``copy=True`` copies on the CPU (what the hooks added too), safe to write while training
        goes on. ``weights_only`` leaves out the optimizers, schedulers, callbacks and RNG."""
        run = self._run
        checkpoint = capture(self, run)
        if not self.is_global_zero:
            return None
        checkpoint = self._with_save_hooks(run, layout.to_file(checkpoint), weights_only)
        return snapshot(checkpoint) if copy else checkpoint

    def _with_save_hooks(self, run: Run, checkpoint: dict[str, Any], weights_only: bool) -> dict[str, Any]:
        """Lightning's order: every callback's ``on_save_checkpoint`` (none for a weights-only
        file), then the model's; numpy numbers become Python's (weights_only loads refuse them)."""
        own = run.hooks.module_hooks.get("on_save_checkpoint")
        with refusing_logs():  # Lightning's: self.log raises in on_save_checkpoint
            if not weights_only:
                for fn in run.hooks.on_save_checkpoint:
                    if fn is not own:
                        fn(self, run.module, checkpoint)
            if own is not None:
                own(self, run.module, checkpoint)
        checkpoint = layout.python_numbers(checkpoint)
        return layout.weights_only(checkpoint) if weights_only else checkpoint

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()  # the run leaves out its model, data and predictions (Run.__getstate__)
        state["_fitted"] = None  # a model and data: the caller's only
        return state

    def __copy__(self) -> Trainer:
        """``copy.copy(trainer)``: the same strategy, callbacks and loggers, its own copy of the
        options (setting one changes only the copy), and no run yet: counters at 0, no metrics,
        optimizers or model. The Tuner's searches run on such copies."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone._options = dataclasses.replace(self._options, callbacks=list(self.callbacks))
        clone._loggers = list(self._loggers)
        clone.state, clone._run, clone._fitted = TrainerState(), Run(), None
        return clone


for _field in dataclasses.fields(TrainerOptions):  # trainer.max_epochs reads (and sets) trainer._options.max_epochs
    setattr(Trainer, _field.name, forward("_options", _field.name))
for _name in RUN_VALUES:  # trainer.optimizers reads trainer._run.optimizers; only Lightning's settable ones set it
    setattr(Trainer, _name, forward("_run", _name, settable=_name in RUN_SETTABLE))
Trainer.callback_metrics = metrics_view("_run", "callback_metrics")
Trainer.logged_metrics = metrics_view("_run", "logged_metrics")
