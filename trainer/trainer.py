"""The Trainer: its options and its entry points.

``Trainer`` keeps the options (checked when it is built) and the four entry points. The work
happens elsewhere, one file each: ``stage.py`` runs a stage in each process and hands a
spawned run's results back, ``fit_loop.py`` is the training loop (its docstring is the order
of events), and ``evaluation_loop.py`` runs validation, test and predict.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Iterable

import torch
from torch import nn

from callbacks import Callback, ModelCheckpoint, ModelSummary, ProgressBar, TensorBoardLogger
from strategies import Strategy, select_strategy

from trainer.checkpoint import files as ckpt_io
from trainer.checkpoint.background_save import snapshot
from trainer.checkpoint.files import check_ckpt_path
from trainer.checkpoint.resume import best_checkpoint, capture
from trainer.core.checks import (
    compile_options, fast_dev_run_batches, flag, interval, limit, one_of, positive_int, positive_number,
)
from trainer.core.metrics import MetricSink
from trainer.core.module import TrainModule, check_model
from trainer.core.signals import StopSignals
from trainer.core.state import TrainerState
from trainer.data.fetch import Fetching
from trainer.data.loaders import DataModule, check_loaders, check_sources, check_train_loader
from trainer.loops.after_fit import fitted_sources
from trainer.loops.hooks import Hooks, check_callbacks
from trainer.loops.manual import ManualOptimization
from trainer.loops.optim import OptimizerSetup
from trainer.loops.precision import Precision, check_precision_available, normalize_precision
from trainer.loops.stage import StageData, absorb, run_stage
from trainer.tuner import tune_before_fit


class Trainer:
    """Runs ``fit``, ``validate``, ``test`` and ``predict`` for a :class:`TrainModule`.

    All options are keyword-only. ``fit`` needs ``max_epochs`` or ``max_steps`` (or both:
    whichever ends first). ``log_dir=None`` turns TensorBoard off.
    """

    def __init__(
        self,
        *,
        strategy: str | Strategy = "auto",
        devices: str | int | list[int] = "auto",
        max_epochs: int | None = None,
        max_steps: int | None = None,
        precision: str | int = "32",
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
        check_val_every_n_epoch: int | None = 1,
        val_check_interval: int | float | None = None,
        log_every_n_steps: int = 50,
        log_dir: str | os.PathLike | None = "runs",
        callbacks: Iterable[Callback] | None = None,
        enable_progress_bar: bool = True,
        enable_checkpointing: bool = True,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        seed: int | None = None,
        deterministic: bool = False,
        optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None,
        name: str = "default",
        sync_batchnorm: bool = False,
        num_sanity_val_steps: int = 2,
        fast_dev_run: bool | int = False,
        overfit_batches: int | float = 0,
        enable_model_summary: bool = True,
        batched_fetching: bool = True,
        data_on_device: bool = False,
        compile: bool | dict[str, Any] = False,
    ) -> None:
        self.max_epochs = positive_int("max_epochs", max_epochs, allow_none=True)
        self.max_steps = positive_int("max_steps", max_steps, allow_none=True)
        self.precision = normalize_precision(precision)
        self.accumulate_grad_batches = positive_int("accumulate_grad_batches", accumulate_grad_batches)
        self.gradient_clip_val = positive_number("gradient_clip_val", gradient_clip_val)
        self.gradient_clip_algorithm = one_of("gradient_clip_algorithm", gradient_clip_algorithm, ("norm", "value"))
        self.check_val_every_n_epoch = positive_int("check_val_every_n_epoch", check_val_every_n_epoch, allow_none=True)
        self.val_check_interval = interval("val_check_interval", val_check_interval)
        self.log_every_n_steps = positive_int("log_every_n_steps", log_every_n_steps)
        if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
            raise TypeError(f"log_dir={log_dir!r} must be a path (str or os.PathLike), or None to turn logging off.")
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        if not isinstance(name, str) or not name or os.sep in name or name in (".", ".."):
            raise (ValueError if isinstance(name, str) else TypeError)(
                f"name={name!r} names the run folder: a non-empty string without {os.sep!r}, and not '.' or '..'."
            )
        self.name = name
        self.enable_progress_bar = flag("enable_progress_bar", enable_progress_bar)
        self.enable_checkpointing = flag("enable_checkpointing", enable_checkpointing)
        self.limit_train_batches = limit("limit_train_batches", limit_train_batches, allow_zero=False)
        self.limit_val_batches = limit("limit_val_batches", limit_val_batches)
        self.limit_test_batches = limit("limit_test_batches", limit_test_batches)
        self.limit_predict_batches = limit("limit_predict_batches", limit_predict_batches)
        if seed is not None and positive_int("seed", seed, minimum=0) >= 2**32:
            raise ValueError(f"seed={seed!r} must be < 2**32 (the range numpy's and torch's generators accept).")
        self.seed = seed
        self.deterministic = flag("deterministic", deterministic)
        if optimizer is not None and not callable(optimizer):
            raise TypeError(
                f"optimizer={optimizer!r} must be a callable that takes the parameters, "
                "e.g. optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)."
            )
        self._optimizer_factory = optimizer
        self.num_sanity_val_steps = positive_int("num_sanity_val_steps", num_sanity_val_steps, minimum=-1)
        self.enable_model_summary = flag("enable_model_summary", enable_model_summary)
        self.batched_fetching = flag("batched_fetching", batched_fetching)  # trainer/data/fetch.py says when it applies
        self.data_on_device = flag("data_on_device", data_on_device)
        if self.data_on_device and not self.batched_fetching:
            raise ValueError(
                "data_on_device=True indexes each TensorDataset on the device, one call per batch, which is "
                "batched fetching; it needs batched_fetching=True (the default)."
            )
        self.compile = compile_options(compile)  # None, or torch.compile's keyword arguments
        self.overfit_batches = limit("overfit_batches", overfit_batches)
        if self.overfit_batches:  # train and validate on the same first batches, in order
            self.limit_train_batches = self.limit_val_batches = self.overfit_batches
        self.fast_dev_run = fast_dev_run_batches(fast_dev_run)
        if self.fast_dev_run:  # n batches of each loader, one epoch, nothing written
            n = self.fast_dev_run
            self.max_epochs, self.max_steps, self.num_sanity_val_steps = 1, None, 0
            self.limit_train_batches = self.limit_val_batches = self.limit_test_batches = self.limit_predict_batches = n
            self.check_val_every_n_epoch, self.val_check_interval = 1, None
            self.log_dir, self.enable_checkpointing, self.enable_progress_bar, self.enable_model_summary = None, False, False, False
        self.sanity_checking = False  # True while the sanity check runs
        self._strategy = select_strategy(strategy, devices)
        self.sync_batchnorm = flag("sync_batchnorm", sync_batchnorm)
        self._strategy.sync_batchnorm = self.sync_batchnorm or self._strategy.sync_batchnorm
        given = check_callbacks(callbacks)
        if self.fast_dev_run:  # no bar, no files: a configured bar, logger or checkpointer is left out too
            given = [cb for cb in given if not isinstance(cb, (ProgressBar, TensorBoardLogger, ModelCheckpoint, ModelSummary))]
        self.callbacks: list[Callback] = given + self._default_callbacks(given)
        self.state = TrainerState()
        self.callback_metrics: dict[str, float] = {}
        self.logged_metrics: dict[str, float] = {}  # the epoch means of the phase that just ended
        self.train_epoch_metrics: dict[str, float] = {}  # the last training epoch's means
        self.prog_bar_names: set[str] = set()  # names logged with prog_bar=True
        # Training samples this process has stepped through, updated every log_every_n_steps steps
        # and at each epoch's end (TensorBoard's throughput reads it then).
        self.samples_seen = 0
        self.run_dir: str | None = None  # <log_dir>/<name>/version_<n>, set by the TensorBoard logger
        self._fetching = Fetching(self.batched_fetching)  # a stage's, with data_on_device on its device
        self.grad_norm: torch.Tensor | None = None
        self.num_training_batches: int | float = math.inf
        self.val_dataloaders: Any = None  # the validation loader of the fit that runs, or None
        self.optimizer: torch.optim.Optimizer | None = None  # the first (under automatic optimization, the only) one
        self.lr_scheduler: Any = None
        self.optimizers: list[torch.optim.Optimizer] = []  # all, in configure_optimizers' order
        self.lr_schedulers: list[Any] = []
        self._opt: OptimizerSetup | None = None
        self._manual: ManualOptimization | None = None  # set while a fit with automatic_optimization=False runs
        self._module: TrainModule | None = None
        # The last fit's (model, datamodule, val_dataloaders); the last predict's state, which writers read.
        self._fitted: tuple[Any, Any, Any] | None = None; self.predict_loop: Any = None
        self._precision: Precision | None = None
        self._hooks = Hooks([])
        self._signals = StopSignals()
        self._skip_step = False  # set by skip_optimizer_step() for the step about to happen
        self._step_skipped = False  # whether the last optimizer step was skipped
        self._train_sink: MetricSink | None = None
        self._step_cache: tuple[int, dict[str, float]] = (-1, {})
        self._epoch_complete = False
        self._epoch_start: dict[str, Any] | None = None  # RNG that re-creates this epoch's order
        self._epoch_loader: Any = None  # the training loader; checkpoints record its generators

    def _default_callbacks(self, given: list[Callback]) -> list[Callback]:
        """The built-ins, except those the user passed configured (e.g. ``ProgressBar(refresh_s=1)``):
        two bars would both draw, and two loggers or checkpointers would write the same files."""

        def wanted(kind: type) -> bool:
            return not any(isinstance(cb, kind) for cb in given)

        extra: list[Callback] = []
        if self.enable_progress_bar and wanted(ProgressBar):
            extra.append(ProgressBar())
        if self.log_dir is not None and wanted(TensorBoardLogger):
            extra.append(TensorBoardLogger())
        if self.enable_checkpointing and wanted(ModelCheckpoint):
            extra.append(ModelCheckpoint())
        if self.enable_model_summary and wanted(ModelSummary):
            extra.append(ModelSummary())
        return extra

    # --- what users read ---------------------------------------------------------------
    @property
    def strategy(self) -> Strategy:
        return self._strategy

    @property
    def global_step(self) -> int:
        return self.state.global_step

    @property
    def current_epoch(self) -> int:
        return self.state.current_epoch

    @property
    def should_stop(self) -> bool:
        return self.state.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        """Callbacks set this to end fit at the next step boundary (agreed across ranks)."""
        self.state.should_stop = bool(value)

    @property
    def estimated_stepping_batches(self) -> int | float:
        """The optimizer steps ``fit`` makes in all (from step 0, a resumed run included):
        ``max_steps``, or ``max_epochs`` epochs of this process's batches (its shard under DDP,
        after ``limit_train_batches``) in groups of ``accumulate_grad_batches``, the epoch's
        last short group counting as a step; whichever is fewer. ``math.inf`` for an unsized
        loader without ``max_steps``. Known from ``configure_optimizers`` on."""
        if self.state.stage != "fit" and self._opt is None:
            raise RuntimeError(
                "trainer.estimated_stepping_batches is known once fit has its loaders: read it in "
                "configure_optimizers (e.g. for OneCycleLR's total_steps) or later during fit."
            )
        batches = self.num_training_batches
        per_epoch = math.inf if batches == math.inf else math.ceil(batches / self.accumulate_grad_batches)
        by_epochs = math.inf if self.max_epochs is None else per_epoch * self.max_epochs
        return min(math.inf if self.max_steps is None else self.max_steps, by_epochs)

    @property
    def is_global_zero(self) -> bool:
        return self._strategy.is_global_zero

    @property
    def world_size(self) -> int:
        return self._strategy.world_size

    @property
    def module(self) -> TrainModule | None:
        return self._module

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        return next((cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint)), None)

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
        datamodule: DataModule | None = None, *, ckpt_path: str | os.PathLike | None = None,
    ) -> None:
        """Train ``model``; the order of events is in :class:`trainer.fit_loop.FitLoop`.

        The data comes from the loaders given, a ``datamodule``, or the model's own
        ``train_dataloader()`` and ``val_dataloader()``. ``val_dataloaders`` may be several
        loaders (a list or a dict)."""
        check_model(model)
        if isinstance(train_dataloaders, DataModule) and datamodule is None:  # fit(model, dm), as Lightning allows
            train_dataloaders, datamodule = None, train_dataloaders
        check_sources("fit", model, {"train_dataloaders": train_dataloaders, "val_dataloaders": val_dataloaders}, datamodule)
        if train_dataloaders is not None:
            check_train_loader(train_dataloaders)
        check_loaders("val_dataloaders", val_dataloaders)
        if self.max_epochs is None and self.max_steps is None:
            raise ValueError("fit needs an end: pass Trainer(max_epochs=...) or Trainer(max_steps=...), or both.")
        check_ckpt_path(ckpt_path)
        self._fitted = (model, datamodule, val_dataloaders)  # for validate/test/predict without a model
        tune_before_fit(self, model, train_dataloaders, val_dataloaders, datamodule)  # LearningRateFinder, BatchSizeFinder
        self._launch("fit", model, train_dataloaders, val_dataloaders, ckpt_path, datamodule)

    def validate(
        self, model: TrainModule | None = None, dataloaders: Any = None, ckpt_path: str | os.PathLike | None = None,
        datamodule: DataModule | None = None,
    ) -> Any:
        """The means of what ``validation_step`` logged (one dict; with several loaders, one
        per loader, in a list or dict as they were given). ``ckpt_path`` ("best", "last" or a
        file) evaluates that checkpoint's weights, at its step. The training counters stay.
        No model, after fit: fit's model and data, the best checkpoint (``after_fit.py``)."""
        return self._evaluate("validate", model, dataloaders, ckpt_path, datamodule)

    def test(
        self, model: TrainModule | None = None, dataloaders: Any = None, ckpt_path: str | os.PathLike | None = None,
        datamodule: DataModule | None = None,
    ) -> Any:
        """The means of what ``test_step`` logged, as ``validate`` returns them."""
        return self._evaluate("test", model, dataloaders, ckpt_path, datamodule)

    def predict(
        self, model: TrainModule | None = None, dataloaders: Any = None, datamodule: DataModule | None = None,
        return_predictions: bool | None = None, ckpt_path: str | os.PathLike | None = None,
    ) -> Any:
        """``predict_step``'s outputs, in the loader's order (one list per loader with several).
        Under DDP, global rank 0 gets every rank's (on the CPU) and the other ranks get None.
        ``return_predictions=False`` keeps nothing, returns None: see ``callbacks.BasePredictionWriter``."""
        if return_predictions is not None and not isinstance(return_predictions, bool):
            raise TypeError(f"return_predictions={return_predictions!r} must be True, False or None (True).")
        return self._evaluate("predict", model, dataloaders, ckpt_path, datamodule, return_predictions is not False)

    def _evaluate(self, stage: str, model: Any, dataloaders: Any, ckpt_path: Any, datamodule: Any, keep: bool = True) -> Any:
        if model is None:  # after fit: its model and data, and the best checkpoint's weights
            model, dataloaders, datamodule, ckpt_path = fitted_sources(self, stage, dataloaders, datamodule, ckpt_path)
        check_model(model, needs_training_step=False)
        step = {"validate": "validation_step", "test": "test_step", "predict": "predict_step"}[stage]
        if not callable(getattr(model, step, None)):
            raise TypeError(f"trainer.{stage}() needs {type(model).__name__}.{step}(self, batch, batch_idx).")
        if isinstance(dataloaders, DataModule) and datamodule is None:
            dataloaders, datamodule = None, dataloaders
        check_sources(stage, model, {"dataloaders": dataloaders}, datamodule)
        check_loaders("dataloaders", dataloaders)
        check_ckpt_path(ckpt_path, evaluating=True)
        if ckpt_path is not None and os.fspath(ckpt_path) == "best":
            ckpt_path = best_checkpoint(self.checkpoint_callback)
        return self._launch(stage, model, dataloaders, None, ckpt_path, datamodule, keep)

    def _launch(self, stage: str, model: Any, loader: Any, val_loader: Any, ckpt_path: Any, datamodule: Any = None, keep: bool = True) -> Any:
        """Run ``stage`` in the strategy's processes (``stage.run_stage``) and take back its results."""
        check_precision_available(self.precision)  # here, not in each of several DDP workers
        data = StageData(loader, val_loader, datamodule, keep)
        return absorb(self, model, self._strategy.launch(run_stage, self, stage, model, data, ckpt_path))

    # --- checkpoints -------------------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Write the full training state to ``path`` (rank 0 writes; every rank must call)."""
        if self._opt is None:  # no fit ran in this process: its optimizer state is elsewhere, or nowhere
            after_spawn = self._module is None and self._strategy.spawned and self.global_step > 0
            raise RuntimeError(
                f"trainer.save_checkpoint({os.fspath(path)!r}) needs a fit's full state (optimizer, RNG, "
                + ("loop), which stayed in the worker processes of strategy='ddp' and ended with them; only "
                   "the weights came back. Save those with torch.save(model.state_dict(), path), use the "
                   "checkpoint the run wrote (trainer.checkpoint_callback.last_model_path), or call "
                   "save_checkpoint inside fit, from a callback." if after_spawn else
                   "loop), and no fit has run in this process. Call it during or after trainer.fit(...).")
            )
        if self._strategy.sharded_checkpoints:  # one folder, each rank writing its shards, now
            meta = capture(self, tensors=False)
            if self.is_global_zero:
                for cb in self._hooks.on_save_checkpoint:
                    cb(self, self._module, meta)
            self._strategy.save_sharded_checkpoint(meta if self.is_global_zero else None, os.fspath(path), self._opt.optimizers)
            return
        # CPU copies: a file written on a GPU loads with plain torch.load on a machine without one.
        checkpoint = self.checkpoint_state(copy=True)
        if checkpoint is not None:
            ckpt_io.save_atomic(checkpoint, path)
        self._strategy.barrier()

    def checkpoint_state(self, copy: bool = False) -> dict[str, Any] | None:
        """What ``save_checkpoint`` writes, after the ``on_save_checkpoint`` hooks, on global
        rank 0; None on the other ranks. Every rank must call it. Its tensors are the live
        model's and optimizer's, or with ``copy=True`` copies on the CPU (what the hooks
        added too), safe to write while training goes on."""
        checkpoint = capture(self)
        if not self.is_global_zero:
            return None
        for cb in self._hooks.on_save_checkpoint:
            cb(self, self._module, checkpoint)
        return snapshot(checkpoint) if copy else checkpoint

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_module"] = None  # sent separately as fit's argument
        state["val_dataloaders"] = None  # likewise (and a dataset is costly to pickle twice)
        state["_fitted"] = state["predict_loop"] = None  # a model, data, predictions: the caller's only
        return state

