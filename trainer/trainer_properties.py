"""What Lightning code reads on the Trainer: options, ranks, stages, counters, callbacks and the run's objects.

A mixin of properties over the Trainer's state, so that ``trainer.py`` keeps to the entry
points. Each reads what is already there: the options (``trainer/options.py``), the strategy,
the counters, or the current run (``trainer/loops/run.py``). Nothing here runs per step.
"""

from __future__ import annotations

import math
import operator
import os
import signal
import warnings
from typing import TYPE_CHECKING, Any, Callable

from callbacks import EarlyStopping, GradientAccumulationScheduler, ModelCheckpoint, ProgressBar
from loggers import Logger
from loggers.logger_argument import logger_list
from strategies import Strategy

from trainer.core.log_options import MetricsView
from trainer.core.state import RunningStage, TrainerFn, TrainerStatus
from strategies.precision import init_context

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.core.state import TrainerState
    from trainer.loops.run import Run
    from trainer.options import TrainerOptions


class TrainerProperties:
    """Lightning's Trainer properties. The Trainer sets ``_options``, ``_strategy``, ``_loggers``
    and ``state``, and hands the properties that read the current call's run that run through
    ``_current_run()`` (trainer.py); trainer.py also makes each value of :data:`RUN_VALUES` and
    each option a property of its own name. What Lightning documents as settable is settable."""

    _options: TrainerOptions
    _strategy: Strategy
    _current_run: Callable[[], Run]
    state: TrainerState
    callbacks: list[Any]

    # --- where this process stands ------------------------------------------------------
    @property
    def strategy(self) -> Strategy:
        return self._strategy

    @property
    def is_global_zero(self) -> bool:
        return self._strategy.is_global_zero

    @property
    def global_rank(self) -> int:
        return self._strategy.global_rank

    @property
    def local_rank(self) -> int:
        return self._strategy.local_rank

    @property
    def node_rank(self) -> int:
        """The machine's index: torchrun's GROUP_RANK, Lightning's NODE_RANK or SLURM_NODEID; 0 on one machine."""
        for name in ("GROUP_RANK", "NODE_RANK", "SLURM_NODEID"):
            if os.environ.get(name, "").isdigit():
                return int(os.environ[name])
        return 0

    @property
    def world_size(self) -> int:
        return self._strategy.world_size

    @property
    def num_devices(self) -> int:
        """Devices per machine: DDP's processes on this node, DataParallel's GPUs, else 1."""
        processes = getattr(self._strategy, "num_processes", None)
        if processes is None:
            return self._strategy.num_devices
        return max(1, processes // self.num_nodes)

    @property
    def device_ids(self) -> list[int]:
        ids = getattr(self._strategy, "device_ids", None)
        return list(ids) if ids else [self._strategy.root_device.index or 0]

    # --- the stage (Lightning's: each reads trainer.state.stage) ---------------------------
    @property
    def training(self) -> bool:
        """True while fit trains (not during its validation runs or sanity check)."""
        return self.state.stage is RunningStage.TRAINING

    @training.setter
    def training(self, value: bool) -> None:
        self._set_stage(RunningStage.TRAINING, value)

    @property
    def sanity_checking(self) -> bool:
        """True from ``on_sanity_check_start`` to ``on_sanity_check_end``."""
        return self.state.stage is RunningStage.SANITY_CHECKING

    @sanity_checking.setter
    def sanity_checking(self, value: bool) -> None:
        self._set_stage(RunningStage.SANITY_CHECKING, value)

    @property
    def validating(self) -> bool:
        """True during a validation run: fit's, or ``trainer.validate``'s (not the sanity check)."""
        return self.state.stage is RunningStage.VALIDATING

    @validating.setter
    def validating(self, value: bool) -> None:
        self._set_stage(RunningStage.VALIDATING, value)

    @property
    def testing(self) -> bool:
        return self.state.stage is RunningStage.TESTING

    @testing.setter
    def testing(self, value: bool) -> None:
        self._set_stage(RunningStage.TESTING, value)

    @property
    def predicting(self) -> bool:
        return self.state.stage is RunningStage.PREDICTING

    @predicting.setter
    def predicting(self, value: bool) -> None:
        self._set_stage(RunningStage.PREDICTING, value)

    @property
    def evaluating(self) -> bool:
        """Validating, testing or sanity checking."""
        return self.state.stage is not None and self.state.stage.evaluating

    def _set_stage(self, stage: RunningStage, on: bool) -> None:
        """Lightning's setters: True makes ``stage`` the running one; False clears it if it runs."""
        if on:
            self.state.stage = stage
        elif self.state.stage is stage:
            self.state.stage = None

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
        """Set it to end fit at the next step boundary (agreed across ranks), once min_epochs and min_steps are met."""
        self.state.should_stop = bool(value)

    @property
    def interrupted(self) -> bool:
        """True once an entry point ended by an exception: a stop signal, Ctrl+C or an error."""
        return self.state.status is TrainerStatus.INTERRUPTED

    @property
    def estimated_stepping_batches(self) -> int | float:
        """The optimizer steps ``fit`` makes in all (from step 0, a resumed run included):
        ``max_steps``, or ``max_epochs`` epochs of this process's batches (its shard under DDP,
        after ``limit_train_batches``) in groups of ``accumulate_grad_batches``, the epoch's
        last short group counting as a step (a GradientAccumulationScheduler's groups per epoch);
        whichever is fewer. ``math.inf`` for an unsized
        loader without ``max_steps``. Known from ``configure_optimizers`` on."""
        run = self._current_run()
        if self.state.fn is not TrainerFn.FITTING and run.opt is None:
            raise RuntimeError(
                "trainer.estimated_stepping_batches is known once fit has its loaders: read it in "
                "configure_optimizers (e.g. for OneCycleLR's total_steps) or later during fit."
            )
        if run.load_train is not None:  # read in configure_optimizers: fit loads its training loader now
            run.load_train()
        batches, epochs = self.num_training_batches, range(max(self.max_epochs or 0, 0))
        scheduler = next((cb for cb in self.callbacks if isinstance(cb, GradientAccumulationScheduler)), None)
        every = self.accumulate_grad_batches
        groups = [every if scheduler is None else scheduler.get_accumulate_grad_batches(e) for e in epochs]
        endless = self.max_epochs in (None, -1) or batches == math.inf
        by_epochs = math.inf if endless else sum(math.ceil(batches / g) for g in groups)
        return min(math.inf if self.max_steps in (None, -1) else self.max_steps, by_epochs)

    # --- the run's objects --------------------------------------------------------------
    @property
    def num_sanity_val_batches(self) -> list[int | float]:
        """How many batches of each validation loader the sanity check runs (Lightning's): fit's only."""
        steps = math.inf if self.num_sanity_val_steps == -1 else self.num_sanity_val_steps
        return [min(steps, batches) for batches in self.num_val_batches] if self.state.fn is TrainerFn.FITTING else []

    def init_module(self, empty_init: bool | None = None) -> Any:
        """A context manager (Lightning's): modules built inside have their tensors on the
        strategy's device and in a true precision's dtype at once; ``empty_init=True`` skips
        initializing their weights (for a model that then loads a checkpoint)::

            with trainer.init_module():
                model = MyModel()
        """
        return init_context(self.precision, self._strategy.root_device, empty_init)


    @property
    def module(self) -> TrainModule | None:
        return self._current_run().module

    @property
    def lightning_module(self) -> TrainModule | None:
        """The module being run (Lightning's name)."""
        return self._current_run().module

    @property
    def model(self) -> Any:
        """The module as the strategy wraps it during a stage (DistributedDataParallel under ddp), else the module."""
        wrapped = getattr(self._strategy, "wrapped_module", None)
        return wrapped if wrapped is not None else self._current_run().module

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        """One config per scheduler (``.scheduler``, ``.interval``, ``.monitor``), as configure_optimizers gave them:
        the list the Trainer steps, as Lightning's (a callback that takes the schedulers over, such as
        ``StochasticWeightAveraging``, empties it); a new empty list before fit."""
        opt = self._current_run().opt
        return [] if opt is None else opt.schedulers

    @property
    def at_epoch_end(self) -> bool:
        """True once a training epoch's batches are done (the validation after the last one, as
        in Lightning, runs before) until its ``on_train_epoch_end`` hooks return: a checkpoint
        taken then resumes at the next epoch."""
        return self._current_run().epoch_complete

    def publish_step_metrics(self) -> dict[str, float]:
        """During fit: this step's values logged in ``training_step``, reduced over the
        processes, into ``callback_metrics`` now rather than at the next log step (once per
        step); returns them. Every rank must call it alike. Outside fit: ``{}``."""
        publish = self._current_run().publish_step_metrics
        return {} if publish is None else publish()

    @property
    def ckpt_path(self) -> str | None:
        """The checkpoint the last ``fit`` resumed from, or ``validate``/``test``/``predict``
        evaluated ("last" and "best" resolved to the file); None if none. Set it to have the next
        calls load that file without passing ``ckpt_path=`` (Lightning's stateful use; set it
        back to None when done): a ``ckpt_path`` passed to a call wins, with a warning."""
        return self._current_run().ckpt_path

    @ckpt_path.setter
    def ckpt_path(self, path: str | os.PathLike | None) -> None:
        run = self._current_run()
        run.ckpt_path = None if path is None else os.fspath(path)
        run.ckpt_user_managed = bool(path)

    def _select_ckpt_path(self, given: Any) -> Any:
        """The ``ckpt_path`` a call uses: the one given, else the one set on ``trainer.ckpt_path``."""
        run = self._current_run()
        if not run.ckpt_user_managed:
            return given
        if given is None:
            return run.ckpt_path
        warnings.warn(
            f"`trainer.ckpt_path = {run.ckpt_path!r}` was called but then you passed `ckpt_path={given!r}`. "
            "The latter will be loaded.", stacklevel=3,
        )
        run.ckpt_path, run.ckpt_user_managed = None, False
        return given

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        return next(iter(self.checkpoint_callbacks), None)

    @property
    def checkpoint_callbacks(self) -> list[ModelCheckpoint]:
        return [cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint)]

    @property
    def early_stopping_callback(self) -> EarlyStopping | None:
        return next(iter(self.early_stopping_callbacks), None)

    @property
    def early_stopping_callbacks(self) -> list[EarlyStopping]:
        return [cb for cb in self.callbacks if isinstance(cb, EarlyStopping)]

    @property
    def progress_bar_callback(self) -> ProgressBar | None:
        return next((cb for cb in self.callbacks if isinstance(cb, ProgressBar)), None)

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """The values logged with ``prog_bar=True``: the latest of each (a step's, or an epoch's mean)."""
        run = self._current_run()
        shown = {k: v for k, v in run.callback_metrics.items() if k in self.prog_bar_names}
        shown.update(run.eval_step_bar)  # an evaluation step's (never in callback_metrics, as in Lightning)
        step = self.step_metrics(prog_bar_only=True)
        if run.epoch_values_step == self.state.global_step:  # an epoch's end came after the last step
            return {**step, **shown}
        shown.update(step)
        return shown

    @property
    def scaler(self) -> Any:
        """The float16 gradient scaler (``torch.amp.GradScaler``) under ``"16-mixed"``, else None (Lightning's)."""
        return self._strategy.precision.scaler

    @property
    def received_sigterm(self) -> bool:
        """Whether this process received SIGTERM during fit (Lightning's): fit then stops at the next step boundary."""
        return self._current_run().signals.received == signal.SIGTERM


class LoggerAccess:
    """The Trainer's ``logger``, ``loggers`` and ``log_dir``, as Lightning names them."""

    _loggers: list[Logger]
    _current_run: Callable[[], Run]  # trainer.py: the run's log_dir, once a stage resolved it
    default_root_dir: str | None

    @property
    def logger(self) -> Logger | None:
        """The first logger (None with ``logger=False``)."""
        return self._loggers[0] if self._loggers else None

    @logger.setter
    def logger(self, value: Logger | None) -> None:
        self._loggers = [] if value is None else logger_list([value])

    @property
    def loggers(self) -> list[Logger]:
        return self._loggers

    @loggers.setter
    def loggers(self, value: list[Logger] | None) -> None:
        self._loggers = [] if value is None else logger_list(value)

    @property
    def log_dir(self) -> str | None:
        """The first logger's folder (TensorBoard's ``<log_dir>/<name>/version_<n>``); without
        a logger, the Trainer's ``log_dir`` option."""
        resolved = self._current_run().log_dir
        if resolved is not None:
            return resolved
        if not self._loggers:
            return self.default_root_dir
        first = self._loggers[0]
        return getattr(first, "log_dir", None) or first.save_dir  # a Logger look-alike may have no log_dir


# The run's values that Lightning code reads as the Trainer's (trainer/loops/run.py says what each is);
# trainer.py makes each a read-only property, except those Lightning documents as settable (RUN_SETTABLE).
RUN_VALUES = (
    "datamodule", "train_dataloader", "val_dataloaders", "test_dataloaders", "predict_dataloaders", "predict_loop",
    "optimizer", "optimizers", "lr_scheduler", "lr_schedulers", "num_training_batches", "num_val_batches",
    "num_test_batches", "num_predict_batches", "train_epoch_metrics", "prog_bar_names", "samples_seen", "grad_norm",
    "is_last_batch", "run_dir", "enable_validation",
)
# Lightning's trainer.optimizers setter; its trainer.datamodule is a plain attribute (lightning_setattr sets it)
RUN_SETTABLE = ("optimizers", "datamodule")


def metrics_view(owner: str, name: str) -> property:
    """``trainer.callback_metrics`` and ``logged_metrics``: a read-only view of ``trainer.<owner>.<name>``."""
    read = operator.attrgetter(f"{owner}.{name}")
    return property(lambda trainer: MetricsView(read(trainer)), doc=f"Lightning's ``trainer.{name}``.")


def forward(owner: str, name: str, settable: bool = True) -> property:
    """A property that reads (and, if ``settable``, sets) ``trainer.<owner>.<name>``: C-level reads, as fast as an
    attribute's."""

    def set_value(trainer: Any, value: Any) -> None:
        setattr(getattr(trainer, owner), name, value)

    return property(operator.attrgetter(f"{owner}.{name}"), set_value if settable else None)
