"""The Trainer: owns the loop, the optimizer and checkpoints; delegates devices to a Strategy."""

from __future__ import annotations

import collections.abc
import contextlib
import logging
import math
import os
import signal
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import torch
from torch import nn

from callbacks.base import Callback

from . import checkpoint as ckpt_io
from ._checks import (
    bad_loss, check_callbacks, check_ckpt_path, check_loader, check_model, flag, interval, limit, loss_of, one_of,
    positive_int, positive_number,
)
from ._hooks import Hooks
from ._run_dir import run_dir
from ._resume import Resume, capture, resolve_path
from ._signals import Interrupted, StopSignals
from .data import batch_size, loader_length, uniform_batches
from .metrics import MetricSink, set_sink
from .module import TrainModule
from .optim import OptimizerSetup, resolve_optimizers
from .precision import Precision, check_precision_available, normalize_precision
from .seed import seed_everything
from .state import TrainerState

if TYPE_CHECKING:
    from strategies import Strategy

log = logging.getLogger("trainer")
_STOP_SYNC_EVERY = 8  # optimizer steps between cross-rank checks of stop requests (DDP)


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
        # Imported here: strategies import trainer's helpers, and a spawned DDP worker
        # imports the strategies package first (to find its entry point).
        from strategies import select_strategy

        self._strategy = select_strategy(strategy, devices)
        given = check_callbacks(callbacks)
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
        self.grad_norm: torch.Tensor | None = None
        self.num_training_batches: int | float = math.inf
        self.val_dataloaders: Any = None  # the validation loader of the fit that runs, or None
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: Any = None
        self._opt: OptimizerSetup | None = None
        self._module: TrainModule | None = None
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
        from callbacks import ModelCheckpoint, ProgressBar, TensorBoardLogger

        def wanted(kind: type) -> bool:
            return not any(isinstance(cb, kind) for cb in given)

        extra: list[Callback] = []
        if self.enable_progress_bar and wanted(ProgressBar):
            extra.append(ProgressBar())
        if self.log_dir is not None and wanted(TensorBoardLogger):
            extra.append(TensorBoardLogger())
        if self.enable_checkpointing and wanted(ModelCheckpoint):
            extra.append(ModelCheckpoint())
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
    def is_global_zero(self) -> bool:
        return self._strategy.is_global_zero

    @property
    def world_size(self) -> int:
        return self._strategy.world_size

    @property
    def module(self) -> TrainModule | None:
        return self._module

    @property
    def checkpoint_callback(self) -> Callback | None:
        from callbacks import ModelCheckpoint

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
    def fit(self, model: TrainModule, train_dataloaders: Any, val_dataloaders: Any = None, *, ckpt_path: str | os.PathLike | None = None) -> None:
        check_model(model)
        check_loader("train_dataloaders", train_dataloaders)
        if val_dataloaders is not None:
            check_loader("val_dataloaders", val_dataloaders)
        if self.max_epochs is None and self.max_steps is None:
            raise ValueError("fit needs an end: pass Trainer(max_epochs=...) or Trainer(max_steps=...), or both.")
        check_ckpt_path(ckpt_path)
        check_precision_available(self.precision)  # here, not in each of several DDP workers
        result = self._strategy.launch(self._run, "fit", model, train_dataloaders, val_dataloaders, ckpt_path)
        self._absorb(model, result)

    def validate(self, model: TrainModule, dataloaders: Any) -> dict[str, float]:
        return self._evaluate("validate", model, dataloaders)

    def test(self, model: TrainModule, dataloaders: Any) -> dict[str, float]:
        return self._evaluate("test", model, dataloaders)

    def predict(self, model: TrainModule, dataloaders: Any) -> list[Any]:
        check_model(model, needs_training_step=False)
        check_loader("dataloaders", dataloaders)
        check_precision_available(self.precision)
        result = self._strategy.launch(self._run, "predict", model, dataloaders, None, None)
        return self._absorb(model, result)

    def _evaluate(self, stage: str, model: TrainModule, dataloaders: Any) -> dict[str, float]:
        check_model(model, needs_training_step=False)
        step = "validation_step" if stage == "validate" else "test_step"
        if not callable(getattr(model, step, None)):
            raise TypeError(f"trainer.{stage}() needs {type(model).__name__}.{step}(self, batch, batch_idx).")
        check_loader("dataloaders", dataloaders)
        check_precision_available(self.precision)
        result = self._strategy.launch(self._run, stage, model, dataloaders, None, None)
        return self._absorb(model, result)

    # --- one run, inside each training process ------------------------------------------
    def _run(self, stage: str, model: TrainModule, loader: Any, val_loader: Any, ckpt_path: Any) -> Any:
        strategy = self._strategy
        strategy.setup_environment()
        try:
            output = self._run_stage(stage, model, loader, val_loader, ckpt_path)
        finally:
            self.state.stage = "idle"
            strategy.teardown()
        if not strategy.spawned:
            return output
        # A spawned worker: rank 0 sends back what the caller's model and trainer need.
        if not strategy.is_global_zero:
            return None
        return {
            "output": output,
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "state": vars(self.state),
            "callback_metrics": self.callback_metrics,
            "logged_metrics": self.logged_metrics,
            "run_dir": self.run_dir,
            "callbacks": [cb.state_dict() for cb in self.callbacks],
        }

    def _run_stage(self, stage: str, model: TrainModule, loader: Any, val_loader: Any, ckpt_path: Any) -> Any:
        strategy = self._strategy
        if self.seed is not None:
            seed_everything((self.seed + strategy.global_rank) % 2**32)
        if self.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
            torch.backends.cudnn.benchmark = False
        self._precision = strategy.precision = Precision(self.precision, strategy.root_device)
        self._module = model
        model._trainer = self
        strategy.setup_module(model)
        self._hooks = Hooks(self.callbacks)
        self.state = TrainerState(stage=stage)
        ckpt_path = resolve_path(self, ckpt_path)
        # predict logs nothing, so it gets no run folder.
        if self.log_dir is not None and stage != "predict" and (self.run_dir is None or stage == "fit"):
            self.run_dir = strategy.broadcast_object(
                run_dir(self.log_dir, self.name, ckpt_path) if strategy.is_global_zero else None
            )
        self._hooks.call("setup", self, model, stage)
        try:
            if stage == "fit":
                self._fit(model, loader, val_loader, ckpt_path)
                return None
            loader = strategy.process_dataloader(loader, stage)
            if stage == "predict":
                outputs = self._eval_loop("predict", loader, self.limit_predict_batches)
                return [o for part in strategy.gather_objects(outputs) for o in part]
            phase, limit = ("validation", self.limit_val_batches) if stage == "validate" else ("test", self.limit_test_batches)
            self._eval_loop(phase, loader, limit)
            return dict(self.logged_metrics)
        except BaseException as err:
            for fn in self._hooks.on_exception:
                fn(self, model, err)
            raise
        finally:
            self._hooks.call("teardown", self, model, stage)

    def _absorb(self, model: TrainModule, result: Any) -> Any:
        """After a spawned run, copy rank 0's results into the caller's model and trainer."""
        if not self._strategy.spawned:
            return result
        model.load_state_dict(result["model"])
        self.state = TrainerState(**result["state"])
        self.callback_metrics, self.logged_metrics = result["callback_metrics"], result["logged_metrics"]
        self.run_dir = result["run_dir"]
        for cb, state in zip(self.callbacks, result["callbacks"]):
            cb.load_state_dict(state)
        return result["output"]

    def _fit(self, model: TrainModule, train_loader: Any, val_loader: Any, ckpt_path: Any) -> None:
        strategy = self._strategy
        self._opt = resolve_optimizers(model, self._optimizer_factory)
        self.optimizer, self.lr_scheduler = self._opt.optimizer, self._opt.scheduler
        train_loader = strategy.process_dataloader(train_loader, "train")
        val_loader = None if val_loader is None else strategy.process_dataloader(val_loader, "validate")
        n = loader_length(train_loader)
        if n == 0:
            raise ValueError("train_dataloaders has no batches (len 0). Check the dataset size, batch_size and drop_last.")
        self.num_training_batches = _limited(n, self.limit_train_batches)
        self.val_dataloaders = val_loader  # callbacks read it (EarlyStopping: is there validation?)
        counts = strategy.gather_objects(self.num_training_batches)
        if len(set(counts)) > 1:
            raise ValueError(
                f"The processes have different numbers of training batches per epoch: {counts} (by rank). "
                "Every step all-reduces gradients, so a rank that runs out first would wait forever for the "
                "others. Let the Trainer shard a plain DataLoader (DistributedSampler pads to equal lengths), "
                f"give each rank the same number of batches, or set limit_train_batches<={min(counts)}."
            )
        resume = Resume.load(self, ckpt_path)
        if self.is_global_zero:
            log.info("%s", self._fit_summary(train_loader))
        with self._signals:
            self._fit_loop(model, train_loader, val_loader, resume)
        if self._signals.received is not None:  # came after the last stop check: finished, but say so
            raise Interrupted(
                f"{signal.Signals(self._signals.received).name} arrived after the last step boundary; training "
                f"had finished (step {self.state.global_step}) and its checkpoints are complete.",
                self._signals.received,
            )

    def _fit_summary(self, train_loader: Any) -> str:
        """E.g. 'Training with ddp (gloo) on cpu; 2 device(s), world size 2;
        global batch 64 = 16 per device x 2 device(s) x 2 accumulation.'"""
        strategy, accumulate = self._strategy, self.accumulate_grad_batches
        devices = strategy.num_devices * strategy.world_size
        tail = f"x {devices} device(s) x {accumulate} accumulation"
        loader_batch = getattr(train_loader, "batch_size", None)  # per process; dp splits it across its devices
        if loader_batch:
            total = loader_batch * strategy.world_size * accumulate
            batch = f"{total} = {loader_batch / strategy.num_devices:g} per device {tail}"
        else:
            batch = f"= per-device batch {tail}"
        return f"Training with {strategy.describe()}; {devices} device(s), world size {strategy.world_size}; global batch {batch}."

    def _fit_loop(self, model: TrainModule, train_loader: Any, val_loader: Any, resume: Resume) -> None:
        """The order of events, which is the contract callbacks rely on::

            setup("fit")                          (in _run)
            on_fit_start
            on_train_start
            for each epoch until max_epochs, max_steps or a stop request:
                on_train_epoch_start
                for each batch (a resumed run skips the consumed ones at the sampler):
                    on_train_batch_start
                    strategy.no_backward_sync() held from an accumulation group's first
                    micro-batch until its last one starts (no gradient sync until then)
                    loss = strategy.run_step("training_step")   # split, compute, combine
                    on_before_backward
                    backward(loss / group size)
                    on_after_backward
                    if the group is complete:
                        unscale, clip, on_before_optimizer_step, optimizer step, zero_grad
                        scheduler step (interval="step")
                        every log_every_n_steps steps: NaN/Inf loss check, on_train_log
                    validation loop if val_check_interval is due
                    on_train_batch_end            # the step boundary: step checkpoints
                    stop on max_steps, should_stop, or SIGTERM/SIGINT (saves last.ckpt)
                epoch means of self.log values
                validation loop if check_val_every_n_epoch is due
                scheduler step (interval="epoch")
                on_train_epoch_end                # epoch checkpoints
            on_train_end
            on_fit_end
            teardown("fit")                       (in _run)
        """
        hooks, state = self._hooks, self.state
        if not model.training:  # a model handed over in eval mode trains; submodules the
            model.train()  # user froze (e.g. BatchNorm) stay frozen, as evaluation restores modes
        hooks.call("on_fit_start", self, model)
        hooks.call("on_train_start", self, model)
        while not self._done():
            self._train_sink = sink = MetricSink()
            previous_sink = set_sink(sink)
            try:
                hooks.call("on_train_epoch_start", self, model)
                stopped = self._train_epoch(model, train_loader, val_loader, resume, sink)
            finally:
                set_sink(previous_sink)
            # A checkpoint taken from here on resumes at the next epoch, unless this one was cut short.
            self._epoch_complete = not stopped
            self.train_epoch_metrics = self.logged_metrics = sink.epoch_means(self._strategy.reduce_metrics)
            self.callback_metrics.update(self.logged_metrics)
            self.prog_bar_names |= sink.prog_bar
            if val_loader is not None and self._epoch_val_due():
                self._eval_loop("validation", val_loader, self.limit_val_batches)
            if self._opt.interval == "epoch":
                self._opt.step_scheduler(self.callback_metrics)
            hooks.call("on_train_epoch_end", self, model)
            self._epoch_complete = False
            if stopped:  # the epoch was cut short: current_epoch counts only completed ones
                break
            state.current_epoch += 1
            state.batch_in_epoch = 0
            state.should_stop = self._agree(state.should_stop)
        hooks.call("on_train_end", self, model)
        hooks.call("on_fit_end", self, model)

    def _train_epoch(self, model: TrainModule, loader: Any, val_loader: Any, resume: Resume, sink: MetricSink) -> bool:
        """One epoch's batches; returns True if fit must stop before the epoch's end.

        The body runs once per batch, between a data load and a model step that push it out of
        the CPU's caches: there, each Python function it calls can cost up to a microsecond, not
        the tens of nanoseconds a micro-benchmark shows (benchmarks/overhead.py). So the
        common path calls none of its own. Whatever is fixed for the run is read into locals
        first, and what a run does not use (accumulation, hooks, clipping, a gradient
        scaler, a strategy's own backward, a stop request) costs a comparison.
        """
        from strategies.base import Strategy  # here: strategies imports this package first

        state, hooks, strategy, opt = self.state, self._hooks, self._strategy, self._opt
        accumulate, limit, log_every = self.accumulate_grad_batches, self.num_training_batches, self.log_every_n_steps
        val_every = _val_every(self.val_check_interval, limit) if val_loader is not None else 0
        batch_start, before_backward, after_backward, batch_end = (
            hooks.on_train_batch_start, hooks.on_before_backward, hooks.on_after_backward, hooks.on_train_batch_end
        )
        own_backward = type(strategy).backward is not Strategy.backward or "backward" in vars(strategy)
        backward = strategy.backward if own_backward else torch.Tensor.backward
        scaler, optimizer = self._precision.scaler, opt.optimizer
        # An optimizer step with nothing around it: no clipping, hooks, scaler or per-step scheduler.
        plain_step = (
            self.gradient_clip_val is None and not hooks.on_before_optimizer_step and scaler is None
            and not (opt.scheduler is not None and opt.interval == "step")
        )
        max_steps = math.inf if self.max_steps is None else self.max_steps
        # Steps at which the ranks agree on stop requests; on one process, none (it reads its own).
        sync_every = _STOP_SYNC_EVERY if strategy.world_size > 1 else 0
        signals = self._signals
        self._step_skipped = False
        # A DataLoader's batch sizes are known in advance; other iterables are measured per batch.
        sizes = uniform_batches(loader)
        full_size, last_size, last_idx = sizes if sizes is not None else (0, 0, -1)
        training_step: Callable[[Any, int], Any] | None = None  # picked at the epoch's first batch
        tensor = torch.Tensor
        # Counted here; published to self.samples_seen at the logging cadence and when the epoch ends.
        samples = self.samples_seen

        epoch_batches = resume.batches(self, loader)  # iter() happens here, exactly once per epoch
        if strategy.world_size > 1 and loader_length(loader) is None:
            epoch_batches = _in_lockstep(epoch_batches, strategy)
        batch_idx = state.batch_in_epoch - 1
        group, completes = 1, True  # without accumulation every batch is a whole group
        try:
            # Holds the strategy's no-sync context over an accumulation group's micro-batches but the last.
            with contextlib.ExitStack() as no_sync:
                for batch_idx, batch in enumerate(epoch_batches, start=state.batch_in_epoch):
                    if batch_idx >= limit:
                        break
                    if sizes is None:
                        size = batch_size(batch)
                    else:
                        size = last_size if batch_idx == last_idx else full_size
                    sink.batch_size = size
                    samples += size
                    if training_step is None:
                        training_step = strategy.step_runner("training_step", batch)
                    if batch_start:
                        for fn in batch_start:
                            fn(self, model, batch, batch_idx)
                    if accumulate > 1:
                        group_start = batch_idx - batch_idx % accumulate
                        group = min(accumulate, limit - group_start)  # the epoch's last group may be short
                        completes = batch_idx - group_start + 1 == group
                        if completes:
                            no_sync.close()
                        elif batch_idx == group_start:  # groups start at multiples of accumulate, resumed too
                            no_sync.enter_context(strategy.no_backward_sync())

                    output = training_step(batch, batch_idx)
                    loss = output if type(output) is tensor else loss_of(output)
                    if before_backward:
                        for fn in before_backward:
                            fn(self, model, loss)
                    try:
                        if group == 1 and scaler is None:
                            backward(loss)
                        else:
                            scaled = loss / group if group > 1 else loss
                            backward(scaled if scaler is None else scaler.scale(scaled))
                    except RuntimeError as err:  # torch refuses a non-scalar or detached loss: say which
                        problem = bad_loss(loss)
                        if problem is None:
                            raise
                        raise problem from err
                    if after_backward:
                        for fn in after_backward:
                            fn(self, model)

                    state.batch_in_epoch = batch_idx + 1
                    if completes:
                        if plain_step:  # _optimizer_step with nothing to do around the step
                            optimizer.step()
                            optimizer.zero_grad()
                            state.global_step += 1
                        else:
                            self._optimizer_step(model, opt)
                        if state.global_step % log_every == 0:
                            self.samples_seen = samples
                            self._at_log_step(loss)
                    if val_every and (batch_idx + 1) % val_every == 0 and batch_idx + 1 < limit:
                        self._eval_loop("validation", val_loader, self.limit_val_batches)
                    if batch_end:
                        for fn in batch_end:
                            fn(self, model, output, batch, batch_idx)
                    if completes and (
                        state.global_step >= max_steps
                        or (state.global_step % sync_every == 0 if sync_every else state.should_stop or signals.received)
                    ) and self._stopping_now():
                        return batch_idx + 1 < limit
        finally:  # however the epoch ends
            self.samples_seen = samples
        if batch_idx < 0 and state.batch_in_epoch == 0:
            once = isinstance(loader, collections.abc.Iterator) and state.current_epoch > 0
            raise ValueError(
                f"train_dataloaders yielded no batches in epoch {state.current_epoch}. "
                + ("It is an iterator (e.g. a generator), which runs out after one pass: pass a DataLoader "
                   "or another object that can be iterated again." if once else "Check the dataset and sampler.")
            )
        return False

    def _optimizer_step(self, model: TrainModule, opt: OptimizerSetup) -> None:
        """Unscale, clip, on_before_optimizer_step, then step (or skip), zero_grad, and the
        per-step scheduler. The loop steps the optimizer itself when none of these applies."""
        precision, optimizer = self._precision, opt.optimizer
        if self.gradient_clip_val is not None:
            precision.unscale(optimizer)
            params = [p for g in optimizer.param_groups for p in g["params"]]
            if self.gradient_clip_algorithm == "norm":
                self.grad_norm = torch.nn.utils.clip_grad_norm_(params, self.gradient_clip_val)
            else:
                self.grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
                torch.nn.utils.clip_grad_value_(params, self.gradient_clip_val)
        for fn in self._hooks.on_before_optimizer_step:
            fn(self, model, optimizer)
        self._step_skipped, self._skip_step = self._skip_step, False
        if self._step_skipped:
            precision.skip()
        else:
            precision.step(optimizer)
        optimizer.zero_grad()
        self.state.global_step += 1
        if opt.scheduler is not None and opt.interval == "step":
            opt.step_scheduler(self.callback_metrics)

    def _at_log_step(self, loss: torch.Tensor) -> None:
        """Every ``log_every_n_steps`` steps: check the loss, and publish the step's logged values."""
        if not self._step_skipped:  # a skipped step's loss was judged already (the same way on every rank)
            self._check_finite(loss)
        metrics = self.step_metrics()
        self.callback_metrics.update(metrics)
        for fn in self._hooks.on_train_log:
            fn(self, self._module, metrics)

    def _check_finite(self, loss: torch.Tensor) -> None:
        """At the logging cadence (the loss is read then anyway): stop on a NaN/Inf loss, on every rank."""
        if self._agree(not math.isfinite(loss.item())):  # item(): one read, no tensor op
            raise FloatingPointError(
                f"The training loss is not finite (nan or inf) at step {self.state.global_step} "
                f"(epoch {self.state.current_epoch}). Lower the learning rate, clip gradients "
                "(gradient_clip_val=...), or add callbacks.NaNGuard(action='skip') to skip such steps."
            )

    def _stopping_now(self) -> bool:
        """True at a step boundary where fit must end. On several processes, stop requests
        (should_stop, SIGTERM/SIGINT) are agreed every few steps, so all ranks stop together."""
        state, strategy = self.state, self._strategy
        if strategy.world_size > 1:
            if state.global_step % _STOP_SYNC_EVERY:
                return self.max_steps is not None and state.global_step >= self.max_steps
            flags = torch.tensor([float(self._signals.received is not None), float(state.should_stop)])
            signalled, stop = (strategy.all_reduce_sum(flags) > 0).tolist()
            state.should_stop = bool(stop)
        else:
            signalled = self._signals.received is not None
        if signalled:
            self._interrupt()
        return state.should_stop or (self.max_steps is not None and state.global_step >= self.max_steps)

    def _agree(self, local: bool) -> bool:
        """True on every rank if it is True on any rank."""
        if self._strategy.world_size == 1:
            return local
        return bool(self._strategy.all_reduce_sum(torch.tensor([float(local)])).item() > 0)

    def _interrupt(self) -> None:
        signum = self._signals.received or signal.SIGTERM
        path = None
        if self.checkpoint_callback is not None:
            path = self.checkpoint_callback.write_last(self, self._module)
        where = f"; last checkpoint: {path}" if path else ""
        raise Interrupted(
            f"Training stopped by {signal.Signals(signum).name} at step {self.state.global_step} "
            f"(epoch {self.state.current_epoch}){where}. Resume with fit(..., ckpt_path='last').",
            signum,
        )

    def _eval_loop(self, phase: str, loader: Any, limit: int | float | None) -> list[Any] | None:
        """on_{phase}_start, on_{phase}_epoch_start, per batch on_{phase}_batch_start/end,
        on_{phase}_epoch_end, on_{phase}_end; model.eval() and no_grad, modes restored after."""
        model, hooks, strategy = self._module, self._hooks, self._strategy
        step_name = {"validation": "validation_step", "test": "test_step", "predict": "predict_step"}[phase]
        n = _limited(loader_length(loader), limit)
        # A rank whose shard is empty (fewer samples than ranks) still joins the metric reduction.
        if n == 0 and (limit == 0 or strategy.world_size == 1):
            return [] if phase == "predict" else None
        modes = [m.training for m in model.modules()]
        model.eval()
        sink = MetricSink()
        previous_sink = set_sink(sink)
        outputs: list[Any] = []
        try:
            hooks.call(f"on_{phase}_start", self, model)
            hooks.call(f"on_{phase}_epoch_start", self, model)
            batch_start, batch_end = getattr(hooks, f"on_{phase}_batch_start"), getattr(hooks, f"on_{phase}_batch_end")
            with torch.no_grad():
                for batch_idx, batch in enumerate(loader):
                    if batch_idx >= n:
                        break
                    sink.batch_size = batch_size(batch)
                    for fn in batch_start:
                        fn(self, model, batch, batch_idx)
                    out = strategy.run_step(step_name, batch, batch_idx)
                    if phase == "predict":
                        outputs.append(out)
                    for fn in batch_end:
                        fn(self, model, out, batch, batch_idx)
            self.logged_metrics = sink.epoch_means(strategy.reduce_metrics)
            self.callback_metrics.update(self.logged_metrics)
            self.prog_bar_names |= sink.prog_bar
            hooks.call(f"on_{phase}_epoch_end", self, model)
            hooks.call(f"on_{phase}_end", self, model)
        finally:
            set_sink(previous_sink)
            for m, mode in zip(model.modules(), modes):
                m.training = mode
        return outputs if phase == "predict" else None

    # --- checkpoints -------------------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Write the full training state to ``path`` (rank 0 writes; every rank must call)."""
        checkpoint = self.checkpoint_state()
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
        return ckpt_io.snapshot(checkpoint) if copy else checkpoint

    # --- small helpers -----------------------------------------------------------------
    def _done(self) -> bool:
        s = self.state
        return (
            s.should_stop
            or (self.max_epochs is not None and s.current_epoch >= self.max_epochs)
            or (self.max_steps is not None and s.global_step >= self.max_steps)
        )

    def _epoch_val_due(self) -> bool:
        every = self.check_val_every_n_epoch
        return every is not None and (self.state.current_epoch + 1) % every == 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_module"] = None  # sent separately as fit's argument
        state["val_dataloaders"] = None  # likewise (and a dataset is costly to pickle twice)
        return state


def _in_lockstep(batches: Iterator[Any], strategy: Strategy) -> Iterator[Any]:
    """An unsized loader on several processes: take a batch only when every rank has one.

    A rank that runs out first would otherwise wait forever in the others' next gradient
    all-reduce. The epoch ends on every rank when the first one runs out.
    """
    while True:
        batch = next(batches, _END)
        have = int(strategy.all_reduce_sum(torch.tensor([float(batch is not _END)])).item())
        if have < strategy.world_size:
            if have and strategy.is_global_zero:
                log.warning(
                    "train_dataloaders ran out on %d of %d processes before the others; the epoch ended on "
                    "all of them. Give every rank the same number of batches to use all the data.",
                    strategy.world_size - have, strategy.world_size,
                )
            return
        yield batch


_END = object()


def _limited(n: int | None, limit: int | float | None) -> int | float:
    """How many batches to run: the loader's length cut by a count or fraction limit."""
    total = math.inf if n is None else n
    if limit is None:
        return total
    if isinstance(limit, float):
        return total if total == math.inf else max(1, int(total * limit))
    return min(total, limit)


def _val_every(interval: int | float | None, num_batches: int | float) -> int:
    if interval is None:
        return 0
    if isinstance(interval, float):
        return 0 if num_batches == math.inf else max(1, int(num_batches * interval))
    return interval
