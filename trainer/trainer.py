"""The Trainer: its options and its entry points.

``Trainer`` keeps the options (checked when it is built) and the four entry points. The work
happens in ``trainer/loops/``, one file each: ``stage.py`` runs a stage in each process and
hands a spawned run's results back, ``fit.py`` is the training loop (its docstring is the
order of events), and ``evaluation.py`` runs validation, test and predict.
"""

from __future__ import annotations

import math
import os
from datetime import timedelta
from typing import Any, Callable, Iterable

import torch
from torch import nn

from callbacks import Callback
from loggers import Logger
from strategies import Strategy

from trainer.attributes import TrainerAttributes
from trainer.checkpoint import files as ckpt_io
from trainer.checkpoint import layout
from trainer.checkpoint.background_save import snapshot
from trainer.checkpoint.files import check_ckpt_path
from trainer.checkpoint.paths import best_checkpoint
from trainer.checkpoint.resume import capture
from trainer.core.metrics import MetricSink
from trainer.core.module import TrainModule, check_model
from trainer.core.signals import StopSignals
from trainer.core.state import TrainerState
from trainer.data.fetch import Fetching
from trainer.data.loaders import DataModule, check_loaders, check_sources, check_train_loader
from trainer.loops.after_fit import fitted_sources
from trainer.loops.hooks import Hooks
from trainer.loops.log_writer import LoggerAccess
from trainer.loops.optimization.manual import ManualOptimization
from trainer.loops.optimization.optim import OptimizerSetup
from trainer.loops.precision import Precision, check_precision_available
from trainer.loops.profiler import SimpleProfiler
from trainer.loops.evaluation import results_table
from trainer.loops.stage import StageData, absorb, run_stage
from trainer.options import RUNS, check_names, check_weights_only, configure, fit_end_message
from trainer.tuner import tune_before_fit


class Trainer(TrainerAttributes, LoggerAccess):
    """Runs ``fit``, ``validate``, ``test`` and ``predict`` for a ``TrainModule``.

    All options are keyword-only, with Lightning's names and meanings (docs/trainer-arguments.md
    lists each and says where this one differs). ``fit`` needs ``max_epochs`` or ``max_steps``
    (or both: whichever ends first). ``default_root_dir`` (alias ``log_dir``) is where the run
    folder goes; ``log_dir=None`` turns TensorBoard and the run folder off. ``logger=True`` (the
    default) writes TensorBoard files into ``<default_root_dir>/<name>/version_<n>``;
    ``logger=False`` writes no logs; a ``loggers.Logger`` or a list of them get everything logged.
    """

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
        max_steps: int | None = None,
        min_steps: int | None = None,
        max_time: str | timedelta | dict[str, int] | None = None,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        overfit_batches: int | float = 0,
        val_check_interval: int | float | None = None,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int = 2,
        log_every_n_steps: int = 50,
        enable_checkpointing: bool = True,
        enable_progress_bar: bool = True,
        enable_model_summary: bool = True,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
        deterministic: bool | str | None = False,
        benchmark: bool | None = None,
        inference_mode: bool = True,
        use_distributed_sampler: bool = True,
        profiler: str | SimpleProfiler | None = None,
        detect_anomaly: bool = False,
        barebones: bool = False,
        sync_batchnorm: bool = False,
        reload_dataloaders_every_n_epochs: int = 0,
        default_root_dir: str | os.PathLike | None = None,
        logger: bool | Logger | Iterable[Logger] | None = True,
        # This trainer's own options:
        log_dir: str | os.PathLike | None = RUNS,
        name: str = "default",
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
        configure(self, options)  # trainer/options.py: each checked, the strategy and callbacks built
        self.sanity_checking = False  # True while the sanity check runs
        self.is_last_batch = False  # during fit: the batch being trained on is its epoch's last (sized loaders)
        self.state = TrainerState()
        self._phase: str | None = None  # "train", "validation", "test" or "predict" while one runs
        self.datamodule: DataModule | None = None  # the stage's, while it runs and after
        self.train_dataloader: Any = None  # fit's training loader, as the strategy prepared it
        self.callback_metrics: dict[str, float] = {}
        self.logged_metrics: dict[str, float] = {}  # the epoch means of the phase that just ended
        self.train_epoch_metrics: dict[str, float] = {}  # the last training epoch's means
        self.prog_bar_names: set[str] = set()  # names logged with prog_bar=True
        # Training samples this process has stepped through, updated every log_every_n_steps steps
        # and at each epoch's end (TensorBoard's throughput reads it then).
        self.samples_seen = 0
        self.run_dir: str | None = None  # the first logger's <save_dir>/<name>/version_<n>: checkpoints go there
        self._log_dir: str | None = None  # the first logger's log_dir, once a stage resolved it
        self._fitted: tuple[Any, Any, Any] | None = None  # fit's (model, datamodule, val_dataloaders)
        self.predict_loop: Any = None  # the running predict's record (loops/prediction.py)
        self._fetching = Fetching(self.batched_fetching)  # a stage's, with data_on_device on its device
        self.grad_norm: torch.Tensor | None = None
        self.num_training_batches: int | float = math.inf
        self.num_val_batches: list[int | float] = []  # per validation loader, after limit_val_batches
        self.num_test_batches: list[int | float] = []
        self.num_predict_batches: list[int | float] = []
        self.val_dataloaders: Any = None  # the validation loader of the fit that runs, or None
        self.optimizer: torch.optim.Optimizer | None = None  # the first (under automatic optimization, the only) one
        self.lr_scheduler: Any = None
        self.optimizers: list[torch.optim.Optimizer] = []  # all, in configure_optimizers' order
        self.lr_schedulers: list[Any] = []
        self._opt: OptimizerSetup | None = None
        self._manual: ManualOptimization | None = None  # set while a fit with automatic_optimization=False runs
        self._module: TrainModule | None = None
        self._precision: Precision | None = None
        self._hooks = Hooks([])
        self._signals = StopSignals()
        self._skip_step = False  # set by skip_optimizer_step() for the step about to happen
        self._step_skipped = False  # whether the last optimizer step was skipped
        self._train_sink: MetricSink | None = None
        self._step_cache: tuple[int, dict[str, float]] = (-1, {})
        self._epoch_complete = False
        # While fit runs: puts this step's training values (reduced across ranks) into callback_metrics
        # now, not at the next log step; what a monitor that training logs reads between log steps.
        self._publish_step_metrics: Callable[[], dict[str, float]] | None = None
        self._epoch_start: dict[str, Any] | None = None  # RNG that re-creates this epoch's order
        self._epoch_loader: Any = None  # the training loader; checkpoints record its generators
        self._ckpt_path: str | None = None  # trainer.ckpt_path; _ckpt_user_managed: set by the user
        self._ckpt_user_managed = False

    def step_metrics(self, prog_bar_only: bool = False) -> dict[str, float]:
        """The latest values logged in training_step, as floats (reads them off the device once per step)."""
        sink = self._train_sink
        if sink is None:
            return {}
        if self._step_cache[0] != self.state.global_step:
            self._step_cache = (self.state.global_step, sink.latest_floats())
        values = self._step_cache[1]
        return {k: v for k, v in values.items() if k in sink.prog_bar} if prog_bar_only else values

    def hparams(self) -> dict[str, Any]:
        """The Trainer's options, as recorded in checkpoints and TensorBoard's HParams tab."""
        names = (
            "max_epochs", "max_steps", "precision", "accumulate_grad_batches", "gradient_clip_val",
            "gradient_clip_algorithm", "check_val_every_n_epoch", "val_check_interval", "log_every_n_steps",
            "limit_train_batches", "limit_val_batches", "seed", "deterministic",
        )
        options = {n: getattr(self, n) for n in names}
        options["strategy"] = self._strategy.name
        options["world_size"] = self._strategy.world_size
        return options

    def skip_optimizer_step(self) -> None:
        """Called from ``on_before_optimizer_step``: drop this step's gradients instead of stepping.

        Under DDP every rank must make the same call (agree first, e.g. with
        ``strategy.all_reduce_sum``), as ``callbacks.NaNGuard`` does.
        """
        self._skip_step = True

    # --- entry points ------------------------------------------------------------------
    def fit(
        self, model: TrainModule, train_dataloaders: Any = None, val_dataloaders: Any = None,
        datamodule: DataModule | None = None, ckpt_path: str | os.PathLike | None = None,
        weights_only: bool | None = None,
    ) -> None:
        """Train ``model``; the order of events is in ``trainer.loops.fit.FitLoop``.

        The data comes from the loaders given, a ``datamodule``, or the model's own
        ``train_dataloader()`` and ``val_dataloader()``. ``val_dataloaders`` may be several
        loaders (a list or a dict). ``weights_only`` is Lightning's: accepted, and it changes
        nothing, since checkpoints hold only tensors and plain data and are always loaded
        with ``torch.load(weights_only=True)``."""
        check_model(model)
        if isinstance(train_dataloaders, DataModule) and datamodule is None:  # fit(model, dm), as Lightning allows
            train_dataloaders, datamodule = None, train_dataloaders
        check_sources("fit", model, {"train_dataloaders": train_dataloaders, "val_dataloaders": val_dataloaders}, datamodule)
        if train_dataloaders is not None:
            check_train_loader(train_dataloaders)
        check_loaders("val_dataloaders", val_dataloaders)
        problem = fit_end_message(self.max_epochs, self.max_steps, self._endless)
        if problem is not None:
            raise ValueError(problem)
        ckpt_path = self._select_ckpt_path(ckpt_path)
        check_ckpt_path(ckpt_path)
        check_weights_only(weights_only)
        self._fitted = (model, datamodule, val_dataloaders)  # for validate/test/predict without a model
        tune_before_fit(self, model, train_dataloaders, val_dataloaders, datamodule)  # LearningRateFinder, BatchSizeFinder
        self._launch("fit", model, train_dataloaders, val_dataloaders, ckpt_path, datamodule)

    def validate(
        self, model: TrainModule | None = None, dataloaders: Any = None, ckpt_path: str | os.PathLike | None = None,
        verbose: bool = True, datamodule: DataModule | None = None, weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """What ``validation_step`` and the validation hooks logged: one dict per loader, in a
        list, as Lightning returns it (each dict holds that loader's values, suffixed
        ``/dataloader_idx_<i>`` with several loaders, and what the epoch-end hooks logged).
        ``verbose`` prints them as a table (rank 0). ``ckpt_path`` ("best", "last" or a file)
        evaluates that checkpoint's weights, at its step. The training counters stay.
        ``model=None`` runs the module of the last fit. ``weights_only``: as in ``fit``."""
        return self._evaluate("validate", model, dataloaders, ckpt_path, datamodule, verbose, weights_only)

    def test(
        self, model: TrainModule | None = None, dataloaders: Any = None, ckpt_path: str | os.PathLike | None = None,
        verbose: bool = True, datamodule: DataModule | None = None, weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """What ``test_step`` and the test hooks logged, as ``validate`` returns them."""
        return self._evaluate("test", model, dataloaders, ckpt_path, datamodule, verbose, weights_only)

    def predict(
        self, model: TrainModule | None = None, dataloaders: Any = None, datamodule: DataModule | None = None,
        return_predictions: bool | None = None, ckpt_path: str | os.PathLike | None = None,
        weights_only: bool | None = None,
    ) -> Any:
        """``predict_step``'s outputs, in the loader's order (one list per loader with several).
        Under DDP, global rank 0 gets every rank's (on the CPU) and the other ranks get None.
        ``return_predictions=False`` keeps nothing, returns None: see ``callbacks.BasePredictionWriter``."""
        if return_predictions is not None and not isinstance(return_predictions, bool):
            raise TypeError(f"return_predictions={return_predictions!r} must be True, False or None.")
        return self._evaluate("predict", model, dataloaders, ckpt_path, datamodule, False, weights_only, return_predictions is not False)

    def _evaluate(
        self, stage: str, model: TrainModule | None, dataloaders: Any, ckpt_path: Any, datamodule: Any,
        verbose: bool, weights_only: bool | None, keep: bool = True,
    ) -> Any:
        if model is None:  # after fit: its model and data, and the best checkpoint's weights
            model, dataloaders, datamodule, ckpt_path = fitted_sources(self, stage, dataloaders, datamodule, ckpt_path)
        check_model(model, needs_training_step=False)
        check_weights_only(weights_only)
        if not isinstance(verbose, bool):
            raise TypeError(f"verbose={verbose!r} must be True or False.")
        step = {"validate": "validation_step", "test": "test_step", "predict": "predict_step"}[stage]
        if not callable(getattr(model, step, None)):
            raise TypeError(f"trainer.{stage}() needs {type(model).__name__}.{step}(self, batch, batch_idx).")
        if isinstance(dataloaders, DataModule) and datamodule is None:
            dataloaders, datamodule = None, dataloaders
        check_sources(stage, model, {"dataloaders": dataloaders}, datamodule)
        check_loaders("dataloaders", dataloaders)
        ckpt_path = self._select_ckpt_path(ckpt_path)
        check_ckpt_path(ckpt_path, evaluating=True)
        if ckpt_path is not None and os.fspath(ckpt_path) == "best":
            ckpt_path = best_checkpoint(self.checkpoint_callback)
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
        self.datamodule = datamodule
        data = StageData(loader, val_loader, datamodule, keep)
        result = absorb(self, model, self._strategy.launch(run_stage, self, stage, model, data, ckpt_path))
        self._module = model  # after a spawned stage too: trainer.lightning_module, validate(model=None)
        return result

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
        if self._opt is None:  # no fit ran in this process: its optimizer state is elsewhere, or nowhere
            after_spawn = self._strategy.spawned and self.global_step > 0
            raise RuntimeError(
                f"trainer.save_checkpoint({os.fspath(path)!r}) needs a fit's full state (optimizer, RNG, "
                + ("loop), which stayed in the worker processes of strategy='ddp' and ended with them; only "
                   "the weights came back. Save those with torch.save(model.state_dict(), path), use the "
                   "checkpoint the run wrote (trainer.checkpoint_callback.best_model_path), or call "
                   "save_checkpoint inside fit, from a callback." if after_spawn else
                   "loop), and no fit has run in this process. Call it during or after trainer.fit(...).")
            )
        if self._strategy.sharded_checkpoints:  # one folder, each rank writing its shards, now
            meta = capture(self, tensors=False)
            if self.is_global_zero:
                meta = self._with_save_hooks(layout.to_file(meta), weights_only=False)
            self._strategy.save_sharded_checkpoint(meta if self.is_global_zero else None, os.fspath(path), self._opt.optimizers)
            return
        # CPU copies: a file written on a GPU loads with plain torch.load on a machine without one.
        checkpoint = self.checkpoint_state(copy=True, weights_only=weights_only)
        if checkpoint is not None:
            ckpt_io.save_atomic(checkpoint, path)
        self._strategy.barrier()

    def checkpoint_state(self, copy: bool = False, weights_only: bool = False) -> dict[str, Any] | None:
        """What ``save_checkpoint`` writes (Lightning's layout, ``trainer/checkpoint/layout.py``),
        after the ``on_save_checkpoint`` hooks, on global rank 0; None on the other ranks. Every
        rank must call it. Its tensors are the live model's and optimizer's, or with
        ``copy=True`` copies on the CPU (what the hooks added too), safe to write while training
        goes on. ``weights_only`` leaves out the optimizers, schedulers, callbacks and RNG."""
        checkpoint = capture(self)
        if not self.is_global_zero:
            return None
        checkpoint = self._with_save_hooks(layout.to_file(checkpoint), weights_only)
        return snapshot(checkpoint) if copy else checkpoint

    def _with_save_hooks(self, checkpoint: dict[str, Any], weights_only: bool) -> dict[str, Any]:
        """Lightning's order: every callback's ``on_save_checkpoint`` (none for a weights-only
        file), then the model's; numpy numbers become Python's (weights_only loads refuse them)."""
        own = self._hooks.module_hooks.get("on_save_checkpoint")
        if not weights_only:
            for fn in self._hooks.on_save_checkpoint:
                if fn is not own:
                    fn(self, self._module, checkpoint)
        if own is not None:
            own(self, self._module, checkpoint)
        checkpoint = layout.python_numbers(checkpoint)
        return layout.weights_only(checkpoint) if weights_only else checkpoint

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_module"] = None  # sent separately as fit's argument
        # likewise (and a dataset is costly to pickle twice)
        state["val_dataloaders"] = state["train_dataloader"] = state["datamodule"] = None
        state["_fitted"] = state["predict_loop"] = None  # a model, data, predictions: the caller's only
        return state
