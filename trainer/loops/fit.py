"""The fit loop: epochs, the per-batch step, the optimizer step and stop requests."""

from __future__ import annotations

import collections.abc
import contextlib
import logging
import math
import signal
from typing import TYPE_CHECKING, Any, Callable

import torch

from strategies.base import Strategy

from trainer.core.checks import bad_loss, loss_of
from trainer.checkpoint.resume import Resume
from trainer.core.signals import Interrupted
from trainer.data.batches import batch_size, check_same_length, describe_fit, in_lockstep, loader_length, uniform_batches
from trainer.loops.optimization.closure import closure_step
from trainer.loops.evaluation import check_val_interval, evaluation_loop, limited, sanity_check, validation_every
from trainer.core.metrics import MetricSink, set_sink
from trainer.loops.optimization.manual import ManualOptimization, check_manual
from trainer.loops.hooks import batch_transfer
from trainer.loops.optimization.optim import automatic_step, resolve_optimizers
from trainer.loops.publishing import Publishing
from trainer.loops.stopping import STOP_SYNC_EVERY, StopRules

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer

log = logging.getLogger("trainer")


class FitLoop(StopRules, Publishing):
    """One ``fit`` in one process. The order of events, which is the contract callbacks rely on::

        setup("fit")                              (in stage.run_stage)
        on_fit_start
        sanity check: num_sanity_val_steps validation batches, the RNG left as it was
        on_train_start
        for each epoch until max_epochs, max_steps or a stop request (honoured once
        min_epochs and min_steps are met):
            every reload_dataloaders_every_n_epochs epochs: the loaders from their hooks again
            on_train_epoch_start
            for each batch (a resumed run skips the consumed ones at the sampler):
                on_train_batch_start
                strategy.no_backward_sync() held from an accumulation group's first
                micro-batch until its last one starts (no gradient sync until then)
                loss = strategy's training_step runner   # split, compute, combine
                on_before_backward
                backward(loss / group size)
                on_after_backward
                if the group is complete:
                    unscale, on_before_optimizer_step, clip (or the model's configure_gradient_clipping),
                    optimizer step (or the model's optimizer_step), on_before_zero_grad, zero_grad
                    scheduler step (interval="step")
                    at step 1 and every log_every_n_steps steps: NaN/Inf loss check, on_train_log
                (manual optimization: training_step runs its own backward passes and steps,
                and the loop none of the above from on_before_backward; a batch in which an
                optimizer stepped counts one step, then the log cadence as above)
                validation loop if val_check_interval is due
                on_train_batch_end                # the step boundary: step checkpoints
                stop on max_steps, should_stop, or SIGTERM/SIGINT (saves last.ckpt)
            (an unsized loader that ran out inside an accumulation group: optimizer step)
            on_train_log for the epoch's last step, if not yet (every run's curves end there)
            if the epoch was cut short: save last.ckpt, validate if max_steps ended it, stop
            epoch means of self.log values
            validation loop if check_val_every_n_epoch is due
            model.on_train_epoch_end              # what it self.logs joins the epoch means
            scheduler step (interval="epoch")
            callbacks' on_train_epoch_end         # epoch checkpoints; what they log joins too
        on_train_end
        on_fit_end
        teardown("fit")                           (in stage.run_stage)

    The state that checkpoints record lives on the Trainer (``checkpoint_state``).
    """

    def __init__(
        self, trainer: Trainer, model: TrainModule, train_loader: Any, val_loader: Any, resume_from: tuple[str, dict[str, Any]] | None,
        reload: Callable[[], tuple[Any, Any]] | None = None,
    ) -> None:
        self.trainer, self.model = trainer, model
        self._reload, self._loaded_at = reload, 0  # reload_dataloaders_every_n_epochs: where they come from
        self._told_min = False  # the min_epochs/min_steps message is logged once
        self._use_loaders(train_loader, val_loader)
        # configure_optimizers may read trainer.estimated_stepping_batches: after the loaders.
        trainer._opt = opt = resolve_optimizers(model, trainer._optimizer_factory)
        check_manual(trainer, model, len(opt.optimizers))
        trainer.optimizer, trainer.lr_scheduler = opt.optimizer, opt.scheduler
        trainer.optimizers, trainer.lr_schedulers = list(opt.optimizers), [s.scheduler for s in opt.schedulers]
        trainer._manual = None if opt.automatic else ManualOptimization(trainer, model, opt.optimizers)
        self.resume = Resume.load(trainer, resume_from)
        self._published: tuple[int, dict[str, float]] = (-1, {})  # (step, values) last put in callback_metrics
        self._validated_at = -1  # the step of the latest mid-epoch validation
        step = trainer.state.global_step
        self._logged_step = step  # the last step on_train_log saw; the next one it sees:
        self._next_log = 1 if step == 0 else step - step % trainer.log_every_n_steps + trainer.log_every_n_steps
        if trainer.is_global_zero:
            log.info("%s", describe_fit(trainer.strategy, self.train_loader, trainer.accumulate_grad_batches))

    def _use_loaders(self, train_loader: Any, val_loader: Any) -> None:
        trainer, strategy = self.trainer, self.trainer.strategy
        self.train_loader = strategy.process_dataloader(train_loader, "train")
        self.val_loader = None if val_loader is None else val_loader.map(lambda x: strategy.process_dataloader(x, "validate"))
        n = loader_length(self.train_loader)
        if n == 0:
            raise ValueError("train_dataloaders has no batches (len 0). Check the dataset size, batch_size and drop_last.")
        trainer.num_training_batches = limited(n, trainer.limit_train_batches)
        if self.val_loader is not None:
            check_val_interval(trainer)
        trainer.train_dataloader = self.train_loader
        trainer.val_dataloaders = None if self.val_loader is None else self.val_loader.as_given()  # callbacks read it
        trainer.num_val_batches = [] if self.val_loader is None else [
            limited(length, trainer.limit_val_batches) for length in self.val_loader.lengths()
        ]
        check_same_length(strategy.gather_objects(trainer.num_training_batches))

    def _maybe_reload(self) -> None:
        """``reload_dataloaders_every_n_epochs``: new loaders from the model's or DataModule's hooks
        at the start of every n-th epoch (loaders passed to fit are the same objects again)."""
        every, epoch = self.trainer.reload_dataloaders_every_n_epochs, self.trainer.state.current_epoch
        if self._reload is not None and every and epoch - self._loaded_at >= every:
            self._use_loaders(*self._reload())
            self._loaded_at = epoch

    def run(self) -> None:
        trainer = self.trainer
        if trainer.profiler is not None:
            trainer.profiler.attach_optimizers(trainer._opt.optimizers)
        trainer._phase = "train"
        trainer._publish_step_metrics = self._publish_step_metrics
        try:
            self._run()
        finally:
            trainer._phase = None
            trainer._publish_step_metrics = None  # the loop (and its loaders) must not outlive fit

    def _run(self) -> None:
        trainer, model, hooks, state = self.trainer, self.model, self.trainer._hooks, self.trainer.state
        with trainer._signals:
            if not model.training:  # a model handed over in eval mode trains; submodules the
                model.train()  # user froze (e.g. BatchNorm) stay frozen, as evaluation restores modes
            hooks.call("on_fit_start", trainer, model)
            sanity_check(trainer, self.val_loader)
            hooks.call("on_train_start", trainer, model)
            while not self._done():
                self._maybe_reload()
                trainer._train_sink = sink = MetricSink(training=True)
                previous_sink = set_sink(sink)
                try:
                    hooks.call("on_train_epoch_start", trainer, model)
                    cut_short = self._train_epoch(sink)
                finally:
                    set_sink(previous_sink)
                if state.global_step > self._logged_step and hooks.on_train_log:  # no loss check: no sync for it
                    self._at_log_step(None)
                if cut_short:
                    self._stop_mid_epoch()
                    break
                self._end_epoch()
                state.current_epoch += 1
                state.batch_in_epoch = 0
                state.should_stop = trainer.strategy.any_rank(state.should_stop)
            hooks.call("on_train_end", trainer, model)
            hooks.call("on_fit_end", trainer, model)
        received = trainer._signals.received
        if received is not None:  # came after the last stop check: finished, but say so
            raise Interrupted(
                f"{signal.Signals(received).name} arrived after the last step boundary; training "
                f"had finished (step {state.global_step}) and its checkpoints are complete.",
                received,
            )

    def _end_epoch(self) -> None:
        """A completed epoch's end. The model's ``on_train_epoch_end`` runs with the epoch's
        values still open, so that what it logs joins the epoch means (taken again then);
        the callbacks' hooks come last and read those means in ``callback_metrics``."""
        trainer, hooks = self.trainer, self.trainer._hooks
        sink = trainer._train_sink
        trainer._epoch_complete = True  # a checkpoint taken from here on resumes at the next epoch
        self._publish_epoch_means(sink)
        if self._epoch_val_due():
            evaluation_loop(trainer, "validation", self.val_loader, trainer.limit_val_batches)
        own = hooks.module_hooks.get("on_train_epoch_end")
        previous, sink.batch_size = set_sink(sink), 1  # what the hooks log: one value per process
        try:
            if own is not None:
                self._epoch_end_hook(own, sink)
            trainer._opt.step_schedulers("epoch", trainer.callback_metrics)
            for fn in hooks.on_train_epoch_end:
                if fn is not own:
                    self._epoch_end_hook(fn, sink)
        finally:
            set_sink(previous)
        trainer._epoch_complete = False

    def _epoch_end_hook(self, fn: Callable[..., Any], sink: MetricSink) -> None:
        """An ``on_train_epoch_end`` hook; what it logs joins the epoch means, published again."""
        before = sink.version()
        fn(self.trainer, self.model)
        if self.trainer.strategy.any_rank(sink.version() != before):
            self._publish_epoch_means(sink, keep_latest=self._epoch_val_due())

    def _stop_mid_epoch(self) -> None:
        """An epoch cut short. Its end is left to the run that resumes it (so stopped and resumed
        does it once, like never stopped), from the ``last.ckpt`` written here. After reaching
        ``max_steps`` a run validates once more, after the save, to report where it ended."""
        trainer = self.trainer
        checkpoint = trainer.checkpoint_callback
        if checkpoint is not None:
            checkpoint.write_last(trainer, self.model)
        validates = trainer.check_val_every_n_epoch is not None or trainer.val_check_interval is not None
        just_validated = self._validated_at == trainer.state.global_step  # val_check_interval hit this very step
        if trainer.state.stop_reason == "max_steps" and self.val_loader is not None and validates and not just_validated:
            evaluation_loop(trainer, "validation", self.val_loader, trainer.limit_val_batches)

    def _train_epoch(self, sink: MetricSink) -> bool:
        """One epoch's batches; returns True if fit must stop before the epoch's end.

        The body runs once per batch, between a data load and a model step that push it out of
        the CPU's caches: there, each Python function it calls can cost up to a microsecond, not
        the tens of nanoseconds a micro-benchmark shows (benchmarks/overhead.py). So the
        common path calls none of its own. Whatever is fixed for the run is read into locals
        first, and what a run does not use (accumulation, hooks, clipping, a gradient
        scaler, a strategy's own backward, a stop request) costs a comparison.
        """
        trainer, model, loader, val_loader = self.trainer, self.model, self.train_loader, self.val_loader
        state, hooks, strategy, opt = trainer.state, trainer._hooks, trainer.strategy, trainer._opt
        accumulate, limit, next_log = trainer.accumulate_grad_batches, trainer.num_training_batches, self._next_log
        val_every = validation_every(trainer.val_check_interval, limit) if val_loader is not None else 0
        # The last batch's validation is the epoch end's, if that one runs; else it runs here.
        val_last = not self._epoch_val_due()
        batch_start, before_backward, after_backward, batch_end = (
            hooks.on_train_batch_start, hooks.on_before_backward, hooks.on_after_backward, hooks.on_train_batch_end
        )
        own_backward = type(strategy).backward is not Strategy.backward or "backward" in vars(strategy)
        backward = strategy.backward if own_backward else torch.Tensor.backward
        scaler, optimizer, manual = trainer._precision.scaler, opt.optimizer, trainer._manual
        stepper = manual or closure_step(trainer, model, self._publish_step_metrics)  # LBFGS: the step runs the batch
        # An optimizer step with nothing around it: no clipping, hooks, scaler or per-step scheduler.
        plain_step = (
            trainer.gradient_clip_val is None and not hooks.on_before_optimizer_step and scaler is None
            and not opt.steps_at("step") and stepper is None and not opt.own and not hooks.on_before_zero_grad
        )
        transfer = batch_transfer(model, strategy)  # None unless the model overrides a transfer hook
        max_steps = math.inf if trainer.max_steps is None else trainer.max_steps
        # Steps at which the ranks agree on stop requests; on one process, none (it reads its own).
        sync_every = STOP_SYNC_EVERY if strategy.world_size > 1 else 0
        signals = trainer._signals
        trainer._step_skipped = False
        # A DataLoader's batch sizes are known in advance; other iterables are measured per batch.
        sizes = uniform_batches(loader)
        full_size, last_size, last_idx = sizes if sizes is not None else (0, 0, -1)
        training_step: Callable[[Any, int], Any] | None = None  # picked at the epoch's first batch
        tensor = torch.Tensor
        # Counted here; published to trainer.samples_seen at the logging cadence and when the epoch ends.
        samples = trainer.samples_seen

        epoch_batches = self.resume.batches(trainer, loader)  # iter() happens here, exactly once per epoch
        sized = loader_length(loader) is not None
        if strategy.world_size > 1 and not sized:
            epoch_batches = in_lockstep(epoch_batches, strategy)
        epoch_batches = strategy.device_batches(trainer._precision.convert_batches(epoch_batches))  # on a GPU: copied ahead
        profiler = trainer.profiler
        if profiler is not None:  # timed versions of what the body calls; without a profiler, nothing changes
            epoch_batches, backward = profiler.timed_iter("fetching", epoch_batches), profiler.timed("backward", backward)
        batch_idx = state.batch_in_epoch - 1
        group, completes = 1, True  # without accumulation every batch is a whole group
        try:
            # Holds the strategy's no-sync context over an accumulation group's micro-batches but the last.
            with contextlib.ExitStack() as no_sync:
                for batch_idx, batch in enumerate(epoch_batches, start=state.batch_in_epoch):
                    if batch_idx >= limit:  # (a hand-written loop's break: the sampler's draws stay the same)
                        break
                    trainer.is_last_batch = batch_idx + 1 == limit  # an unsized loader's length is unknown: False
                    if sizes is None:
                        size = batch_size(batch)
                    else:
                        size = last_size if batch_idx == last_idx else full_size
                    sink.batch_size = size
                    samples += size
                    if transfer is not None:
                        batch = transfer(batch, 0)
                    if training_step is None:
                        training_step = strategy.step_runner("training_step", batch)
                        if profiler is not None:
                            training_step = profiler.timed("training_step", training_step)
                        if stepper is not manual:
                            training_step = stepper.wrap(training_step)
                    if batch_start and -1 in [fn(trainer, model, batch, batch_idx) for fn in batch_start]:
                        break  # Lightning's: on_train_batch_start returning -1 ends the epoch here
                    if accumulate > 1:
                        group_start = batch_idx - batch_idx % accumulate
                        group = min(accumulate, limit - group_start)  # the epoch's last group may be short
                        completes = batch_idx - group_start + 1 == group
                        if completes:
                            no_sync.close()
                        elif batch_idx == group_start and sized:  # groups start at multiples of accumulate, resumed too
                            # Unsized: the epoch may end inside this group, so every micro-batch syncs.
                            no_sync.enter_context(strategy.no_backward_sync())

                    output = training_step(batch, batch_idx)
                    if stepper is not None:  # the step stepped by hand (or LBFGS's closure); a batch that stepped counts one step
                        loss, completes = stepper.end_batch(output)
                    else:
                        loss = output if type(output) is tensor else loss_of(output)
                        if before_backward:
                            for fn in before_backward:
                                fn(trainer, model, loss)
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
                                fn(trainer, model)

                    state.batch_in_epoch = batch_idx + 1
                    if completes:
                        if plain_step:  # automatic_step with nothing to do around the step
                            optimizer.step()
                            optimizer.zero_grad()
                            state.global_step += 1
                        elif stepper is None:
                            trainer._last_loss = loss  # what an optimizer_step's closure returns
                            automatic_step(trainer, model, self._publish_step_metrics)
                        if state.global_step >= next_log:
                            trainer.samples_seen = samples
                            self._at_log_step(loss)
                            next_log = self._next_log
                    if val_every and (batch_idx + 1) % val_every == 0 and (batch_idx + 1 < limit or val_last):
                        evaluation_loop(trainer, "validation", val_loader, trainer.limit_val_batches)
                        self._validated_at = state.global_step
                    if batch_end:
                        for fn in batch_end:
                            fn(trainer, model, output, batch, batch_idx)
                    if completes and (
                        state.global_step >= max_steps
                        or (state.global_step % sync_every == 0 if sync_every else state.should_stop or signals.received)
                    ) and self._stopping_now():
                        return batch_idx + 1 < limit
            if not completes and accumulate > 1:  # an unsized loader ran out inside a group: step what it accumulated
                automatic_step(trainer, model, self._publish_step_metrics)
                if state.global_step >= next_log:
                    trainer.samples_seen = samples
                    self._at_log_step(loss)
        finally:  # however the epoch ends
            trainer.samples_seen = samples
        if batch_idx < 0 and state.batch_in_epoch == 0:
            once = isinstance(loader, collections.abc.Iterator) and state.current_epoch > 0
            raise ValueError(
                f"train_dataloaders yielded no batches in epoch {state.current_epoch}. "
                + ("It is an iterator (e.g. a generator), which runs out after one pass: pass a DataLoader "
                   "or another object that can be iterated again." if once else "Check the dataset and sampler.")
            )
        return False

    def _epoch_val_due(self) -> bool:
        every = self.trainer.check_val_every_n_epoch
        return self.val_loader is not None and every is not None and (self.trainer.state.current_epoch + 1) % every == 0
