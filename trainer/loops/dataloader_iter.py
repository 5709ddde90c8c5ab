"""The training epoch of a ``training_step(self, dataloader_iter)``: Lightning's experimental
flavour, in which the step draws its batches itself (``trainer/data/pipeline.py``'s
:class:`~trainer.data.pipeline.DataLoaderIter`).

The order of events for each step, while the epoch's batches (up to ``limit_train_batches``)
are not used up, or until the step lets a StopIteration out::

    on_train_batch_start(the last batch fetched, its batch_idx)     # (None, 0) at first
    output = training_step(dataloader_iter)                         # fetches 0, 1 or more batches
    automatic optimization: zero_grad, backward, optimizer step (no accumulation)
    on_train_batch_end(output, the last batch fetched, its batch_idx)
    the log step; validation after the val_check_interval-th batch and at the epoch's last; stop checks

The batches are as the loader gives them: the transfer hooks do not run and nothing moves them
to the device (the step does). ``self.log`` during training needs ``batch_size=`` (the loop
does not see the batches). ``global_step`` counts steps; the epoch's position, batches fetched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from trainer.core.checks import loss_of
from trainer.core.metrics import MetricSink
from trainer.data.batches import loader_length
from trainer.data.pipeline import DataLoaderIter, takes_dataloader_iter
from trainer.loops.fit_loaders import val_check_batch
from trainer.loops.optimization.step import step_outputs
from trainer.loops.stopping import STOP_SYNC_EVERY

if TYPE_CHECKING:
    from trainer.loops.fit import FitLoop


def epoch_runner(loop: FitLoop) -> Callable[[MetricSink], bool]:
    """``loop``'s epoch: its own ``_train_epoch``, or :func:`train_epoch` for a ``dataloader_iter`` training step."""
    if takes_dataloader_iter(loop.model, "training_step"):
        return lambda sink: train_epoch(loop, sink)
    return loop._train_epoch


def train_epoch(loop: FitLoop, sink: MetricSink) -> bool:
    """One epoch of ``loop`` with a ``dataloader_iter`` training step; True if fit must stop before its end."""
    trainer, run, model, state, strategy = loop.trainer, loop.run, loop.model, loop.trainer.state, loop.trainer.strategy
    loader, limit = loop.train_loader, trainer.num_training_batches
    sized = loader_length(loader) is not None
    feed = DataLoaderIter([(lambda: loop._epoch_batches(loader, sized, as_given=True), limit)])
    val_every = val_check_batch(trainer, loop._loaders.validates)
    val_before = loop._batches_before if trainer.check_val_every_n_epoch is None else 0
    batch_start, batch_end, optimizer = run.hooks.on_train_batch_start, run.hooks.on_train_batch_end, run.opt.optimizer
    steps, manual = loop.steps, run.manual
    max_steps = float("inf") if trainer.max_steps in (None, -1) else trainer.max_steps
    sync_every = STOP_SYNC_EVERY if strategy.world_size > 1 else 0
    sink.batch_size = None  # self.log must say it (Lightning's rule)
    fetched = feed.fetched
    while not feed.done:
        run.is_last_batch = False
        if batch_start and -1 in [fn(trainer, model, feed.batch, feed.batch_idx) for fn in batch_start]:
            break  # Lightning's: on_train_batch_start returning -1 ends the epoch here
        try:
            output = strategy.run_step("training_step", feed, feed.batch_idx)  # the iterator alone reaches the step
        except StopIteration:  # the step says the epoch is over
            break
        if manual is not None:
            loss, _ = manual.end_batch(output)
        else:
            loss = output if isinstance(output, torch.Tensor) else loss_of(output, none_skips=True)
            if loss is None:  # Lightning's skipped step: no backward
                steps.zero_grad(optimizer)
            else:
                steps.backward(loss, 1, optimizer)
            steps.step(optimizer, loss)
        state.batch_in_epoch += feed.fetched - fetched
        fetched = feed.fetched
        run.is_last_batch = feed.done
        if feed.done:  # as in fit's own loop: before on_train_batch_end
            steps.step_epoch_schedulers(plateau=False)
        due = bool(val_every) and (feed.done or (val_before + feed.batch_idx + 1) % val_every == 0)
        if batch_end:
            outputs = step_outputs(output, 1)
            run.val_pending = due
            for fn in batch_end:
                fn(trainer, model, outputs, feed.batch, feed.batch_idx)
        if (state.global_step if manual is None else state.log_step) >= loop.publisher.next_log:
            loop._at_log_step(loss)
        if due or val_every and state.should_stop and loop.stops.can_stop_early():
            run.val_pending = False
            loop._validate(keep_rng=not due)
        steps.step_plateau_schedulers()
        if (
            state.global_step >= max_steps
            or (state.global_step % sync_every == 0 if sync_every else state.should_stop or run.signals.received)
        ) and loop.stops.stopping_now():
            return not feed.done
    return False
