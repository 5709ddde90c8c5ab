"""``trainer.fit`` in each process: its entry point, and the fit loop (epochs, the per-batch
step, the optimizer step and stop requests)."""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from trainer.core.checks import bad_loss, loss_of, warn_eval_modules
from trainer.checkpoint.paths import resolve_ckpt_path
from trainer.checkpoint.training_state import Resume, read_for_fit
from trainer.core.signals import Interrupted
from trainer.data.batches import batch_size, describe_fit, loader_length, uniform_batches
from trainer.data.pipeline import BatchPipeline, batch_transfer
from trainer.loops import dataloader_iter
from trainer.loops.evaluation import evaluation_loop, sanity_check
from trainer.loops.fit_loaders import FitLoaders, no_batches, val_check_batch
from trainer.loops.run import start, stage_hooks, use_run_folder
from trainer.core.metrics import MetricSink, set_sink
from trainer.loops.optimization.manual import check_manual
from trainer.loops.optimization.optim import resolve_optimizers
from trainer.loops.optimization.step import StepSequence, step_outputs
from trainer.loops.publishing import Publisher
from trainer.loops.stopping import STOP_SYNC_EVERY, StopRules

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.loops.run import Run, StageData
    from trainer.trainer import Trainer

log = logging.getLogger("trainer")


def fit_stage(trainer: Trainer, model: TrainModule, data: StageData, ckpt_path: Any) -> None:
    """``trainer.fit`` in this process: the run set up, the checkpoint to resume (``"last"``
    found), the run folder (the resumed run's, or a new one), then the loaders and the loop
    between the ``setup`` and ``teardown`` hooks."""
    run = start(trainer, "fit", model, data.datamodule)
    run.ckpt_path = ckpt_path = resolve_ckpt_path(trainer, ckpt_path, "fit")  # the file: "last", a URL resolved
    use_run_folder(trainer, run, resume=ckpt_path, fit=True)
    with stage_hooks(trainer, run):
        resume_from = read_for_fit(trainer, ckpt_path)  # the DataModule's state, before its loaders (Lightning's order)
        FitLoop(trainer, run, model, FitLoaders(trainer, run, model, data), resume_from).fit()
        if trainer.fast_dev_run and trainer.is_global_zero:
            n = trainer.fast_dev_run
            log.info("fast_dev_run=%d: trained on %d batch(es) (%d optimizer step(s)) and validated on up to %d "
                     "batch(es) of each validation loader; wrote no logs and no checkpoints.", n,
                     trainer.num_training_batches, trainer.global_step, n if trainer.enable_validation else 0)


class FitLoop:
    """One ``fit`` in one process. The order of events, Lightning's, which is the contract callbacks
    rely on. At every hook the callbacks run first, in the order given, then the model's own hook,
    then the loggers' writer (trainer/loops/hooks.py); on_train_epoch_end is the one exception::

        setup("fit")                              (fit_stage, through run.stage_hooks)
        configure_model, the model on its device and wrapped by the strategy
        on_fit_start
        sanity check: on_sanity_check_start, val_dataloader(), num_sanity_val_steps validation
            batches with their hooks, on_sanity_check_end; the RNG left as it was
        if max_epochs or max_steps is reached already (a second fit): on_fit_end, and no more
        on_train_start (after a PossibleUserWarning if submodules are in eval mode)
        for each epoch until max_epochs, max_steps or a stop request (honoured once
        min_epochs and min_steps are met):
            every reload_dataloaders_every_n_epochs epochs: train_dataloader() again (the first
                validation loads val_dataloader(), then the first every n epochs after the last)
            on_train_epoch_start
            for each batch (a resumed run skips the consumed ones at the sampler; a batch of None
            is warned of and gets on_train_batch_end(outputs=None) only):
                on_train_batch_start
                strategy.no_backward_sync() held from an accumulation group's first
                micro-batch until its last one starts (no gradient sync until then)
                loss = strategy's training_step runner   # split, compute, combine
                at a group's first batch: on_before_zero_grad, zero_grad (or optimizer_zero_grad)
                on_before_backward                       # to the step: StepSequence (optimization/step.py)
                backward of loss / group size            # the model's backward if it overrides it
                on_after_backward
                if the group is complete:
                    unscale, on_before_optimizer_step, clip (or the model's configure_gradient_clipping),
                    optimizer step (or the model's optimizer_step)
                    scheduler step (interval="step"; at the epoch's last batch, interval="epoch" too)
                    at step 1 and every log_every_n_steps steps: NaN/Inf loss check
                (manual optimization: training_step runs its own backward passes and steps,
                and the loop none of the above from zero_grad; each optimizer step counts
                a step, and each batch a logging step: the log cadence as above)
                on_train_batch_end(outputs)       # {"loss": loss detached, ...}; step checkpoints
                every log_every_n_steps-th step: on_train_log (the loggers' row, at the step before)
                validation loop after every val_check_interval-th batch (counted across epochs
                    when check_val_every_n_epoch=None; the epoch's last one by default), or on
                    should_stop once min_epochs/min_steps are met; then ReduceLROnPlateau (interval="step")
                stop on max_steps, should_stop, or SIGTERM/SIGINT (saves last.ckpt)
            (an unsized loader that ran out inside an accumulation group: optimizer step)
            if the epoch was cut short: save last.ckpt, stop
            epoch means of self.log values
            (an unsized loader: the validation loop if check_val_every_n_epoch is due)
            on_train_epoch_end: the callbacks, the model, ModelCheckpoint and EarlyStopping, the
                loggers' writer; what each logs joins the epoch means; then the ReduceLROnPlateau
                schedulers of interval="epoch"
        on_train_end
        on_fit_end
        teardown("fit")                           (fit_stage, through run.stage_hooks)

    The state that checkpoints record lives on the run (``trainer/loops/run.py``). The loop holds
    three collaborators, each built once per fit: ``steps`` (optimization/step.py: zero_grad,
    backward and the optimizer step, in order), ``stops`` (stopping.py: when fit stops) and
    ``publisher`` (publishing.py: when logged values reach ``callback_metrics`` and the loggers).
    """

    def __init__(
        self, trainer: Trainer, run: Run, model: TrainModule, loaders: FitLoaders,
        resume_from: tuple[str, dict[str, Any]] | None,
    ) -> None:
        self.trainer, self.run, self.model = trainer, run, model
        self._loaders = loaders
        # Loaded after the sanity check, as Lightning's; configure_optimizers reading
        # trainer.estimated_stepping_batches loads it first.
        run.load_train = loaders.train_now
        run.opt = opt = resolve_optimizers(model, trainer._optimizer_factory)
        check_manual(trainer, model, len(opt.optimizers))
        run.optimizer, run.lr_scheduler = opt.optimizer, opt.scheduler
        run.optimizers, run.lr_schedulers = list(opt.optimizers), [s.scheduler for s in opt.schedulers]
        trainer.strategy.optimizers = list(opt.optimizers)  # Lightning's strategy.optimizers
        self.steps = StepSequence(trainer, run, model)  # the events around a step, in order; the fast ones picked
        run.manual = self.steps.manual
        self.resume = Resume.load(trainer, run, resume_from)
        self.pipeline = BatchPipeline(
            trainer.strategy, run.precision, run.fetching, timer=run.profiling and run.profiling.timed_iter)
        state = trainer.state
        if run.manual is None or state.batches_stepped is None:  # Lightning's _batches_that_stepped (core/state.py)
            state.batches_stepped = None if run.manual is None else state.global_step
        self.stops = StopRules(trainer, run, model)
        self.publisher = Publisher(trainer, run, model)  # after the counters: it starts at the next log step

    def _load_train(self) -> None:
        trainer = self.trainer
        self.train_loader = self._loaders.train_now()
        # Batches run in earlier epochs: with check_val_every_n_epoch=None, val_check_interval counts across epochs.
        batches = trainer.num_training_batches
        self._batches_before = trainer.state.current_epoch * batches if batches != math.inf else 0
        if trainer.is_global_zero:
            log.info("%s", describe_fit(trainer.strategy, self.train_loader, trainer.accumulate_grad_batches))

    def fit(self) -> None:
        trainer, run = self.trainer, self.run
        self._train_epoch = dataloader_iter.epoch_runner(self)  # type: ignore[method-assign]  # dataloader_iter steps
        if run.profiling is not None:  # optimizer_step until the stage ends, and run_training_epoch
            run.profiling.time_optimizers(run.opt.optimizers)
            self._train_epoch = run.profiling.epoch(self._train_epoch)  # type: ignore[method-assign]
        run.publish_step_metrics = self.publisher.publish_step_metrics
        try:
            self._fit()
        finally:
            run.publish_step_metrics = run.load_train = None  # the loop (and its loaders) must not outlive fit

    def _fit(self) -> None:
        trainer, run, model, hooks, state = self.trainer, self.run, self.model, self.run.hooks, self.trainer.state
        stops, publisher = self.stops, self.publisher
        with run.signals:
            if not model.training:  # a model handed over in eval mode trains; submodules the
                model.train()  # user froze (e.g. BatchNorm) stay frozen, as evaluation restores modes
            hooks.call("on_fit_start", trainer, model)
            sanity_check(trainer, run, self._val_loaders if self._loaders.validates else None)
            if trainer.limit_train_batches != 0:  # 0: no training at all, its loader never asked for (Lightning's)
                self._load_train()
            if stops.done() or trainer.limit_train_batches == 0:  # or a second fit of a finished run: nothing to train
                hooks.call("on_fit_end", trainer, model)
                return
            if trainer.is_global_zero:
                warn_eval_modules(model)
            publisher.train_start()  # on_train_start
            while not stops.done():
                self.train_loader = self._loaders.train_now()  # again every reload_dataloaders_every_n_epochs
                run.train_sink = sink = publisher.epoch_sink()
                previous_sink = set_sink(sink)
                # a checkpoint saved at the epoch's last batch (its schedulers stepped) resumes past all its batches
                self.steps.epoch_stepped = state.batch_in_epoch >= trainer.num_training_batches
                try:
                    hooks.call("on_train_epoch_start", trainer, model)
                    cut_short = self._train_epoch(sink)
                finally:
                    set_sink(previous_sink)
                if cut_short:
                    self._stop_mid_epoch()
                    break
                self._end_epoch()
                state.current_epoch += 1
                state.batch_in_epoch = 0
                state.should_stop = trainer.strategy.any_rank(state.should_stop)
            hooks.call("on_train_end", trainer, model)
            hooks.call("on_fit_end", trainer, model)
        received = run.signals.received
        if received is not None:  # came after the last stop check: finished, but say so
            raise Interrupted(
                f"{signal.Signals(received).name} arrived after the last step boundary; training "
                f"had finished (step {state.global_step}) and its checkpoints are complete.",
                received,
            )

    def _end_epoch(self) -> None:
        """A completed epoch's end. The ``on_train_epoch_end`` hooks run in Lightning's order (see
        the class docstring) with the epoch's values still open: what each logs joins the means."""
        trainer, run, hooks = self.trainer, self.run, self.run.hooks
        sink = run.train_sink
        run.epoch_complete = True  # a checkpoint taken from here on resumes at the next epoch
        self.steps.step_epoch_schedulers(plateau=False)  # unless its last batch did
        self.publisher.publish_epoch_means(sink)
        if self._epoch_val_due() and trainer.num_training_batches == math.inf:  # unsized: its last batch is known now
            self._validate()
        self._batches_before += trainer.state.batch_in_epoch
        previous = set_sink(sink.open_epoch_end())  # what the hooks log: epoch values
        try:
            for fn in hooks.on_train_epoch_end:
                self._epoch_end_hook(fn, sink)
            self.steps.step_epoch_schedulers(plateau=True)
        finally:
            set_sink(previous)
            sink.reset_metrics()  # after the hooks, whose compute() saw the epoch (Lightning's order)
        run.epoch_complete = False

    def _epoch_end_hook(self, fn: Callable[..., Any], sink: MetricSink) -> None:
        """An ``on_train_epoch_end`` hook; what it logs joins the epoch means, published again."""
        before = sink.version()
        fn(self.trainer, self.model)
        if self.trainer.strategy.any_rank(sink.version() != before):
            self.publisher.publish_epoch_means(sink)

    def _stop_mid_epoch(self) -> None:
        """An epoch cut short. Its end is left to the run that resumes it (so stopped and resumed
        does it once, like never stopped), from the ``last.ckpt`` written here. After reaching
        ``max_steps`` a run validates once more, after the save, to report where it ended."""
        if self.trainer.checkpoint_callback is not None:
            self.trainer.checkpoint_callback.write_last(self.trainer, self.model)

    def _train_epoch(self, sink: MetricSink) -> bool:
        """One epoch's batches; returns True if fit must stop before the epoch's end.

        The body runs once per batch, between a data load and a model step that push it out of
        the CPU's caches: there, each Python function it calls can cost up to a microsecond, not
        the tens of nanoseconds a micro-benchmark shows (benchmarks/overhead.py). So the
        common path calls only the two step events (``steps.backward_batch`` and
        ``steps.step_batch``, picked once per fit in optimization/step.py, plain when nothing
        surrounds them): what is fixed for the epoch is read into locals first, and what a run
        does not use (accumulation, hooks, a transfer hook, a stop request) costs a comparison.
        """
        trainer, run, model = self.trainer, self.run, self.model
        state, strategy = trainer.state, trainer.strategy
        loader, limit = self.train_loader, trainer.num_training_batches
        val_every = val_check_batch(trainer, self._loaders.validates)  # Lightning's (0: none in this epoch's batches)
        val_before = self._batches_before if trainer.check_val_every_n_epoch is None else 0  # counted across epochs
        batch_start, batch_end, signals = run.hooks.on_train_batch_start, run.hooks.on_train_batch_end, run.signals
        steps, optimizer, accumulate = self.steps, run.opt.optimizer, trainer.accumulate_grad_batches
        stepper, zero_grad = steps.stepper, steps.zero_grad
        epoch_schedulers = run.opt.steps_at("epoch")
        plateau_steps = run.opt.automatic and run.opt.needs_metric_at("step")
        backward_batch, step_batch = steps.backward_batch, steps.step_batch  # picked once per fit (step.py)
        transfer = batch_transfer(model, strategy, trainer.datamodule)  # None unless a transfer hook is overridden
        max_steps = math.inf if trainer.max_steps in (None, -1) else trainer.max_steps
        sync_every = STOP_SYNC_EVERY if strategy.world_size > 1 else 0  # steps where the ranks agree on stop requests
        sizes = uniform_batches(loader)  # a DataLoader's batch sizes are known in advance; others are measured
        full_size, last_size, last_idx = sizes if sizes is not None else (0, 0, -1)
        samples, next_log, sized = run.samples_seen, self.publisher.next_log, loader_length(loader) is not None
        training_step, tensor = None, torch.Tensor
        group, first, completes = 1, True, True  # without accumulation a batch is a group
        batch_idx, run.step_skipped = state.batch_in_epoch - 1, False
        try:
            with contextlib.ExitStack() as no_sync:  # the no-sync context over a group's micro-batches but the last
                for batch_idx, batch in enumerate(self._epoch_batches(loader, sized), start=state.batch_in_epoch):
                    if batch_idx >= limit:  # (a hand-written loop's break: the sampler's draws stay the same)
                        break
                    run.is_last_batch = batch_idx + 1 == limit  # an unsized loader's length is unknown: False
                    size = batch_size(batch) if sizes is None else last_size if batch_idx == last_idx else full_size
                    sink.batch_size = size
                    samples += size  # published to trainer.samples_seen at the logging cadence and the epoch's end
                    if transfer is not None:
                        batch = transfer(batch, 0)
                    if batch is None:  # Lightning's: a warning, no step, and on_train_batch_end(outputs=None)
                        warnings.warn("train_dataloader yielded None. If this was on purpose, ignore this warning...",
                                      stacklevel=2)
                        state.batch_in_epoch = batch_idx + 1
                        for fn in batch_end:
                            fn(trainer, model, None, batch, batch_idx)
                        if val_every and (val_before + batch_idx + 1) % val_every == 0:
                            self._validate()
                        continue
                    if training_step is None:  # picked at the epoch's first batch
                        training_step = self._training_step(batch, stepper)
                    if batch_start and -1 in [fn(trainer, model, batch, batch_idx) for fn in batch_start]:
                        break  # Lightning's: on_train_batch_start returning -1 ends the epoch here
                    if accumulate > 1:
                        group_start = batch_idx - batch_idx % accumulate
                        group = min(accumulate, limit - group_start)  # the epoch's last group may be short
                        first, completes = batch_idx == group_start, batch_idx - group_start + 1 == group
                        if completes:
                            no_sync.close()
                        elif first and sized:  # unsized: the epoch may end in a group, so all sync
                            no_sync.enter_context(strategy.no_backward_sync())

                    output = training_step(batch, batch_idx)
                    if stepper is not None:  # stepped by hand (or LBFGS's closure did); a batch that stepped counts one
                        loss, completes = stepper.end_batch(output)
                    else:
                        loss = output if type(output) is tensor else loss_of(output, none_skips=True)
                        try:
                            if loss is not None:  # zero_grad at a group's first batch; the hooks around backward
                                backward_batch(loss, group, optimizer if first else None)
                            elif group == 1 or first:  # Lightning's skipped step: its group's gradients zeroed anyway
                                zero_grad(optimizer)
                        except RuntimeError as err:  # torch refuses a non-scalar or detached loss: say which
                            problem = bad_loss(loss)
                            if problem is None:
                                raise
                            raise problem from err
                    state.batch_in_epoch = batch_idx + 1
                    if completes and stepper is None:  # unscale, hooks, clip, step, count
                        step_batch(optimizer, loss)
                    if batch_idx + 1 == limit and epoch_schedulers:  # Lightning's: before on_train_batch_end
                        steps.step_epoch_schedulers(plateau=False)
                    due = val_every and (val_before + batch_idx + 1) % val_every == 0
                    if batch_end:  # Lightning's outputs: {"loss": the loss, detached, ...}
                        outputs = {"loss": output.detach()} if type(output) is tensor and accumulate == 1 else (
                            step_outputs(output, 1 if stepper is not None else accumulate))
                        run.val_pending = due  # a checkpoint saved here resumes with the validation below
                        for fn in batch_end:
                            fn(trainer, model, outputs, batch, batch_idx)
                    if completes and (state.global_step if stepper is None else state.log_step) >= next_log:
                        run.samples_seen = samples  # after on_train_batch_end: what it logs is in this step's row
                        next_log = self._at_log_step(loss)
                    if due or val_every and state.should_stop and self.stops.can_stop_early():
                        run.val_pending = False  # Lightning's _should_check_val_fx: after on_train_batch_end
                        self._validate(keep_rng=not due)
                    if completes and plateau_steps:  # on the step's values, after its validation (Lightning's)
                        steps.step_plateau_schedulers()
                    if completes and (
                        state.global_step >= max_steps
                        or (state.global_step % sync_every == 0 if sync_every
                            else state.should_stop or signals.received)
                    ) and self.stops.stopping_now():
                        return batch_idx + 1 < limit
            if not completes and accumulate > 1:  # an unsized loader ran out inside a group: step what it accumulated
                step_batch(optimizer, loss)
                if state.global_step >= next_log:
                    run.samples_seen = samples
                    self._at_log_step(loss)
        finally:  # however the epoch ends
            run.samples_seen = samples
        if batch_idx < 0 and state.batch_in_epoch == 0:  # skipped, as Lightning's; endless (no epoch limit): an error
            no_batches(loader, state.current_epoch, endless=trainer.max_epochs in (None, -1))
        return False

    def _at_log_step(self, loss: torch.Tensor | None) -> int:
        """At step 1 and every ``log_every_n_steps`` steps: the loss checked (stop on NaN/Inf),
        then the step's values published; returns the step of the next one."""
        self.stops.check_loss(loss)
        self.publisher.at_log_step()
        return self.publisher.next_log

    def _epoch_batches(self, loader: Any, sized: bool, as_given: bool = False) -> Iterator[Any]:
        """The epoch's batches from the pipeline (data/pipeline.py); ``as_given`` for a dataloader_iter step."""
        run, start = self.run, self.resume.start_point(self.trainer, self.run, self._validate)  # None but once resumed
        run.epoch_loader = loader  # checkpoints record its generators
        batches = self.pipeline.open(loader, self.trainer.state.current_epoch, start=start, lockstep=not sized,
                                     timed_as="[_TrainingEpochLoop].train_dataloader_next", as_given=as_given)
        run.epoch_start = self.pipeline.epoch_start
        return batches

    def _training_step(self, first_batch: Any, stepper: Any) -> Callable[[Any, int], Any]:
        """The epoch's training step: the strategy's runner, timed with a profiler, inside LBFGS's closure."""
        training_step = self.trainer.strategy.step_runner("training_step", first_batch)
        if self.run.profiling is not None:
            training_step = self.run.profiling.strategy_call(self.trainer.strategy, "training_step", training_step)
        if stepper is not None and stepper is not self.run.manual:
            training_step = stepper.wrap(training_step)
        return training_step

    def _validate(self, keep_rng: bool = False) -> None:  # keep_rng: one off the schedule leaves training's RNG as is
        loaders = self._val_loaders()
        if loaders is not None:
            limit = self.trainer.limit_val_batches
            evaluation_loop(self.trainer, self.run, "validation", loaders, limit, keep_rng=keep_rng)

    def _val_loaders(self) -> Any:  # loaded when first needed, again every reload_dataloaders_every_n_epochs
        every = self.trainer.check_val_every_n_epoch
        return self._loaders.val_now(every is None or (self.trainer.state.current_epoch + 1) % every == 0)

    def _epoch_val_due(self) -> bool:
        every = self.trainer.check_val_every_n_epoch
        return self._loaders.validates and every is not None and (self.trainer.state.current_epoch + 1) % every == 0
