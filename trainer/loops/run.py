"""One call's state, and how it starts and ends in each process.

A :class:`Run` is built where ``fit``, ``validate``, ``test`` or ``predict`` starts in a process
(:func:`start`), and handed to the loops, the optimization code and the checkpoint's capture
and restore; nothing reaches back into the Trainer for it. The Trainer keeps a reference to
the latest one, which its properties read (``trainer.optimizers``, ``trainer.callback_metrics``,
...). Each entry point (``fit.fit_stage``, ``evaluation.validate_stage`` and ``test_stage``,
``prediction.predict_stage``) reads as: :func:`start`, the run folder, then its work inside
:func:`stage_hooks`. This module and ``trainer/trainer.py`` are the only ones that assign the
Trainer's attributes.
"""

from __future__ import annotations

import contextlib
import copy
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple

import torch

from callbacks.base import Callback
from strategies.precision import Precision

from trainer.checkpoint.state_dicts import load_plain_state_dict
from trainer.core.metrics import log_metric
from trainer.core.module import overridden
from trainer.core.seed import seed_everything
from trainer.core.signals import StopSignals
from trainer.core.state import RunningStage, TrainerFn, TrainerState, TrainerStatus
from trainer.core.distributed import rank_zero_only
from trainer.data.fetch import Fetching
from trainer.data.loaders import prepare
from trainer.loops.hooks import Hooks, adapt_steps, check_callbacks, lightning_order, restore_steps
from trainer.checkpoint.run_dir import logger_versions, resolve_run_dir, set_logger_versions
from trainer.loops.log_writer import LogWriter
from trainer.loops.optimization.manual import ModuleOptimization
from trainer.loops.profiling import Profiling

if TYPE_CHECKING:
    from trainer.core.metrics import MetricSink
    from trainer.core.module import TrainModule
    from trainer.loops.optimization.manual import ManualOptimization
    from trainer.loops.optimization.optim import OptimizerSetup
    from trainer.loops.prediction import PredictLoop
    from trainer.trainer import Trainer


class StageData(NamedTuple):
    """What a stage's data comes from, as the caller passed it; resolved in each process."""

    loader: Any  # fit's train_dataloaders, or evaluation's dataloaders
    val_loader: Any  # fit's val_dataloaders
    datamodule: Any
    return_predictions: bool = True  # predict's: keep and return the outputs


class Run:
    """What lives for one call, in one process.

    The first group is the call's own and is built anew each time. The second is fit's: the
    optimizers, the training epoch's loader and its position, the stop flags and the last
    loss; a later ``validate``/``test``/``predict`` keeps them (``save_checkpoint`` and
    ``trainer.optimizers`` read them after fit). The third is what Lightning code reads
    through the Trainer's properties; it carries over into the next call, as the Trainer's
    attributes always did, and a fit starts its own (:data:`_FIT_KEEPS` excepted).
    """

    def __init__(self) -> None:
        # --- the call's own ------------------------------------------------------------
        self.stage = "idle"
        self.module: TrainModule | None = None
        self.precision: Precision = Precision()  # the strategy's, bound to this process's device
        self.hooks = Hooks([])
        self.fetching = Fetching(True)  # batched fetching, with data_on_device on the device
        self.signals = StopSignals()  # SIGTERM/SIGINT during fit
        self.profiling: Profiling | None = None  # the profiler's timers when it records (profiling.py), else None
        # --- fit's -------------------------------------------------------------------------
        self.opt: OptimizerSetup | None = None
        self.manual: ManualOptimization | None = None  # under automatic_optimization=False
        self.handed_out: list[Any] = []  # automatic optimization: the optimizers as the module sees them (optimizer.py)
        self.optimizer: torch.optim.Optimizer | None = None  # the first (automatic optimization: the only) one
        self.lr_scheduler: Any = None
        self.optimizers: list[torch.optim.Optimizer] = []  # all, in configure_optimizers' order
        self.lr_schedulers: list[Any] = []
        self.train_sink: MetricSink | None = None  # what training_step logs in this epoch
        self.step_cache: tuple[int, dict[str, float]] = (-1, {})
        self.epoch_loader: Any = None  # the training loader; checkpoints record its generators
        self.epoch_start: dict[str, Any] | None = None  # RNG that re-creates this epoch's order
        self.epoch_complete = False  # in the epoch's end: a checkpoint resumes at the next epoch
        self.training_rng: dict[str, Any] | None = None  # during a stop's own validation: the RNG from before it
        # In on_train_batch_end of a batch whose validation comes next: a checkpoint saved there
        # resumes with that validation, which draws what it drew in the uninterrupted run.
        self.val_pending = False
        self.skip_step = False  # set by skip_optimizer_step() for the step about to happen
        self.step_skipped = False  # whether the last optimizer step was skipped
        self.last_loss: torch.Tensor | None = None  # what an optimizer_step's closure returns
        # While fit runs: puts this step's training values (reduced across ranks) into
        # callback_metrics now, not at the next log step.
        self.publish_step_metrics: Callable[[], dict[str, float]] | None = None
        # --- what Lightning code reads on the Trainer ----------------------------------------
        self.datamodule: Any = None
        self.train_dataloader: Any = None  # fit's training loader, as the strategy prepared it
        # The evaluation loaders (Lightning's names) of the last fit or validate, test and predict, or None.
        self.val_dataloaders: Any = None
        self.enable_validation = False  # during fit: it has a validation_step, data for it and limit_val_batches > 0
        self.load_train: Callable[[], Any] | None = None  # during fit, until the training loader is loaded: loads it
        self.test_dataloaders: Any = None
        self.predict_dataloaders: Any = None
        self.ckpt_path: str | None = None  # the checkpoint the call resumed or evaluated ("last", "best" resolved)
        self.ckpt_user_managed = False  # set by the user (trainer.ckpt_path = ...): the next calls load it
        self.predict_loop: PredictLoop | None = None  # the running predict's record
        self.num_training_batches: int | float = float("inf")
        self.num_val_batches: list[int | float] = []  # per validation loader, after limit_val_batches
        self.num_test_batches: list[int | float] = []
        self.num_predict_batches: list[int | float] = []
        self.callback_metrics: dict[str, float] = {}
        self.logged_metrics: dict[str, float] = {}  # each name's latest value sent to the loggers in this call
        self.train_epoch_metrics: dict[str, float] = {}  # the last training epoch's values (Lightning's names)
        self.eval_metrics: dict[str, float] = {}  # the last validation's or test's values (written by LogWriter)
        self.prog_bar_names: set[str] = set()  # names logged with prog_bar=True
        self.epoch_values_step = -1  # the step at which the last training epoch's values were published
        self.eval_steps: dict[tuple[str, int], int] = {}  # (phase, loader) -> the last evaluation step row's step
        # The last evaluation step's values logged with on_step and prog_bar: progress_bar_metrics only (Lightning's)
        self.eval_step_bar: dict[str, float] = {}
        # Training samples this process has stepped through, updated every log_every_n_steps
        # steps and at each epoch's end.
        self.samples_seen = 0
        self.grad_norm: torch.Tensor | None = None
        self.is_last_batch = False  # during fit: the batch being trained on is its epoch's last (sized loaders)
        self.run_dir: str | None = None  # the first logger's <save_dir>/<name>/version_<n>: checkpoints go there
        self.log_dir: str | None = None  # the first logger's log_dir, once a stage resolved it

    def __getstate__(self) -> dict[str, Any]:
        """What a spawned worker gets: no model, data or predictions (those travel apart, or stay)."""
        state = self.__dict__.copy()
        state.update(module=None, datamodule=None, train_dataloader=None, val_dataloaders=None, predict_loop=None)
        state.update(load_train=None)
        state.update(test_dataloaders=None, predict_dataloaders=None, profiling=None)
        return state


# A fit starts its own record, except what it never writes: another stage's batch counts and
# the last predict's record.
_FIT_KEEPS = (
    "num_test_batches", "num_predict_batches", "predict_loop", "run_dir", "log_dir", "test_dataloaders",
    "predict_dataloaders", "ckpt_user_managed",
)
# What an evaluation does not take from the run before (callback_metrics and logged_metrics: Lightning's start
# afresh at each call).
_CALL_OWN = (
    "hooks", "signals", "profiling", "callback_metrics", "logged_metrics", "eval_metrics", "eval_steps",
    "eval_step_bar",
)


def start(trainer: Trainer, stage: str, model: TrainModule, datamodule: Any) -> Run:
    """Set this process up for ``trainer.<stage>(model, ...)`` and return its run, which the
    Trainer now refers to: seeding, the precision on this process's device, the
    callbacks (the model's own joining) and which of them override which hook. The model goes
    on its device after the ``setup`` hooks (:func:`stage_hooks`)."""
    strategy = trainer.strategy
    if trainer.seed is not None:
        seed_everything((trainer.seed + strategy.global_rank) % 2**32)
    strategy.precision.setup(strategy.root_device)  # the device is known now (ddp picks each rank's)
    run = _new_run(trainer, stage, model, datamodule)
    _attach(model, trainer, run)
    rank_zero_only.rank = strategy.global_rank
    attach_model_callbacks(trainer, model)
    _attach_logging(trainer.callbacks)
    # The loggers are written from the LogWriter, after every callback, on every rank, as Lightning's: the
    # loggers' own methods write on global rank 0 only (rank_zero_only), a user's logger may write on each.
    # Predict writes no row; its end finalizes the loggers, as Lightning's.
    writer = [LogWriter(trainer.loggers, run)] if trainer.loggers else []
    run.profiling = Profiling.of(trainer.profiler)
    run.hooks = Hooks(trainer.callbacks, model, tail=writer, profiling=run.profiling)
    return run


def _new_run(trainer: Trainer, stage: str, model: TrainModule, datamodule: Any) -> Run:
    """A fit starts from nothing (counters, monitors, optimizers); an evaluation keeps fit's, and
    changes only what it runs."""
    previous, run = trainer._run, Run()
    if stage == "fit":
        for name in _FIT_KEEPS:
            setattr(run, name, getattr(previous, name))
        # From where the last fit ended (Lightning's: a fit of a trainer that reached max_epochs
        # trains no more), or from the checkpoint's step.
        done = trainer.state
        trainer.state = TrainerState(
            TrainerStatus.RUNNING, TrainerFn.FITTING, RunningStage.TRAINING, done.global_step, done.current_epoch,
            done.batches_stepped,
        )
    else:
        fresh, run = run, copy.copy(previous)
        for name in _CALL_OWN:
            setattr(run, name, getattr(fresh, name))
        # evaluation never moves the training counters
        state = trainer.state
        state.fn, state.status, state.stage = TrainerFn(stage), TrainerStatus.RUNNING, RunningStage(stage)
    run.stage, run.module, run.datamodule = stage, model, datamodule
    run.precision = trainer.strategy.precision
    trainer._run = run
    return run


def _attach(model: TrainModule, trainer: Trainer, run: Run) -> None:
    """The module's links for this call: its Trainer, and the run's optimization, which its
    ``optimizers()``, ``manual_backward`` and ``clip_gradients`` call (manual.py)."""
    model._trainer, model._optimization = trainer, ModuleOptimization(trainer, run)


def record_data(trainer: Trainer, datamodule: Any, **loaders: Any) -> None:
    """After a batch-size search (tuner/batch_size.py): the Trainer's run records the DataModule and
    the loaders (``train_dataloader=``, ``val_dataloaders=``, ...) the method would now run with, as Lightning's."""
    run = trainer._run
    run.datamodule = datamodule
    for name, loader in loaders.items():
        setattr(run, name, loader)


def use_run_folder(trainer: Trainer, run: Run, resume: str | None = None, fit: bool = False) -> None:
    """The run folder (the first logger's ``<save_dir>/<name>/version_<n>``), picked on global
    rank 0 for every rank: a fit's own (the resumed run's when ``resume`` lies in one, else a
    new one); an evaluation's, fit's or else the loggers' current one."""
    strategy = trainer.strategy
    run.run_dir, run.log_dir, versions = strategy.broadcast_object(
        resolve_run_dir(trainer, resume, fit) if strategy.is_global_zero else None
    )
    set_logger_versions(trainer, versions)  # every rank's loggers name rank 0's folders


@contextlib.contextmanager
def stage_hooks(trainer: Trainer, run: Run) -> Iterator[None]:
    """Around an entry point's work: the DataModule's ``prepare_data`` and ``setup``, the ``setup`` hooks, the model on
    its device (``configure_model`` first, as Lightning); on an error the ``on_exception`` hooks; then ``teardown``,
    whatever happened."""
    strategy, model, datamodule, stage = trainer.strategy, run.module, run.datamodule, run.stage
    if datamodule is not None:
        datamodule.trainer = trainer
    profiling = run.profiling
    if profiling is not None:  # before the setup hooks, as Lightning's; trainer.log_dir is known
        profiling.begin_stage(trainer, stage, model)
    prepare(strategy, model, datamodule)  # prepare_data: once per machine, the others wait
    if datamodule is not None:
        datamodule.setup(stage=stage)
    run.hooks.call("setup", trainer, model, stage=stage)  # by keyword, as Lightning calls them
    _model_on_device(trainer, run, model)
    on_device = trainer.data_on_device and strategy.root_device.type != "cpu"
    run.fetching = Fetching(trainer.batched_fetching, strategy.root_device if on_device else None)
    adapted = adapt_steps(model)  # steps defined without batch_idx
    try:
        yield
    except BaseException as err:
        trainer.state.status = TrainerStatus.INTERRUPTED  # before on_exception, as in Lightning
        strategy.on_exception(err)
        in_caller = strategy.spawned and strategy.on_exception_in_caller  # Lightning's ddp_spawn: only the loggers here
        for fn in run.hooks.on_exception:
            if not in_caller or isinstance(getattr(fn, "__self__", None), LogWriter):
                fn(trainer, model, err)
        if datamodule is not None and not in_caller:
            datamodule.on_exception(err)
        raise
    finally:
        restore_steps(model, adapted)
        run.fetching = Fetching(trainer.batched_fetching)  # the dataset copies on the device go
        run.hooks.call("teardown", trainer, model, stage=stage)
        if datamodule is not None:
            datamodule.teardown(stage=stage)
        if trainer.compile is not None:  # hand the model back as it came: nn.Module.compile() undone
            model._compiled_call_impl = None
        if profiling is not None:  # the report, on every rank, after the teardown hooks (Lightning's)
            profiling.end_stage()


def _model_on_device(trainer: Trainer, run: Run, model: TrainModule) -> None:
    """``configure_model`` (after ``setup``, as in Lightning), a true precision, the strategy's
    wrapper, compile."""
    strategy = trainer.strategy
    if overridden(model, "configure_model"):  # lazily built layers: before the strategy wraps them
        with run.precision.module_init_context():  # a true precision's dtype, as Lightning's
            model.configure_model()
    run.precision.convert_module(model)  # a true precision ("bf16-true", "64-true"): before any wrapper
    strategy.setup_module(model)
    if trainer.compile is not None:  # lazily: the first step compiles (the bar says so)
        strategy.compile(trainer.compile)


def attach_model_callbacks(trainer: Trainer, model: Any) -> None:
    """``configure_callbacks()``: the model's callbacks join the Trainer's, each replacing the
    Trainer's callbacks of its type (Lightning's rule)."""
    if not overridden(model, "configure_callbacks"):
        return
    extra = model.configure_callbacks()
    extra = [extra] if isinstance(extra, Callback) else list(extra or [])
    check_callbacks(extra)
    types = {type(cb) for cb in extra}
    trainer.callbacks = lightning_order([cb for cb in trainer.callbacks if type(cb) not in types] + extra)


def report(trainer: Trainer, output: Any, weights: dict[str, torch.Tensor]) -> dict[str, Any]:
    """In a spawned worker of global rank 0, after its stage: what the caller's model and Trainer need (``absorb``)."""
    run = trainer._run
    return {
        "output": output,
        "model": {k: v.detach().cpu() for k, v in weights.items()},
        "state": vars(trainer.state),
        "callback_metrics": run.callback_metrics,
        "logged_metrics": run.logged_metrics,
        "run_dir": (run.run_dir, run.log_dir, logger_versions(trainer)),
        "callbacks": [cb.state_dict() for cb in trainer.callbacks],
        "ckpt_path": run.ckpt_path,
        "profiler": trainer.profiler,  # what rank 0 recorded
        "batches": (run.num_training_batches, run.num_val_batches, run.num_test_batches),
    }


def _attach_logging(callbacks: list[Callback]) -> None:
    """``self.log``/``self.log_dict`` in a callback's hooks log as the module's do (Lightning gives
    each callback the module's). Plain functions, not the module's bound methods: a callback
    copied or pickled does not take the model along. A callback's own ``log`` (a method, or an
    attribute such as a list it records into) is kept."""
    for cb in callbacks:
        if not hasattr(cb, "log"):
            cb.log = log_metric
        if not hasattr(cb, "log_dict"):
            cb.log_dict = _log_dict


def _log_dict(dictionary: Any, **options: Any) -> None:
    if not hasattr(dictionary, "items"):
        raise TypeError(f"self.log_dict({dictionary!r:.80}) takes a dict of name -> value (or a MetricCollection).")
    for name, value in dictionary.items():
        log_metric(name, value, **options)


def absorb(trainer: Trainer, model: TrainModule, datamodule: Any, result: Any) -> Any:
    """In the caller, after a spawned run: copy rank 0's results into ``model`` and ``trainer``."""
    if not trainer.strategy.spawned:
        return result
    on_meta = any(p.is_meta for p in model.parameters())  # built on the meta device: take the tensors
    load_plain_state_dict(model, result["model"], assign=on_meta)  # plain keys, also into compiled submodules
    run = copy.copy(trainer._run)  # the caller's record of the call: what the workers reported
    run.module, run.datamodule = model, datamodule
    trainer.state = TrainerState(**result["state"])
    run.callback_metrics, run.logged_metrics = result["callback_metrics"], result["logged_metrics"]
    run.run_dir, run.log_dir, versions = result["run_dir"]
    run.num_training_batches, run.num_val_batches, run.num_test_batches = result["batches"]
    run.ckpt_path = result["ckpt_path"]
    trainer._run = run
    _attach(model, trainer, run)
    set_logger_versions(trainer, versions)  # the folders rank 0 picked
    attach_model_callbacks(trainer, model)  # as the workers did, so that the lists match
    for cb, state in zip(trainer.callbacks, result["callbacks"]):
        if state is not None:  # a subclass's state_dict() that returns nothing (it only counts calls) has none to give
            cb.load_state_dict(state)
    trainer.profiler = result["profiler"]
    return result["output"]


def caller_on_exception(trainer: Trainer, model: TrainModule, datamodule: Any, err: BaseException) -> None:
    """In the caller, when a stage its workers ran failed under Lightning's ``ddp_spawn``
    (``strategy.on_exception_in_caller``): the callbacks', model's and DataModule's ``on_exception``
    hooks, once, with the error the caller raises, as Lightning's launcher does."""
    for callback in trainer.callbacks:
        callback.on_exception(trainer, model, err)
    model.on_exception(err)
    if datamodule is not None:
        datamodule.on_exception(err)
