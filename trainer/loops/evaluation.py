"""The evaluation loop: validation (also inside fit), test and predict."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

import torch

from trainer.checkpoint import files as ckpt_io
from trainer.loops.hooks import Hooks
from trainer.data.batches import batch_size
from trainer.data.fetch import batches
from trainer.data.loaders import Loaders, takes_dataloader_idx
from trainer.core.metrics import MetricSink, set_sink

if TYPE_CHECKING:
    from trainer.trainer import Trainer

_STEP = {"validation": "validation_step", "test": "test_step", "predict": "predict_step"}


def evaluation_loop(
    trainer: Trainer, phase: str, loaders: Any, limit: int | float | None, publish: bool = True
) -> list[Any] | None:
    """Run ``phase`` ("validation", "test" or "predict") over ``loaders`` (one loader or a
    :class:`~trainer.loaders.Loaders`); for predict, one list of outputs per loader, else None.

    The order of events::

        every rank takes rank 0's buffers (BatchNorm statistics); model.eval(), torch.no_grad()
        on_{phase}_start, on_{phase}_epoch_start
        for each loader, for each batch (up to the limit, which applies per loader):
            on_{phase}_batch_start
            output = strategy.run_step("{phase}_step")  # + dataloader_idx if the step takes it
            on_{phase}_batch_end                        # hooks get dataloader_idx with several loaders
            (each loader's epoch means of self.log values: suffixed with several loaders)
        on_{phase}_epoch_end                       # the model's hook may self.log epoch values
        the means -> logged_metrics, callback_metrics (not for the sanity check, publish=False)
        on_{phase}_end
        every module's train/eval mode restored

    The training counters (``global_step``, ``current_epoch``) are read, never changed.
    """
    model, hooks, strategy = trainer.module, trainer._hooks, trainer.strategy
    loaders = loaders if isinstance(loaders, Loaders) else Loaders(loaders)
    step_name = _STEP[phase]
    lengths = loaders.lengths()
    counts = [limited(n, limit) for n in lengths]
    # A rank whose shard is empty (fewer samples than ranks) still joins the metric reduction.
    if not any(counts) and (limit == 0 or strategy.world_size == 1):
        return [[] for _ in counts] if phase == "predict" else None
    strategy.broadcast_buffers()
    modes = [m.training for m in model.modules()]
    model.eval()
    means: dict[str, float] = {}
    prog_bar: set[str] = set()
    pass_idx = takes_dataloader_idx(getattr(model, step_name))
    outer = MetricSink()  # what the start and end hooks log: one value per process
    previous_sink = set_sink(outer)
    try:
        hooks.call(f"on_{phase}_start", trainer, model)
        hooks.call(f"on_{phase}_epoch_start", trainer, model)
        batch_start, batch_end = getattr(hooks, f"on_{phase}_batch_start"), getattr(hooks, f"on_{phase}_batch_end")
        for i, (loader, n, length) in enumerate(zip(loaders, counts, lengths)):
            sink = MetricSink()
            set_sink(sink)
            step_args = (i,) if pass_idx else ()
            hook_args = (i,) if loaders.several else ()  # Lightning's rule: the index only with several
            with torch.no_grad(), strategy.evaluating():  # e.g. fsdp gathers its shards once per loader
                # A limit stops without loading one batch more; a whole pass runs the loader to its end,
                # as a hand-written loop does (a RandomSampler draws once more at its end).
                record = trainer.predict_loop if phase == "predict" else None
                it = batches(loader, trainer._fetching, None if record is None else record.start_loader(loader))
                it = strategy.device_batches(it if n == math.inf or n == length else itertools.islice(it, int(n)))
                for batch_idx, batch in enumerate(it):
                    sink.batch_size = batch_size(batch)
                    if record is not None:
                        record.on_batch(i)
                    for fn in batch_start:
                        fn(trainer, model, batch, batch_idx, *hook_args)
                    out = strategy.run_step(step_name, batch, batch_idx, *step_args)
                    if record is not None:
                        record.keep(i, out)
                    for fn in batch_end:
                        fn(trainer, model, out, batch, batch_idx, *hook_args)
            suffix = loaders.suffix(i)
            means.update((name + suffix, v) for name, v in sink.epoch_means(strategy.reduce_metrics).items())
            prog_bar |= {name + suffix for name in sink.prog_bar}
        set_sink(outer)
        hooks.call(f"on_{phase}_epoch_end", trainer, model)
        means.update(outer.epoch_means(strategy.reduce_metrics))
        if publish:
            trainer.logged_metrics = means
            trainer.callback_metrics.update(means)
            trainer.prog_bar_names |= prog_bar | outer.prog_bar
        hooks.call(f"on_{phase}_end", trainer, model)
    finally:
        set_sink(previous_sink)
        for m, mode in zip(model.modules(), modes):
            m.training = mode
    return trainer.predict_loop._predictions if phase == "predict" else None


def sanity_check(trainer: Trainer, loaders: Loaders | None) -> None:
    """Before training: ``num_sanity_val_steps`` batches of each validation loader (-1: all), so
    that a bug in ``validation_step`` shows in seconds, not after the first epoch.

    It changes nothing that training sees: every RNG (and each loader's own generator) is put
    back, nothing it logs is kept, and the callbacks see only ``on_sanity_check_start/end``,
    not the validation hooks (the model's own hooks do run), so that no callback has to
    tell a sanity run from a real one.
    """
    steps = trainer.num_sanity_val_steps
    if loaders is None or steps == 0 or trainer.limit_val_batches == 0:
        return
    model, hooks, cap = trainer.module, trainer._hooks, trainer.limit_val_batches
    limit = cap if steps == -1 else min(steps, cap) if isinstance(cap, int) else steps  # an int cap is a count too
    rng = ckpt_io.rng_state()
    generators = [ckpt_io.generator_states(loader) for loader in loaders]
    hooks.call("on_sanity_check_start", trainer, model)
    trainer._hooks, trainer.sanity_checking = Hooks([], model), True
    try:
        evaluation_loop(trainer, "validation", loaders, limit, publish=False)
    finally:
        trainer._hooks, trainer.sanity_checking = hooks, False
        ckpt_io.set_rng_state(rng)
        for loader, states in zip(loaders, generators):
            ckpt_io.set_generator_states(loader, states)
    hooks.call("on_sanity_check_end", trainer, model)


def limited(n: int | None, limit: int | float | None) -> int | float:
    """How many batches to run: the loader's length (inf if unsized) cut by a count or fraction limit."""
    total = math.inf if n is None else n
    if limit is None:
        return total
    if isinstance(limit, float):
        return total if total == math.inf else max(1, int(total * limit))
    return min(total, limit)


def validation_every(interval: int | float | None, num_batches: int | float) -> int:
    """Batches between mid-epoch validations (0: none), from ``val_check_interval``."""
    if interval is None:
        return 0
    if isinstance(interval, float):
        return 0 if num_batches == math.inf else max(1, int(num_batches * interval))
    return interval
